package selection

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/internal/model"
)

// Role classes: where a matrix's output error goes. An input-side matrix's
// error passes through the block (attention, the recurrence, the SwiGLU)
// and its output projection before it reaches the residual stream; an
// output-side matrix's error is added to the stream as it is. The proxy
// loss does not see that difference, so Select weighs each class's loss
// (Weights), with factors measured as the KL of single-class changes
// (docs/selection.md).
const (
	ClassAttnIn  = "attn_in"  // q, k, v, Gated DeltaNet qkv, z, a, b
	ClassAttnOut = "attn_out" // o_proj, Gated DeltaNet out_proj
	ClassMLPIn   = "mlp_in"   // expert gate_up, shared and dense gate/up
	ClassMLPOut  = "mlp_out"  // expert, shared and dense down
	ClassOther   = "other"    // the LM head, the MTP projection, …
)

// Classes lists the role classes.
var Classes = []string{ClassAttnIn, ClassAttnOut, ClassMLPIn, ClassMLPOut, ClassOther}

// RoleClass returns the class of a role.
func RoleClass(r model.Role) string {
	switch r {
	case model.RoleAttnQ, model.RoleAttnK, model.RoleAttnV, model.RoleGDNInQKV, model.RoleGDNInZ, model.RoleGDNInA, model.RoleGDNInB, model.RoleGDNInQKVZ, model.RoleGDNInBA:
		return ClassAttnIn
	case model.RoleAttnO, model.RoleGDNOut:
		return ClassAttnOut
	case model.RoleExpertGateUp, model.RoleSharedGate, model.RoleSharedUp, model.RoleMLPGate, model.RoleMLPUp:
		return ClassMLPIn
	case model.RoleExpertDown, model.RoleSharedDown, model.RoleMLPDown:
		return ClassMLPOut
	}
	return ClassOther
}

// Weights multiply the losses of each role class, or of a class in one
// layer (key CLASS@LAYER, which wins over CLASS); 1 when absent.
type Weights map[string]float64

// Of returns the weight of a role in a layer.
func (w Weights) Of(r model.Role, layer int) float64 {
	c := RoleClass(r)
	if v, ok := w[c+"@"+strconv.Itoa(layer)]; ok {
		return v
	}
	if v, ok := w[c]; ok {
		return v
	}
	return 1
}

// String lists the weights as ParseWeights reads them, sorted.
func (w Weights) String() string {
	var parts []string
	for k, v := range w {
		parts = append(parts, k+"="+strconv.FormatFloat(v, 'g', -1, 64))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// ParseWeights reads CLASS=W or CLASS@LAYER=W, comma-separated ("" is no
// weights); an unknown class, a bad layer, a repeated key or a weight that
// is not a finite non-negative number is an error.
func ParseWeights(s string) (Weights, error) {
	w := Weights{}
	if strings.TrimSpace(s) == "" {
		return w, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		class, layer, perLayer := strings.Cut(k, "@")
		known := false
		for _, c := range Classes {
			known = known || c == class
		}
		if perLayer {
			l, err := strconv.Atoi(layer)
			known = known && err == nil && l >= 0 && strconv.Itoa(l) == layer
		}
		if !ok || !known {
			return nil, fmt.Errorf("selection: weight %q: want CLASS=W or CLASS@LAYER=W with CLASS one of %s", part, strings.Join(Classes, ", "))
		}
		if _, dup := w[k]; dup {
			return nil, fmt.Errorf("selection: weight of %s given twice", k)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("selection: weight %q: want a finite number ≥ 0", part)
		}
		w[k] = f
	}
	return w, nil
}
