package build

import (
	"errors"
	"fmt"
	"math"
)

// ErrNonFinite is wrapped by the error a build returns when a source
// tensor holds NaN or Inf and BuildOptions.AllowNonFinite is not set.
var ErrNonFinite = errors.New("the source tensor holds a non-finite value")

// nonFiniteError names a tensor's first NaN or Inf: its index in the
// stored tensor's logical shape and its value.
func nonFiniteError(st *storedTensor, vals []float32) error {
	return nonFiniteErrorHint(st, vals, "Pass --allow-nonfinite (BuildOptions.AllowNonFinite) to store it anyway; the manifest then lists the tensor under ttquant.nonfinite_tensors")
}

// gptqNonFiniteHint explains why GPTQ refuses even when non-finite values
// are allowed.
const gptqNonFiniteHint = "GPTQ cannot quantize a matrix holding NaN or Inf, even with --allow-nonfinite; leave this layer out of --layers to round it to nearest instead"

func nonFiniteErrorHint(st *storedTensor, vals []float32, hint string) error {
	i := 0
	for i < len(vals) && !isNonFinite(vals[i]) {
		i++
	}
	if i == len(vals) {
		return nil
	}
	return fmt.Errorf("tensor %s: %w: element %v (flat index %d) is %v; a NaN or Inf in a weight is damage in the source, and rounding spreads it (a BFP block loses its other values). %s",
		st.name, ErrNonFinite, multiIndex(i, st.shape), i, vals[i], hint)
}

func isNonFinite(x float32) bool {
	return math.Float32bits(x)&0x7f800000 == 0x7f800000
}

// multiIndex turns a row-major flat index into an index in shape.
func multiIndex(flat int, shape []int64) []int64 {
	idx := make([]int64, len(shape))
	f := int64(flat)
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = f % shape[d]
			f /= shape[d]
		}
	}
	return idx
}

// checkSourceFinite refuses a tensor whose source values are not all
// finite, unless the build allows it.
func (b *builder) checkSourceFinite(st *storedTensor, vals []float32, finite bool) error {
	if finite || b.opt.AllowNonFinite {
		return nil
	}
	return nonFiniteError(st, vals)
}
