package forward

import (
	"fmt"
	"slices"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/safetensors"
)

// WeightSource supplies the model's weights by Hugging Face tensor name as
// float32 values. A checkpoint (Checkpoint), values held in memory (Map)
// and a stack of both (Overlay: e.g. a quantized layer's decoded weights
// over the BF16 checkpoint) all run through the same forward code.
//
// Implementations must be safe for concurrent use and return the same
// values for the same name every time.
type WeightSource interface {
	// Shape returns the dimensions of tensor name; ok is false when the
	// source does not have it.
	Shape(name string) (shape []int64, ok bool)
	// Read fills dst with the elements start .. start+len(dst)-1 of tensor
	// name (row-major order).
	Read(name string, dst []float32, start int64) error
}

// Checkpoint is a WeightSource over a safetensors checkpoint (a file, a
// directory or a sharded index), decoding BF16, F16 and F32 exactly.
type Checkpoint struct {
	m *safetensors.Model
}

// NewCheckpoint wraps an open checkpoint.
func NewCheckpoint(m *safetensors.Model) *Checkpoint { return &Checkpoint{m: m} }

// Shape implements WeightSource.
func (c *Checkpoint) Shape(name string) ([]int64, bool) {
	_, ti, ok := c.m.Lookup(name)
	if !ok {
		return nil, false
	}
	return ti.Shape, true
}

// Read implements WeightSource.
func (c *Checkpoint) Read(name string, dst []float32, start int64) error {
	f, ti, ok := c.m.Lookup(name)
	if !ok {
		return &WeightError{Tensor: name, Problem: "missing from " + c.m.Path()}
	}
	switch ti.DType {
	case safetensors.BF16, safetensors.F16, safetensors.F32:
	default:
		return &WeightError{Tensor: name, Problem: fmt.Sprintf("dtype %v is not supported (BF16, F16 or F32; quantized releases must be dequantized first)", ti.DType)}
	}
	return f.ReadFloat32s(name, dst, start)
}

// Map is a WeightSource over tensors held in memory.
type Map map[string]Tensor

// Tensor is one tensor of a Map.
type Tensor struct {
	Shape  []int64
	Values []float32
}

// Shape implements WeightSource.
func (m Map) Shape(name string) ([]int64, bool) {
	t, ok := m[name]
	if !ok {
		return nil, false
	}
	return t.Shape, true
}

// Read implements WeightSource.
func (m Map) Read(name string, dst []float32, start int64) error {
	t, ok := m[name]
	if !ok {
		return &WeightError{Tensor: name, Problem: "missing"}
	}
	if start < 0 || start+int64(len(dst)) > int64(len(t.Values)) {
		return &WeightError{Tensor: name, Problem: fmt.Sprintf("read of %d values at %d outside its %d values", len(dst), start, len(t.Values))}
	}
	copy(dst, t.Values[start:])
	return nil
}

// Overlay is a WeightSource that looks every name up in its sources in
// order and uses the first that has it: Overlay{quantized, base} runs the
// model with the quantized tensors substituted.
type Overlay []WeightSource

// Shape implements WeightSource.
func (o Overlay) Shape(name string) ([]int64, bool) {
	for _, s := range o {
		if sh, ok := s.Shape(name); ok {
			return sh, true
		}
	}
	return nil, false
}

// Read implements WeightSource.
func (o Overlay) Read(name string, dst []float32, start int64) error {
	for _, s := range o {
		if _, ok := s.Shape(name); ok {
			return s.Read(name, dst, start)
		}
	}
	return &WeightError{Tensor: name, Problem: "missing"}
}

// WeightError names the tensor a problem was found in.
type WeightError struct {
	Tensor  string
	Problem string
}

func (e *WeightError) Error() string {
	return fmt.Sprintf("forward: tensor %s: %s", e.Tensor, e.Problem)
}

// CopyView serves WeightSource.Read for a tensor that is a view of a
// decoded stored tensor: its values are all[off : off+Π shape], and dst
// receives those from start on. A read outside the view (or a view outside
// all) is a WeightError naming the tensor.
func CopyView(name string, all []float32, off int64, shape []int64, dst []float32, start int64) error {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	if start < 0 || start+int64(len(dst)) > n || off < 0 || off+n > int64(len(all)) {
		return &WeightError{Tensor: name, Problem: fmt.Sprintf("read of %d values at %d outside its %d values", len(dst), start, n)}
	}
	copy(dst, all[off+start:])
	return nil
}

// checkShape returns an error unless src has tensor name with exactly the
// given shape.
func checkShape(src WeightSource, name string, shape ...int64) error {
	got, ok := src.Shape(name)
	if !ok {
		return &WeightError{Tensor: name, Problem: "missing"}
	}
	if !slices.Equal(got, shape) {
		return &WeightError{Tensor: name, Problem: fmt.Sprintf("shape %v, the config implies %v", got, shape)}
	}
	return nil
}

// readTensor reads the whole tensor name after checking its shape, and
// refuses non-finite values.
func readTensor(src WeightSource, name string, shape ...int64) ([]float32, error) {
	if err := checkShape(src, name, shape...); err != nil {
		return nil, err
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	if err := src.Read(name, v, 0); err != nil {
		return nil, err
	}
	if err := checkFinite(name, v, 0); err != nil {
		return nil, err
	}
	return v, nil
}

// checkFinite reports the first NaN or infinity of v (element off+i of
// tensor name).
func checkFinite(name string, v []float32, off int64) error {
	if i := kernels.FirstNonFinite32(v); i >= 0 {
		return &WeightError{Tensor: name, Problem: fmt.Sprintf("non-finite value %v at element %d", v[i], off+int64(i))}
	}
	return nil
}
