package gptq

import (
	"fmt"

	"github.com/ttquant/ttquant/internal/kernels"
)

// NoFeedback reports that no damping level gave a usable factorization:
// the factor then holds diag(H′)^(−1/2) and GPTQ quantizes without error
// feedback (Result.NoFeedback).
func (f *Factor) NoFeedback() bool { return f.noFeedback }

// MulInverse replaces m, a rows×Cols() row-major matrix over the Hessian's
// columns in their original order, by m·H′⁻¹, where H′ is the matrix the
// factor inverted: the Hessian with every dead column's diagonal set to 1
// and the damping Result.Damp added to the diagonal. With the factor's
// U (Uᵀ·U = H′⁻¹ in working order) this is two products, m·Uᵀ·U, in
// float64 whatever the solver's precision. A factor that found no usable
// factorization (Result.NoFeedback) holds diag(H′)^(−1/2), and m is then
// scaled by diag(H′)⁻¹.
//
// Asymmetric calibration uses it to move a weight matrix to the least-
// squares fit of another layer's outputs before quantizing it with the
// same factor (see calib.AsymmetricTarget).
func (f *Factor) MulInverse(m []float64, rows int) error {
	n := f.cols
	if rows < 0 || len(m) != rows*n {
		return fmt.Errorf("%w: MulInverse of %d values as %d rows × %d columns", ErrShape, len(m), rows, n)
	}
	if f.u32 == nil && f.u64 == nil {
		return fmt.Errorf("%w: MulInverse on a released factor", ErrOptions)
	}
	if rows == 0 {
		return nil
	}
	// U's upper triangle in float64 (the rest of the pooled buffer is not
	// defined).
	u := make([]float64, n*n)
	for a := 0; a < n; a++ {
		if f.u64 != nil {
			copy(u[a*n+a:(a+1)*n], f.u64[a*n+a:(a+1)*n])
		} else {
			for b := a; b < n; b++ {
				u[a*n+b] = float64(f.u32[a*n+b])
			}
		}
	}
	// Rows in working order, times Uᵀ, times U, back in original order.
	p := make([]float64, rows*n)
	for r := 0; r < rows; r++ {
		for k, c := range f.perm {
			p[r*n+k] = m[r*n+c]
		}
	}
	t := make([]float64, rows*n)
	kernels.Dgemm(false, true, rows, n, n, 1, p, n, u, n, 0, t, n)
	kernels.Dgemm(false, false, rows, n, n, 1, t, n, u, n, 0, p, n)
	for r := 0; r < rows; r++ {
		for k, c := range f.perm {
			m[r*n+c] = p[r*n+k]
		}
	}
	return nil
}
