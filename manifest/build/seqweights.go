package build

import (
	"context"
	"fmt"
	"sync"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/manifest"
)

// seqWeights is the forward.WeightSource of a sequential build: every
// stored tensor whose values are decided, decoded exactly as the
// checkpoint will hold them, under its Hugging Face name (routed experts
// under their per-expert names, as harness.Native offers a finished
// checkpoint). A tensor is decided when its bytes follow from the source
// alone (not builder.calibrated: neither GPTQ nor weighted rounding) or
// when they were set at its stage.
// Stacked over the source checkpoint (forward.Overlay{w, source}), the
// source supplies what is not decided yet.
type seqWeights struct {
	b     *builder
	names map[string]seqRef

	mu     sync.Mutex
	packed map[*storedTensor][]byte
	lastSt *storedTensor
	last   []float32
}

type seqRef struct {
	st    *storedTensor
	off   int64 // first element within the stored tensor
	shape []int64
}

func newSeqWeights(b *builder) (*seqWeights, error) {
	w := &seqWeights{b: b, names: map[string]seqRef{}, packed: map[*storedTensor][]byte{}}
	add := func(name string, r seqRef) error {
		if prev, dup := w.names[name]; dup {
			return fmt.Errorf("stored tensors %s and %s both provide %s", prev.st.name, r.st.name, name)
		}
		w.names[name] = r
		return nil
	}
	for _, st := range b.tensors {
		if !st.isExpertMatrix() {
			if len(st.parts) != 1 {
				return nil, fmt.Errorf("stored tensor %s joins %d source tensors; only routed experts may", st.name, len(st.parts))
			}
			if err := add(st.parts[0].tensor, seqRef{st: st, shape: st.shape}); err != nil {
				return nil, err
			}
			continue
		}
		parts, err := model.ExpertParts(st.name, st.expert, st.shape)
		if err != nil {
			return nil, err
		}
		for _, p := range parts {
			if err := add(p.Name, seqRef{st: st, off: p.Offset, shape: p.Shape}); err != nil {
				return nil, err
			}
		}
	}
	return w, nil
}

// set records the stored bytes of a GPTQ tensor: from now on the forward
// pass sees its quantized values.
func (w *seqWeights) set(st *storedTensor, data []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.packed[st] = data
	if w.lastSt == st {
		w.lastSt, w.last = nil, nil
	}
}

// forget drops the bytes of a finished layer's tensors; the forward pass
// does not see that layer again.
func (w *seqWeights) forget(layer int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for st := range w.packed {
		if st.layer == layer {
			delete(w.packed, st)
		}
	}
	w.lastSt, w.last = nil, nil
}

func (w *seqWeights) decided(st *storedTensor) bool {
	if !w.b.calibrated(st) {
		return true
	}
	_, ok := w.packed[st]
	return ok
}

// Shape implements forward.WeightSource.
func (w *seqWeights) Shape(name string) ([]int64, bool) {
	r, ok := w.names[name]
	if !ok {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.decided(r.st) {
		return nil, false
	}
	return r.shape, true
}

// Read implements forward.WeightSource.
func (w *seqWeights) Read(name string, dst []float32, start int64) error {
	r, ok := w.names[name]
	if !ok {
		return &forward.WeightError{Tensor: name, Problem: "not a stored tensor"}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.decided(r.st) {
		return &forward.WeightError{Tensor: name, Problem: "read before its GPTQ values were decided"}
	}
	if w.lastSt != r.st {
		v, err := w.values(r.st)
		if err != nil {
			return err
		}
		w.lastSt, w.last = r.st, v
	}
	return forward.CopyView(name, w.last, r.off, r.shape, dst, start)
}

// values decodes st as stored. Called with w.mu held.
func (w *seqWeights) values(st *storedTensor) ([]float32, error) {
	data, ok := w.packed[st]
	if !ok {
		var err error
		data, _, _, err = w.b.produce(context.Background(), st)
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", st.name, err)
		}
	}
	return decodeStored(st, data)
}

// decodeStored returns the values a stored tensor's bytes hold.
func decodeStored(st *storedTensor, data []byte) ([]float32, error) {
	if st.isBFP {
		return manifest.UnpackBFP(st.bfpF, st.tile, data, st.shape, st.orient)
	}
	return manifest.DecodeFloats(st.outDType, data)
}
