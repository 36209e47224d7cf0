package model

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpertPart is the Hugging Face per-expert tensor a part of a stored
// routed-expert matrix provides: Name (e.g. "…mlp.experts.3.up_proj.weight"),
// its Shape, and Offset, the element of the stored matrix where it begins.
type ExpertPart struct {
	Name   string
	Offset int64
	Shape  []int64
}

// ExpertParts maps a stored routed-expert matrix of a native checkpoint
// onto the per-expert tensors of the source's naming: "…experts.E.gate_up_proj"
// [2I, H] holds gate_proj (its first I rows) and up_proj, and
// "…experts.E.down_proj" [H, I] is down_proj. Any expert layout of the
// source (fused or per expert) reads its experts under these names.
func ExpertParts(stored string, expert int, shape []int64) ([]ExpertPart, error) {
	i := strings.LastIndex(stored, "experts.")
	if i < 0 || len(shape) != 2 {
		return nil, fmt.Errorf("expert tensor %s has an unexpected name or shape %v", stored, shape)
	}
	p := stored[:i] + "experts." + strconv.Itoa(expert) + "."
	switch {
	case strings.HasSuffix(stored, "down_proj"):
		return []ExpertPart{{Name: p + "down_proj.weight", Shape: shape}}, nil
	case strings.HasSuffix(stored, "gate_up_proj"):
		if shape[0]%2 != 0 {
			return nil, fmt.Errorf("expert tensor %s has an odd number of rows %v", stored, shape)
		}
		half := []int64{shape[0] / 2, shape[1]}
		return []ExpertPart{{Name: p + "gate_proj.weight", Shape: half}, {Name: p + "up_proj.weight", Offset: half[0] * half[1], Shape: half}}, nil
	}
	return nil, fmt.Errorf("expert tensor %s is neither gate_up_proj nor down_proj", stored)
}

// ExpertKind is the stored kind of a routed expert matrix of role r:
// "gate_up" (RoleExpertGateUp), "down" (RoleExpertDown), else "".
func ExpertKind(r Role) string {
	switch r {
	case RoleExpertGateUp:
		return "gate_up"
	case RoleExpertDown:
		return "down"
	}
	return ""
}

// ExpertMatrixName is the name a native checkpoint stores routed expert
// e's matrix of role r under, whatever the source layout: block (the
// layer's "….mlp." prefix) + "experts.E.gate_up_proj" ([2I, H], gate rows
// then up rows) or "experts.E.down_proj" ([H, I]); ExpertParts maps it
// back onto the source's per-expert names.
func ExpertMatrixName(block string, expert int, r Role) string {
	return block + "experts." + strconv.Itoa(expert) + "." + ExpertKind(r) + "_proj"
}

// FusedExpertName is the source name of a block's fused routed-expert
// tensor of role r (LayoutFused): block + "experts.gate_up_proj" or
// "experts.down_proj".
func FusedExpertName(block string, r Role) string {
	return block + "experts." + ExpertKind(r) + "_proj"
}
