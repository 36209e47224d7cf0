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
