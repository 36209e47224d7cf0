package forward

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ttquant/ttquant/internal/model/ffn"
	"github.com/ttquant/ttquant/internal/testmodel"
)

// checkingLinears is a Linears that checks every LinearWeight against the
// weight source (each row range read from the source must equal the rows
// of W it claims) and multiplies with a private copy of W in float32, the
// way the default path does.
type checkingLinears struct {
	t   *testing.T
	src WeightSource

	mu    sync.Mutex
	roles map[LinearRole]int
}

type copyLinear struct {
	w       []float32
	out, in int
}

func (c *copyLinear) MatMulT(dst []float32, ldd int, x []float32, rows int) error {
	if len(x) != rows*c.in {
		return fmt.Errorf("%d activations for %d rows of %d", len(x), rows, c.in)
	}
	ffn.MatMulT(dst, ldd, x, rows, c.in, c.w, c.out)
	return nil
}

func (c *checkingLinears) Linear(w *LinearWeight) (Linear, error) {
	c.mu.Lock()
	c.roles[w.Role]++
	c.mu.Unlock()
	if len(w.W) != w.Out*w.In || (w.Role == RoleLMHead) != (w.Layer < 0) || (w.Expert >= 0) != (w.Role >= RoleExpertGate && w.Role <= RoleExpertDown) {
		c.t.Errorf("%s: [%d, %d] with %d values", w.Name(), w.Out, w.In, len(w.W))
	}
	row := 0
	for _, rr := range w.Rows {
		v := make([]float32, rr.Rows*w.In)
		if err := c.src.Read(rr.Tensor, v, int64(rr.Row0)*int64(w.In)); err != nil {
			c.t.Errorf("%s: rows %d+%d of %s: %v", w.Name(), rr.Row0, rr.Rows, rr.Tensor, err)
		} else if !slices.Equal(v, w.W[row*w.In:(row+rr.Rows)*w.In]) {
			c.t.Errorf("%s: rows %d+%d of %s are not rows %d+%d of the matrix", w.Name(), rr.Row0, rr.Rows, rr.Tensor, row, rr.Rows)
		}
		row += rr.Rows
	}
	if row != w.Out {
		c.t.Errorf("%s: row ranges cover %d of %d rows", w.Name(), row, w.Out)
	}
	return &copyLinear{w: slices.Clone(w.W), out: w.Out, in: w.In}, nil
}

// countingKV rounds nothing; it counts the values it sees, or with zero
// set clears them.
type countingKV struct {
	mu   sync.Mutex
	n    int
	zero bool
}

func (k *countingKV) RoundKV(x []float32, headDim int) error {
	if len(x)%headDim != 0 {
		return fmt.Errorf("%d values, head dim %d", len(x), headDim)
	}
	k.mu.Lock()
	k.n += len(x)
	k.mu.Unlock()
	if k.zero {
		clear(x)
	}
	return nil
}

// TestLinearsStrategy: a Linears strategy sees every weight product of the
// forward pass (projections, experts, shared expert, LM head; the dense MLP
// in a dense model) with row ranges that name the source rows of each
// matrix, including Qwen3-Next's reordered fused projections; a strategy
// that multiplies as the default does gives bit-identical logits, and a
// KVStore sees every key and value of the full-attention layers.
func TestLinearsStrategy(t *testing.T) {
	mc := testmodel.Micro()
	per := writeModel(t, mc, testmodel.PerExpert)
	ids := testIDs(40, mc.Vocab, 11)
	for name, dir := range map[string]string{
		"fused":      writeModel(t, mc, testmodel.Default),
		"per-expert": per,
		"qwen3-next": toQwen3Next(t, per, mc),
	} {
		ref := logitsOf(t, openModel(t, dir), ids[:25], ids[25:])
		m := openModel(t, dir)
		cl := &checkingLinears{t: t, src: m.Src, roles: map[LinearRole]int{}}
		kv := &countingKV{}
		m.Linears, m.KV = cl, kv
		got := logitsOf(t, m, ids[:25], ids[25:])
		for s := range got {
			if i, ok := bitsEqual(got[s], ref[s]); !ok {
				t.Errorf("%s sequence %d: logit %d is %g with the strategy, %g without", name, s, i, got[s][i], ref[s][i])
			}
		}
		for _, r := range []LinearRole{RoleAttnIn, RoleAttnOut, RoleGDNIn, RoleGDNOut, RoleSharedGate, RoleSharedUp, RoleSharedDown,
			RoleExpertGate, RoleExpertUp, RoleExpertDown, RoleLMHead} {
			if cl.roles[r] == 0 {
				t.Errorf("%s: no %v product was asked for (%v)", name, r, cl.roles)
			}
		}
		full := 0
		for i := 0; i < mc.Layers; i++ {
			if mc.IsFull(i) {
				full++
			}
		}
		if want := 2 * full * len(ids) * mc.KVHeads * mc.HeadDim; kv.n != want {
			t.Errorf("%s: KVStore saw %d values, want %d", name, kv.n, want)
		}
		// A KVStore that clears keys and values changes the logits.
		m2 := openModel(t, dir)
		m2.KV = &countingKV{zero: true}
		if _, ok := bitsEqual(logitsOf(t, m2, ids[:25])[0], ref[0]); ok {
			t.Errorf("%s: clearing the keys and values changed nothing", name)
		}
	}

	// A dense model's MLP.
	dir := writeModel(t, mc, testmodel.SingleFile)
	cfg := editConfig(t, dir, func(tc map[string]any) {
		tc["model_type"] = "qwen3_5_text"
		tc["intermediate_size"] = 96
		for _, k := range []string{"num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"} {
			delete(tc, k)
		}
	})
	src := loadMap(t, dir)
	for i := 0; i < cfg.NumLayers(); i++ {
		denseLayer(src, cfg.LayerPrefix(i), mc.Hidden, 96, uint64(10*i))
	}
	dense := func() *Model {
		m, err := New(cfg, src)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	ref := logitsOf(t, dense(), ids)[0]
	m := dense()
	cl := &checkingLinears{t: t, src: src, roles: map[LinearRole]int{}}
	m.Linears = cl
	if i, ok := bitsEqual(logitsOf(t, m, ids)[0], ref); !ok {
		t.Errorf("dense: logit %d differs with the strategy", i)
	}
	for _, r := range []LinearRole{RoleMLPGate, RoleMLPUp, RoleMLPDown} {
		if cl.roles[r] == 0 {
			t.Errorf("dense: no %v product was asked for (%v)", r, cl.roles)
		}
	}
}

// failingLinears refuses one role.
type failingLinears struct{ role LinearRole }

func (f failingLinears) Linear(w *LinearWeight) (Linear, error) {
	if w.Role == f.role {
		return nil, fmt.Errorf("no product for %v", w.Role)
	}
	return nil, nil
}

// TestLinearsErrors: a strategy's error stops the pass and names the
// matrix.
func TestLinearsErrors(t *testing.T) {
	mc := testmodel.Micro()
	dir := writeModel(t, mc, testmodel.Default)
	for _, r := range []LinearRole{RoleGDNIn, RoleExpertDown, RoleLMHead} {
		m := openModel(t, dir)
		m.Linears = failingLinears{r}
		x, err := m.Embed(testIDs(9, mc.Vocab, 2))
		if err != nil {
			t.Fatal(err)
		}
		b := &Batch{Lens: []int{9}, X: x}
		err = m.Trunk(b, nil, nil)
		if err == nil {
			var hf []float32
			if hf, err = m.FinalNorm(b.X); err == nil {
				err = m.Logits(hf, func(int, int, []float32) error { return nil })
			}
		}
		if err == nil || !containsAll(err.Error(), r.String(), "no product") {
			t.Errorf("%v refused: error %v", r, err)
		}
	}
	if s := LinearRole(99).String(); s != "LinearRole(99)" {
		t.Errorf("invalid role prints as %q", s)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
