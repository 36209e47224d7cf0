package gptq

import (
	"fmt"
	"math"

	"github.com/ttquant/ttquant/internal/kernels"
)

// maxActivation bounds the magnitude of accumulated activations: products
// are summed in float32 over up to 256 tokens, and 256·(1e15)² stays far
// below the float32 range, so H can never become infinite.
const maxActivation = 1e15

// Hessian accumulates the layer-input Gram matrix Σ x·xᵀ of one linear layer
// in float64, together with the number of tokens n (rows of X) seen. Products
// are formed in float32 over at most 256 tokens at a time and those partial
// sums are added in float64, so long token streams keep the contributions of
// late tokens. Matrix returns H = (2/n)·Σ x·xᵀ, the Hessian GPTQ expects.
//
// n counts tokens. The reference implementation counts sequences (batch
// entries) instead, which gives an H larger by the sequence length; a
// positive scale of H changes neither the damping (relative to the mean
// diagonal) nor the quantized weights, only the reported error.
//
// Partial Hessians built from disjoint batches can be combined with Merge;
// the result equals accumulating all batches into one Hessian up to
// floating-point summation order.
//
// A Hessian is not safe for concurrent use; accumulate per goroutine and
// Merge.
type Hessian struct {
	acc *kernels.GramAccumulator // lower triangle of Σ x·xᵀ, token count
}

// NewHessian returns an empty Hessian over cols input features. It panics
// if cols is not positive.
func NewHessian(cols int) *Hessian {
	if cols <= 0 || cols > 1<<20 {
		panic(fmt.Sprintf("gptq: NewHessian: invalid column count %d", cols))
	}
	return &Hessian{acc: kernels.NewGramAccumulator(cols)}
}

// Cols returns the number of input features.
func (h *Hessian) Cols() int { return h.acc.N() }

// Tokens returns the number of rows (tokens) accumulated so far.
func (h *Hessian) Tokens() int64 { return h.acc.Rows() }

// Add accumulates the rows×cols row-major activations x (one token per row).
// It returns an error, and leaves h unchanged, if the length does not match
// or x holds a NaN, an Inf or a magnitude above 1e15.
func (h *Hessian) Add(x []float32, rows int) error {
	cols := h.Cols()
	if rows < 0 || (rows > 0 && rows > math.MaxInt/cols) || len(x) != rows*cols {
		return fmt.Errorf("%w: Hessian input has %d values, want %d rows × %d columns", ErrShape, len(x), rows, cols)
	}
	if i := firstOutOfRange(x); i >= 0 {
		v := x[i]
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: Hessian input [%d,%d] of %d×%d is %v", ErrNotFinite, i/cols, i%cols, rows, cols, v)
		}
		return fmt.Errorf("%w: Hessian input [%d,%d] of %d×%d is %g, beyond ±%g, where float32 products could overflow", ErrNotFinite, i/cols, i%cols, rows, cols, v, maxActivation)
	}
	h.acc.Add(x, rows, cols)
	return nil
}

// Merge adds the sums and token count of o into h. Both must have the same
// number of columns.
func (h *Hessian) Merge(o *Hessian) error {
	if o == nil {
		return nil
	}
	if o.Cols() != h.Cols() {
		return fmt.Errorf("%w: cannot merge a Hessian over %d columns into one over %d", ErrShape, o.Cols(), h.Cols())
	}
	h.acc.Merge(o.acc)
	return nil
}

// Matrix returns H = (2/n)·Σ x·xᵀ as a full symmetric cols×cols row-major
// matrix. With no tokens it is all zeros (every column dead, which makes
// GPTQ reduce to round-to-nearest).
func (h *Hessian) Matrix() []float64 {
	n := h.Tokens()
	if n == 0 {
		return make([]float64, h.Cols()*h.Cols())
	}
	return h.acc.MatrixScaled(2 / float64(n))
}

// Finish returns H like Matrix, but builds it in the Hessian's own
// accumulation storage instead of a new cols×cols matrix (the same bits),
// and returns the row buffer to a pool. h must not be used afterwards,
// except for Tokens and Cols. Hand
// the matrix to RecycleMatrix once no Factor or Quantize call uses it any
// more: later NewHessian calls then reuse it, so a loop that builds one
// Hessian per expert allocates no matrices once warm.
func (h *Hessian) Finish() []float64 {
	n := h.Tokens()
	if n == 0 {
		return h.acc.TakeScaled(0) // the empty sum: all +0
	}
	return h.acc.TakeScaled(2 / float64(n))
}

// Release returns the Hessian's buffers to the pool without building H;
// h must not be used afterwards.
func (h *Hessian) Release() { h.acc.Release() }

// RecycleMatrix hands a matrix from Finish or Matrix back to the pool that
// NewHessian draws from. m must not be used afterwards (nor by a Factor
// built on it: a Factor keeps its Hessian).
func RecycleMatrix(m []float64) { kernels.RecycleMatrix(m) }

// maxActivationBits is the float32 bit pattern of maxActivation without
// its sign; NaNs and infinities have larger patterns.
var maxActivationBits = math.Float32bits(maxActivation)

// firstOutOfRange returns the index of the first value of x that is NaN,
// infinite or larger in magnitude than maxActivation, or -1 when there is
// none. It compares bit patterns, which order non-negative float32 values
// (and place NaN and Inf above every finite one).
func firstOutOfRange(x []float32) int {
	const chunk = 1024
	for base := 0; base < len(x); base += chunk {
		end := min(base+chunk, len(x))
		var worst uint32
		for _, v := range x[base:end] {
			worst = max(worst, math.Float32bits(v)&0x7fffffff)
		}
		if worst > maxActivationBits {
			for i := base; i < end; i++ {
				if math.Float32bits(x[i])&0x7fffffff > maxActivationBits {
					return i
				}
			}
		}
	}
	return -1
}
