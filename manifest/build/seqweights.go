package build

import (
	"context"
	"fmt"
	"sync"

	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/manifest"
)

// seqWeights is the forward.Stored source of a sequential build: every
// stored tensor whose values are decided, decoded exactly as the
// checkpoint will hold them, under its Hugging Face name (routed experts
// under their per-expert names, as harness.Native offers a finished
// checkpoint). A tensor is decided when its bytes follow from the source
// alone (not builder.calibrated: neither GPTQ nor weighted rounding) or
// when they were set at its stage.
// Stacked over the source checkpoint (forward.Overlay{w, source}), the
// source supplies what is not decided yet.
type seqWeights struct {
	*forward.Stored
	b      *builder
	byName map[string]*storedTensor

	mu     sync.Mutex
	packed map[*storedTensor][]byte
}

func newSeqWeights(b *builder) (*seqWeights, error) {
	w := &seqWeights{b: b, byName: map[string]*storedTensor{}, packed: map[*storedTensor][]byte{}}
	ts := make([]forward.StoredTensor, 0, len(b.tensors))
	for _, st := range b.tensors {
		t := forward.StoredTensor{Key: st.name, Shape: st.shape}
		if st.isExpertMatrix() {
			e := st.expert
			t.Expert = &e
		} else {
			for _, p := range st.parts {
				t.Sources = append(t.Sources, p.tensor)
			}
		}
		w.byName[st.name] = st
		ts = append(ts, t)
	}
	var err error
	if w.Stored, err = forward.NewStored("the checkpoint being built", ts, w.values, w.decided); err != nil {
		return nil, err
	}
	return w, nil
}

// set records the stored bytes of a GPTQ tensor: from now on the forward
// pass sees its quantized values.
func (w *seqWeights) set(st *storedTensor, data []byte) {
	w.mu.Lock()
	w.packed[st] = data
	w.mu.Unlock()
	w.Changed(st.name)
}

// forget drops the bytes of a finished layer's tensors; the forward pass
// does not see that layer again.
func (w *seqWeights) forget(layer int) {
	w.mu.Lock()
	for st := range w.packed {
		if st.layer == layer {
			delete(w.packed, st)
		}
	}
	w.mu.Unlock()
	w.Changed("")
}

// decided says whether the stored tensor key's values are known: it is
// neither quantized with GPTQ nor rounded with weights from its inputs
// (its bytes follow from the source alone), or its bytes were set.
func (w *seqWeights) decided(key string) bool {
	st := w.byName[key]
	if !w.b.calibrated(st) {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.packed[st]
	return ok
}

// values decodes the stored tensor key as the checkpoint will hold it.
func (w *seqWeights) values(key string) ([]float32, error) {
	st := w.byName[key]
	w.mu.Lock()
	data, ok := w.packed[st]
	w.mu.Unlock()
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
