package harness

import (
	"fmt"
	"sync"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/manifest"
)

// Native is a forward.WeightSource over a native checkpoint's decoded
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
	c     *manifest.Checkpoint
	names map[string]nativeRef

	mu         sync.Mutex
	lastStored string
	last       []float32
}

type nativeRef struct {
	stored string
	off    int64 // first element within the stored tensor
	shape  []int64
}

// OpenNative opens the native checkpoint in dir (its manifest only; tensors
// are read and checked against their sha256 when first used).
func OpenNative(dir string) (*Native, error) {
	c, err := manifest.OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	s := &Native{c: c, names: map[string]nativeRef{}}
	for _, t := range c.Manifest().Tensors {
		if t.Expert == nil {
			if len(t.Sources) != 1 {
				return nil, fmt.Errorf("%s: tensor %s joins %d sources; only routed experts may", dir, t.Name, len(t.Sources))
			}
			if err := s.add(dir, t.Sources[0].Tensor, nativeRef{stored: t.Name, shape: t.Shape}); err != nil {
				return nil, err
			}
			continue
		}
		parts, err := model.ExpertParts(t.Name, *t.Expert, t.Shape)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		for _, p := range parts {
			if err := s.add(dir, p.Name, nativeRef{stored: t.Name, off: p.Offset, shape: p.Shape}); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Checkpoint returns the open checkpoint.
func (s *Native) Checkpoint() *manifest.Checkpoint { return s.c }

// Len returns the number of Hugging Face tensors the checkpoint supplies.
func (s *Native) Len() int { return len(s.names) }

// Shape implements forward.WeightSource.
func (s *Native) Shape(name string) ([]int64, bool) {
	r, ok := s.names[name]
	return r.shape, ok
}

// Read implements forward.WeightSource. The last decoded stored tensor is
// kept, so gate and up of one expert decode it once.
func (s *Native) Read(name string, dst []float32, start int64) error {
	r, ok := s.names[name]
	if !ok {
		return &forward.WeightError{Tensor: name, Problem: "not in the native checkpoint " + s.c.Dir()}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastStored != r.stored {
		v, err := s.c.Float32s(r.stored)
		if err != nil {
			return err
		}
		s.lastStored, s.last = r.stored, v
	}
	return forward.CopyView(name, s.last, r.off, r.shape, dst, start)
}

// add records that the source tensor name is served by ref, refusing a
// checkpoint in which two stored tensors claim the same source tensor: which
// one would win would depend on the manifest's order.
func (s *Native) add(dir, name string, ref nativeRef) error {
	if prev, dup := s.names[name]; dup {
		return fmt.Errorf("%s: stored tensors %s and %s both provide %s", dir, prev.stored, ref.stored, name)
	}
	s.names[name] = ref
	return nil
}
