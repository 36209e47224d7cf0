package gptq

// Dense linear algebra used by the solver and the Hessian, kept behind a few
// small functions so that the algorithm does not depend on the kernels
// behind them. The products, the Hessian accumulation and the inverse
// factor run on internal/kernels, whose results are bit-identical across
// builds and independent of the number of goroutines, so everything here is
// deterministic.

import (
	"math"
	"runtime"
	"slices"

	"github.com/ttquant/ttquant/internal/kernels"
)

// float is the element type of the solver: float32 mode or float64 mode.
type float interface{ ~float32 | ~float64 }

// gemmSubTN computes c -= aᵀ·b, where a is k×m (row stride lda), b is k×n
// (row stride ldb) and c is m×n (row stride ldc), all row-major.
func gemmSubTN[T float](m, n, k int, a []T, lda int, b []T, ldb int, c []T, ldc int) {
	if m == 0 || n == 0 || k == 0 {
		return
	}
	switch a := any(a).(type) {
	case []float32:
		kernels.Sgemm(true, false, m, n, k, -1, a, lda, any(b).([]float32), ldb, 1, any(c).([]float32), ldc)
	case []float64:
		kernels.Dgemm(true, false, m, n, k, -1, a, lda, any(b).([]float64), ldb, 1, any(c).([]float64), ldc)
	}
}

// gemmSubTNSide is gemmSubTN running side on the calling goroutine while
// the other workers start on the product (kernels.SgemmAcc); side runs
// even when the product is empty. The bits of c are gemmSubTN's.
func gemmSubTNSide[T float](m, n, k int, a []T, lda int, b []T, ldb int, c []T, ldc int, side func()) {
	if m == 0 || n == 0 || k == 0 {
		side()
		return
	}
	switch a := any(a).(type) {
	case []float32:
		kernels.SgemmAcc(true, false, m, n, k, -1, a, lda, any(b).([]float32), ldb, any(c).([]float32), ldc, side)
	case []float64:
		kernels.DgemmAcc(true, false, m, n, k, -1, a, lda, any(b).([]float64), ldb, any(c).([]float64), ldc, side)
	}
}

// rank1Sub computes c[j][r] -= u[j]·e[r] for the m×n row-major c (row
// stride ldc), rounding every product to T before the subtraction, like
// axpySub on each row. In float32 it is axpySub32 on every row, in one
// kernels call (assembly where available, bit-identical to the Go loop). In float64 it is a
// product with a single inner index: one rounded multiplication in the
// kernels' fused chain (fma(u, e, +0)) added to C with one addition, which
// equals the scalar loop bit for bit (up to the sign of a zero result).
func rank1Sub[T float](m, n int, u, e, c []T, ldc int) {
	if u32, ok := any(u).([]float32); ok {
		// One vector pass per row of c, all rows in one call: cheaper
		// than a product call for the short rank-1 updates of the
		// in-block loop, and than a call per row (rows of a chunk are
		// a few hundred values).
		kernels.AxpySubRows32(u32[:m], any(e).([]float32)[:n], any(c).([]float32), ldc)
		return
	}
	gemmSubTN(m, n, 1, u, m, e, n, c, ldc)
}

// axpySub32 computes y -= a·x elementwise with every product rounded to
// float32 before the subtraction, exactly like axpySub: adding the rounded
// product of −a is the same operation bit for bit, and the kernels' vector
// loop gives the same bits as a scalar one.
func axpySub32(a float32, x, y []float32) { kernels.Axpy32(-a, x, y) }

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
// h, reading only its lower triangle, in T's arithmetic (float32 through
// kernels.CholInvUpper32, the reference's precision). ok is false when h
// is not numerically positive definite or U is not finite. h is not
// modified.
//
// The reference computes chol(H), the inverse from it, and the upper
// Cholesky factor of that inverse. The same U follows from one
// factorization of H in "upper-lower" form, H = R·Rᵀ with R upper
// triangular, because then H⁻¹ = R⁻ᵀ·R⁻¹ and U = R⁻¹; R is the ordinary
// Cholesky factor of H with rows and columns reversed (kernels.CholInvUpper).
func inverseFactor[T float](h []T, n int) (u []T, ok bool) {
	u = make([]T, n*n)
	var err error
	switch h := any(h).(type) {
	case []float64:
		err = kernels.CholInvUpper(n, h, n, any(u).([]float64), n)
	case []float32:
		err = kernels.CholInvUpper32(n, h, n, any(u).([]float32), n)
	}
	if err != nil {
		return nil, false
	}
	for a := 0; a < n; a++ {
		for _, v := range u[a*n+a : (a+1)*n] {
			// One comparison catches NaN and ±Inf (float32 ones too,
			// converted exactly).
			if a := math.Abs(float64(v)); !(a <= math.MaxFloat64) {
				return nil, false
			}
		}
		if !(u[a*n+a] > 0) {
			return nil, false
		}
	}
	return u, true
}

// inverseFactorRev is inverseFactor for the Hessian given in reverse order
// (r[i][j] = H[n-1-i][n-1-j], lower triangle; see
// kernels.CholInvUpperRev), which it overwrites. The result is bit for bit
// inverseFactor's. U comes from the buffer pool and the
// finiteness check runs on all cores.
func inverseFactorRev[T float](r []T, n int) (u []T, ok bool) {
	u = getBuf[T](n * n)
	var err error
	switch r := any(r).(type) {
	case []float64:
		err = kernels.CholInvUpperRev(n, r, n, any(u).([]float64), n)
	case []float32:
		err = kernels.CholInvUpperRev32(n, r, n, any(u).([]float32), n)
	}
	if err != nil {
		putBuf(u)
		return nil, false
	}
	procs := min(runtime.GOMAXPROCS(0), max(1, n/256))
	bad := make([]bool, procs)
	kernels.ParallelFor(procs, procs, func(p, _ int) {
		// Rows dealt out in turn, so that every core gets a similar share
		// of the triangle.
		for a := p; a < n; a += procs {
			for _, v := range u[a*n+a : (a+1)*n] {
				// One comparison catches NaN and ±Inf (float32 ones too,
				// converted exactly).
				if x := math.Abs(float64(v)); !(x <= math.MaxFloat64) {
					bad[p] = true
					return
				}
			}
			if !(u[a*n+a] > 0) {
				bad[p] = true
				return
			}
		}
	})
	if slices.Contains(bad, true) {
		putBuf(u)
		return nil, false
	}
	return u, true
}

// traceForm returns tr(Δ·H·Δᵀ) = ⟨H, ΔᵀΔ⟩ for the m×n matrix Δ (float32,
// row-major) and the n×n matrix H, reading H's lower triangle. ΔᵀΔ is
// accumulated in float64 (kernels.SyrkLower64), which costs m·n² flops —
// half of forming Δ·H.
func traceForm(d []float32, m, n int, h []float64) float64 {
	g := getBuf[float64](n * n)
	defer putBuf(g)
	for i := 0; i < n; i++ {
		clear(g[i*n : i*n+i+1]) // only the lower triangle is used
	}
	kernels.SyrkLower64(n, m, d, n, g, n)
	// Row terms on all cores, summed in row order: the same bits as one
	// sequential loop.
	terms := make([]float64, n)
	procs := min(runtime.GOMAXPROCS(0), max(1, n/128))
	kernels.ParallelFor(procs, procs, func(p, _ int) {
		for i := p; i < n; i += procs {
			gi, hi := g[i*n:i*n+i], h[i*n:i*n+i]
			var off float64
			for j, v := range gi {
				off += v * hi[j]
			}
			terms[i] = 2*off + g[i*n+i]*h[i*n+i]
		}
	})
	var s float64
	for _, t := range terms {
		s += t
	}
	return s
}
