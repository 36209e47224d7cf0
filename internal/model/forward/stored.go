package forward

import (
	"fmt"
	"sync"

	"github.com/ttquant/ttquant/internal/model"
)

// StoredTensor describes one tensor of a checkpoint for Stored: Key names
// it to the decoder (the stored name), Shape is its logical shape. A routed
// expert matrix (Expert set: "…experts.E.gate_up_proj" or
// "…experts.E.down_proj") is offered under the per-expert names of the
// source (model.ExpertParts); any other tensor under the one source tensor
// it was made from, Sources[0].
type StoredTensor struct {
	Key     string
	Shape   []int64
	Expert  *int
	Sources []string
}

// Stored is the WeightSource over a checkpoint's stored tensors, decoded
// exactly as stored, under their Hugging Face names: the one the
// evaluation harness runs a finished checkpoint with, and a sequential
// build the checkpoint it is writing. Stack it over the source model
// (Overlay{stored, source}) so that what it does not offer comes from the
// source.
//
// The decoded values of the last stored tensor read are kept, so that the
// gate and up rows of one stored expert matrix are decoded once.
type Stored struct {
	origin string // for errors: "the native checkpoint DIR"
	names  map[string]storedRef
	decode func(key string) ([]float32, error)
	ready  func(key string) bool

	mu      sync.Mutex
	lastKey string
	last    []float32
}

type storedRef struct {
	key   string
	off   int64 // first element within the stored tensor
	shape []int64
}

// NewStored maps the tensors ts onto the source names they replace.
// decode returns a stored tensor's values (it is called with no other call
// of it running); ready, when not nil, says whether a stored tensor's
// values are decided yet (a tensor that is not is not offered). origin
// names the checkpoint in errors. Two stored tensors providing the same
// source tensor are refused: which one would win would depend on the
// order.
func NewStored(origin string, ts []StoredTensor, decode func(key string) ([]float32, error), ready func(key string) bool) (*Stored, error) {
	s := &Stored{origin: origin, names: map[string]storedRef{}, decode: decode, ready: ready}
	add := func(name string, r storedRef) error {
		if prev, dup := s.names[name]; dup {
			return fmt.Errorf("%s: stored tensors %s and %s both provide %s", origin, prev.key, r.key, name)
		}
		s.names[name] = r
		return nil
	}
	for _, t := range ts {
		if t.Expert == nil {
			if len(t.Sources) != 1 {
				return nil, fmt.Errorf("%s: tensor %s joins %d sources; only routed experts may", origin, t.Key, len(t.Sources))
			}
			if err := add(t.Sources[0], storedRef{key: t.Key, shape: t.Shape}); err != nil {
				return nil, err
			}
			continue
		}
		parts, err := model.ExpertParts(t.Key, *t.Expert, t.Shape)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", origin, err)
		}
		for _, p := range parts {
			if err := add(p.Name, storedRef{key: t.Key, off: p.Offset, shape: p.Shape}); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Len returns the number of source tensors the checkpoint supplies.
func (s *Stored) Len() int { return len(s.names) }

// Shape implements WeightSource.
func (s *Stored) Shape(name string) ([]int64, bool) {
	r, ok := s.names[name]
	if !ok || (s.ready != nil && !s.ready(r.key)) {
		return nil, false
	}
	return r.shape, true
}

// Read implements WeightSource.
func (s *Stored) Read(name string, dst []float32, start int64) error {
	r, ok := s.names[name]
	if !ok {
		return &WeightError{Tensor: name, Problem: "not in " + s.origin}
	}
	if s.ready != nil && !s.ready(r.key) {
		return &WeightError{Tensor: name, Problem: "read before its values in " + s.origin + " were decided"}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastKey != r.key {
		v, err := s.decode(r.key)
		if err != nil {
			return err
		}
		s.lastKey, s.last = r.key, v
	}
	return CopyView(name, s.last, r.off, r.shape, dst, start)
}

// Changed drops the kept values of the stored tensor key (every one when
// key is empty): its values have changed, or will not be read again.
func (s *Stored) Changed(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if key == "" || s.lastKey == key {
		s.lastKey, s.last = "", nil
	}
}

// Locate says where the source tensor name lies in the checkpoint: the
// stored tensor's key, the element of it where name begins, and name's
// shape; false when the checkpoint does not store it.
func (s *Stored) Locate(name string) (key string, off int64, shape []int64, ok bool) {
	r, ok := s.names[name]
	return r.key, r.off, r.shape, ok
}
