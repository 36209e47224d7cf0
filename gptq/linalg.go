package gptq

// Dense linear algebra used by the solver and the Hessian, kept behind a few
// small functions so that faster kernels can replace them without touching
// the algorithm. Every function here is deterministic: the same inputs give
// the same bits on every run.

import (
	"math"

	"gonum.org/v1/gonum/blas"
	blasgonum "gonum.org/v1/gonum/blas/gonum"
	lapackgonum "gonum.org/v1/gonum/lapack/gonum"
)

// float is the element type of the solver: float32 mode or float64 mode.
type float interface{ ~float32 | ~float64 }

var (
	blasImpl   blasgonum.Implementation
	lapackImpl lapackgonum.Implementation
)

// syrkAccum adds aᵀa to the upper triangle of the n×n row-major matrix c,
// where a is m×n row-major.
func syrkAccum(c []float64, n int, a []float64, m int) {
	if m == 0 {
		return
	}
	blasImpl.Dsyrk(blas.Upper, blas.Trans, n, m, 1, a, n, 1, c, n)
}

// gemmSubTN computes c -= aᵀ·b, where a is k×m (row stride lda), b is k×n
// (row stride ldb) and c is m×n (row stride ldc), all row-major.
func gemmSubTN[T float](m, n, k int, a []T, lda int, b []T, ldb int, c []T, ldc int) {
	if m == 0 || n == 0 || k == 0 {
		return
	}
	switch a := any(a).(type) {
	case []float32:
		blasImpl.Sgemm(blas.Trans, blas.NoTrans, m, n, k, -1, a, lda, any(b).([]float32), ldb, 1, any(c).([]float32), ldc)
	case []float64:
		blasImpl.Dgemm(blas.Trans, blas.NoTrans, m, n, k, -1, a, lda, any(b).([]float64), ldb, 1, any(c).([]float64), ldc)
	}
}

// gemmNN computes c = a·b with a m×k, b k×n, c m×n, all row-major and
// contiguous, in float64.
func gemmNN(m, n, k int, a, b, c []float64) {
	blasImpl.Dgemm(blas.NoTrans, blas.NoTrans, m, n, k, 1, a, k, b, n, 0, c, n)
}

// axpySub computes y -= a·x elementwise, rounding each product to T before
// the subtraction (never fused), as the reference's outer-product update
// does.
func axpySub[T float](a T, x, y []T) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] -= T(a * v)
	}
}

// inverseFactor returns the upper triangular U with positive diagonal such
// that Uᵀ·U = H⁻¹ for the symmetric positive definite n×n row-major matrix
// h, reading only its lower triangle. ok is false when h is not numerically
// positive definite or U is not finite. h is not modified.
//
// The reference computes chol(H), the inverse from it, and the upper
// Cholesky factor of that inverse. The same U follows from one factorization
// of H in "upper-lower" form, H = R·Rᵀ with R upper triangular, because then
// H⁻¹ = R⁻ᵀ·R⁻¹ and U = R⁻¹. R is obtained from the ordinary Cholesky
// factor of H with rows and columns reversed, so the cost is one
// factorization and one triangular inverse instead of the reference's two
// factorizations and an inversion.
func inverseFactor(h []float64, n int) (u []float64, ok bool) {
	// r = J·H·J (reversed), lower triangle taken from H's lower triangle:
	// r[i][j] for i >= j is H[n-1-i][n-1-j] with n-1-i <= n-1-j, i.e. an
	// upper-triangle element of H; mirror H's lower triangle instead.
	r := make([]float64, n*n)
	for i := 0; i < n; i++ {
		ri := n - 1 - i
		for j := 0; j <= i; j++ {
			rj := n - 1 - j
			// element (ri, rj) with ri <= rj: take H[rj][ri] (lower triangle).
			r[i*n+j] = h[rj*n+ri]
		}
	}
	if !lapackImpl.Dpotrf(blas.Lower, n, r, n) {
		return nil, false
	}
	if !lapackImpl.Dtrtri(blas.Lower, blas.NonUnit, n, r, n) {
		return nil, false
	}
	// U = J·L⁻¹·J: U[a][b] = Linv[n-1-a][n-1-b], upper when a <= b.
	u = make([]float64, n*n)
	for a := 0; a < n; a++ {
		la := n - 1 - a
		for b := a; b < n; b++ {
			v := r[la*n+(n-1-b)]
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, false
			}
			u[a*n+b] = v
		}
		if !(u[a*n+a] > 0) {
			return nil, false
		}
	}
	return u, true
}
