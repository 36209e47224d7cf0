package harness

import (
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/manifest"
)

// Native is the forward.Stored source over a native checkpoint's decoded
// (dequantized) tensors, under their Hugging Face names: a stored routed
// expert "…experts.E.gate_up_proj" [2I, H] is offered as
// "…experts.E.gate_proj.weight" and "…experts.E.up_proj.weight" (the gate
// rows first), "…experts.E.down_proj" as "…experts.E.down_proj.weight";
// every other tensor under the name of the source tensor it was made from.
// BFP tensors are decoded exactly (manifest.Checkpoint.Float32s), so the
// forward pass runs the stored values bit for bit with float32
// activations.
//
// Stack it over the source model (forward.Overlay{native, source}) so that
// anything the checkpoint does not store comes from the source.
type Native struct {
	*forward.Stored
	c *manifest.Checkpoint
}

// OpenNative opens the native checkpoint in dir (its manifest only; tensors
// are read and checked against their sha256 when first used).
func OpenNative(dir string) (*Native, error) { return OpenNativeOnly(dir, nil) }

// OpenNativeOnly is OpenNative offering only the stored tensors whose
// names keep accepts (every one when keep is nil): the others come from
// whatever the source is stacked over.
func OpenNativeOnly(dir string, keep func(name string) bool) (*Native, error) {
	c, err := manifest.OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	ts := make([]forward.StoredTensor, len(c.Manifest().Tensors))
	for i, t := range c.Manifest().Tensors {
		ts[i] = forward.StoredTensor{Key: t.Name, Shape: t.Shape, Expert: t.Expert}
		for _, src := range t.Sources {
			ts[i].Sources = append(ts[i].Sources, src.Tensor)
		}
	}
	st, err := forward.NewStored("the native checkpoint "+dir, ts, c.Float32s, keep)
	if err != nil {
		return nil, err
	}
	return &Native{Stored: st, c: c}, nil
}

// Checkpoint returns the open checkpoint.
func (s *Native) Checkpoint() *manifest.Checkpoint { return s.c }
