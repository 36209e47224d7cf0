package kernels

import (
	"fmt"
	"math"
)

// cholBlock is the column block of the blocked factorizations: diagonal
// blocks of this size are handled by scalar code, everything else by the
// packed GEMM. Like blockK it fixes the order of operations, so it is a
// constant.
const cholBlock = 96

// NotPositiveDefiniteError reports a Cholesky factorization that met a
// pivot that is not positive (or NaN).
type NotPositiveDefiniteError struct {
	// Order is the order of the first principal minor found not positive
	// definite: the leading minor (rows and columns 0..Order-1), or the
	// trailing one (the last Order rows and columns) when Trailing is set.
	Order    int
	Trailing bool
	// Pivot is the value whose square root was needed.
	Pivot float64
}

func (e *NotPositiveDefiniteError) Error() string {
	which := "leading"
	if e.Trailing {
		which = "trailing"
	}
	return fmt.Sprintf("kernels: matrix is not positive definite: %s minor of order %d has pivot %g", which, e.Order, e.Pivot)
}

// SingularError reports a triangular matrix with a zero (or non-finite)
// diagonal entry.
type SingularError struct {
	Index int     // row and column of the offending diagonal entry
	Value float64 // its value
}

func (e *SingularError) Error() string {
	return fmt.Sprintf("kernels: triangular matrix is singular: diagonal entry %d is %g", e.Index, e.Value)
}

// dot returns Σ x[i]·y[i] with every product rounded (no fusion, so every
// architecture gives the same bits), summed with four interleaved partial
// sums combined as (s0+s1)+(s2+s3).
func dot(x, y []float64) float64 {
	y = y[:len(x)]
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += float64(x[i] * y[i])
		s1 += float64(x[i+1] * y[i+1])
		s2 += float64(x[i+2] * y[i+2])
		s3 += float64(x[i+3] * y[i+3])
	}
	for ; i < len(x); i++ {
		s0 += float64(x[i] * y[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// potrfUnblocked factors the n×n block at a in place (lower triangle,
// row-oriented Cholesky–Crout). off is the block's position in the whole
// matrix, for error reports.
func potrfUnblocked(n int, a []float64, lda, off int) error {
	for j := 0; j < n; j++ {
		rj := a[j*lda : j*lda+j]
		d := a[j*lda+j] - dot(rj, rj)
		if !(d > 0) || math.IsInf(d, 0) {
			return &NotPositiveDefiniteError{Order: off + j + 1, Pivot: d}
		}
		l := math.Sqrt(d)
		a[j*lda+j] = l
		for i := j + 1; i < n; i++ {
			ri := a[i*lda : i*lda+j+1]
			ri[j] = (ri[j] - dot(ri[:j], rj)) / l
		}
	}
	return nil
}

// trtriUnblocked inverts the n×n lower-triangular block at a in place.
func trtriUnblocked(n int, a []float64, lda, off int) error {
	for j := n - 1; j >= 0; j-- {
		d := a[j*lda+j]
		if d == 0 || math.IsNaN(d) || math.IsInf(d, 0) {
			return &SingularError{Index: off + j, Value: d}
		}
		ajj := 1 / d
		a[j*lda+j] = ajj
		// Column j below the diagonal: x ← −ajj · Linv[j+1:, j+1:] · x,
		// bottom-up so that the x[k], k < i, read are still the old ones.
		for i := n - 1; i > j; i-- {
			ri := a[i*lda : i*lda+i+1]
			var s float64
			for k := j + 1; k <= i; k++ {
				s += float64(ri[k] * a[k*lda+j])
			}
			ri[j] = -ajj * s
		}
	}
	return nil
}

// Dpotrf computes the Cholesky factorization A = L·Lᵀ of the n×n
// symmetric positive definite matrix A in place: only the lower triangle
// (diagonal included) is read and it is overwritten by L; the strict upper
// triangle is not touched. It returns a *NotPositiveDefiniteError when a
// pivot is not positive, leaving A partly overwritten.
//
// The factorization is blocked by 96 columns: diagonal blocks are factored
// and inverted by scalar code, the panel below is multiplied by the
// inverse of the diagonal block, and the trailing matrix is updated with
// the packed lower-triangle GEMM, which carries almost all the work.
func Dpotrf(n int, a []float64, lda int) error {
	checkMatrix("Dpotrf", "A", n, n, lda, len(a))
	return potrf(n, a, lda)
}

func potrf(n int, a []float64, lda int) error {
	nb := cholBlock
	if n <= nb {
		return potrfUnblocked(n, a, lda, 0)
	}
	tBuf := getBuf[float64](nb * nb)
	defer putBuf(tBuf)
	pBuf := getBuf[float64](n * nb)
	defer putBuf(pBuf)
	t, p := *tBuf, *pBuf
	for j := 0; j < n; j += nb {
		jb := min(nb, n-j)
		if err := potrfUnblocked(jb, a[j*lda+j:], lda, j); err != nil {
			return err
		}
		rest := n - j - jb
		if rest == 0 {
			break
		}
		// T = L11⁻¹.
		for r := 0; r < jb; r++ {
			copy(t[r*jb:r*jb+r+1], a[(j+r)*lda+j:(j+r)*lda+j+r+1])
		}
		if err := trtriUnblocked(jb, t, jb, j); err != nil {
			return &NotPositiveDefiniteError{Order: j + jb, Pivot: 0}
		}
		// L21 = A21·L11⁻ᵀ = A21·Tᵀ.
		a21 := a[(j+jb)*lda+j:]
		clear(p[:rest*jb])
		dgemmMasked(false, true, rest, jb, jb, 1, a21, lda, maskNone, t, jb, maskUpper, p, jb, false)
		for r := 0; r < rest; r++ {
			copy(a21[r*lda:r*lda+jb], p[r*jb:r*jb+jb])
		}
		// A22 −= L21·L21ᵀ, lower triangle only.
		dgemmMasked(false, true, rest, rest, jb, -1, a21, lda, maskNone, a21, lda, maskNone, a[(j+jb)*lda+j+jb:], lda, true)
	}
	return nil
}

// Dtrtri inverts the n×n lower-triangular matrix L in place (the strict
// upper triangle is neither read nor written). It returns a
// *SingularError when a diagonal entry is zero or not finite.
//
// Blocked by 96 columns from the last block to the first: the block
// column below the diagonal becomes −L22⁻¹·L21·L11⁻¹, two packed GEMMs
// (the first skips the zero upper triangle of L22⁻¹ block-wise).
func Dtrtri(n int, a []float64, lda int) error {
	checkMatrix("Dtrtri", "L", n, n, lda, len(a))
	return trtri(n, a, lda)
}

func trtri(n int, a []float64, lda int) error {
	nb := cholBlock
	if n <= nb {
		return trtriUnblocked(n, a, lda, 0)
	}
	tBuf := getBuf[float64](n * nb)
	defer putBuf(tBuf)
	t := *tBuf
	for j := ((n - 1) / nb) * nb; j >= 0; j -= nb {
		jb := min(nb, n-j)
		rest := n - j - jb
		if rest > 0 {
			// t = L22⁻¹·L21 (L22⁻¹ is already in place).
			clear(t[:rest*jb])
			dgemmMasked(false, false, rest, jb, rest, 1, a[(j+jb)*lda+j+jb:], lda, maskLower,
				a[(j+jb)*lda+j:], lda, maskNone, t, jb, false)
		}
		if err := trtriUnblocked(jb, a[j*lda+j:], lda, j); err != nil {
			return err
		}
		if rest > 0 {
			// L21 ← −t·L11⁻¹.
			a21 := a[(j+jb)*lda+j:]
			for r := 0; r < rest; r++ {
				clear(a21[r*lda : r*lda+jb])
			}
			dgemmMasked(false, false, rest, jb, jb, -1, t, jb, maskNone, a[j*lda+j:], lda, maskLower, a21, lda, false)
		}
	}
	return nil
}

// Dpotri computes the lower triangle of A⁻¹ = L⁻ᵀ·L⁻¹ in place from the
// Cholesky factor L that Dpotrf left in the lower triangle (the strict
// upper triangle is neither read nor written). It returns a
// *SingularError if L has a zero diagonal entry.
func Dpotri(n int, a []float64, lda int) error {
	checkMatrix("Dpotri", "L", n, n, lda, len(a))
	if err := trtri(n, a, lda); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	// A⁻¹[i][j] = Σ_{p ≥ i} Linv[p][i]·Linv[p][j] for i ≥ j; the product
	// needs a copy of L⁻¹ because it overwrites its own input.
	bBuf := getBuf[float64](n * n)
	defer putBuf(bBuf)
	li := *bBuf
	for r := 0; r < n; r++ {
		copy(li[r*n:r*n+r+1], a[r*lda:r*lda+r+1])
		clear(a[r*lda : r*lda+r+1])
	}
	dgemmMasked(true, false, n, n, n, 1, li, n, maskUpper, li, n, maskLower, a, lda, true)
	return nil
}

// CholInvUpper computes the upper-triangular U with UᵀU = H⁻¹ for the
// n×n symmetric positive definite H (only the lower triangle of H is
// read), which is what GPTQ uses as its inverse-Hessian factor (torch's
// cholesky(cholesky_inverse(cholesky(H)), upper=True)). U is written to
// the upper triangle of u (leading dimension ldu) and the strict lower
// triangle of u is set to zero. h and u must not overlap.
//
// Rather than factor, invert and factor again, it uses one factorization
// and one triangular inverse: with P the order-reversing permutation,
// H = U⁻¹U⁻ᵀ gives P·H·P = (P·U⁻¹·P)(P·U⁻¹·P)ᵀ with P·U⁻¹·P lower
// triangular, so P·U⁻¹·P is the Cholesky factor of P·H·P and
// U = P·(chol(P·H·P))⁻¹·P. This is about half the work of the three-step
// form and avoids forming H⁻¹ explicitly. A failure is reported as a
// *NotPositiveDefiniteError on a trailing minor of H.
func CholInvUpper(n int, h []float64, ldh int, u []float64, ldu int) error {
	checkMatrix("CholInvUpper", "H", n, n, ldh, len(h))
	checkMatrix("CholInvUpper", "U", n, n, ldu, len(u))
	// u (lower) = P·H·P: R[i][j] = H[n-1-i][n-1-j] = H[n-1-j][n-1-i].
	// Tiled so that both the reads (down columns of H) and the writes stay
	// in cache.
	const bs = 64
	for ib := 0; ib < n; ib += bs {
		for jb := 0; jb <= ib; jb += bs {
			for j := jb; j < min(jb+bs, n); j++ {
				src := h[(n-1-j)*ldh:]
				for i := max(ib, j); i < min(ib+bs, n); i++ {
					u[i*ldu+j] = src[n-1-i]
				}
			}
		}
	}
	if err := potrf(n, u, ldu); err != nil {
		if e, ok := err.(*NotPositiveDefiniteError); ok {
			e.Trailing = true
		}
		return err
	}
	if err := trtri(n, u, ldu); err != nil {
		return err
	}
	// Rotate by 180°: U[i][j] = M[n-1-i][n-1-j]; the lower triangle of M
	// lands in the upper triangle of U. Then clear the strict lower part.
	for i := 0; i < n; i++ {
		ri := n - 1 - i
		if ri < i {
			break
		}
		for j := 0; j < n; j++ {
			if ri == i && n-1-j <= j {
				break
			}
			x, y := i*ldu+j, ri*ldu+n-1-j
			u[x], u[y] = u[y], u[x]
		}
	}
	for i := 1; i < n; i++ {
		clear(u[i*ldu : i*ldu+i])
	}
	return nil
}
