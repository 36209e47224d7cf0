package kernels

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
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
// architecture gives the same bits): eight partial sums over the first
// len(x)&^7 elements (dot8Go), the remaining products added to the first
// partial sum, combined as ((s0+s4)+(s1+s5))+((s2+s6)+(s3+s7)). It runs in
// assembly where available.
func dot[T float32 | float64](x, y []T) T {
	y = y[:len(x)]
	n8 := len(x) &^ 7
	var s [8]T
	switch xs := any(x).(type) {
	case []float64:
		s64 := dot8x64(xs, any(y).([]float64))
		for k := range s {
			s[k] = T(s64[k])
		}
	case []float32:
		s32 := dot8x32(xs, any(y).([]float32))
		for k := range s {
			s[k] = T(s32[k])
		}
	}
	for i := n8; i < len(x); i++ {
		s[0] += T(x[i] * y[i])
	}
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

// sqrtT is the correctly rounded square root in T (for float32, rounding
// the float64 square root again is exact: 53 ≥ 2·24+2).
func sqrtT[T float32 | float64](x T) T { return T(math.Sqrt(float64(x))) }

func finite[T float32 | float64](x T) bool {
	return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0)
}

// gemmMasked runs the packed product C += (alpha·op(A))·op(B) with operand
// masks and optionally only the lower triangle of C, in T's precision.
// clearC says that C holds no −0 where the product adds (a cleared
// buffer), which lets the chains skip the masked products at their ends
// as well as at their starts (gemmPlan.span).
func gemmMasked[T float32 | float64](transA, transB bool, m, n, k int, alpha T, a []T, lda int, am mask, b []T, ldb int, bm mask, c []T, ldc int, lowerC bool, side func(), clearC bool) {
	gemmMaskedOff(transA, transB, m, n, k, alpha, a, lda, am, b, ldb, bm, 0, c, ldc, lowerC, side, clearC)
}

// gemmMaskedOff is gemmMasked with B's mask shifted by boff columns
// (operand.off).
func gemmMaskedOff[T float32 | float64](transA, transB bool, m, n, k int, alpha T, a []T, lda int, am mask, b []T, ldb int, bm mask, boff int, c []T, ldc int, lowerC bool, side func(), clearC bool) {
	gemmMaskedPre(transA, transB, m, n, k, alpha, a, lda, am, b, ldb, bm, boff, c, ldc, lowerC, side, nil, false, nil, clearC)
}

// gemmMaskedPre is gemmMaskedOff with a shared packed A (gemmPlan.preA).
func gemmMaskedPre[T float32 | float64](transA, transB bool, m, n, k int, alpha T, a []T, lda int, am mask, b []T, ldb int, bm mask, boff int, c []T, ldc int, lowerC bool, side func(), preA []T, fillA bool, preB []T, clearC bool) {
	switch cc := any(c).(type) {
	case []float64:
		pa, _ := any(preA).([]float64)
		pb, _ := any(preB).([]float64)
		dgemmMaskedA(transA, transB, m, n, k, float64(alpha), any(a).([]float64), lda, am, any(b).([]float64), ldb, bm, boff, cc, ldc, lowerC, side, pa, fillA, pb, clearC)
	case []float32:
		pa, _ := any(preA).([]float32)
		pb, _ := any(preB).([]float32)
		sgemmMaskedA(transA, transB, m, n, k, float32(alpha), any(a).([]float32), lda, am, any(b).([]float32), ldb, bm, boff, cc, ldc, lowerC, side, pa, fillA, pb, clearC)
	}
}

// packUpperT packs op(B) = Tᵀ (T the jb×jb lower-triangular inverse of a
// diagonal block, leading dimension jb, masked to its lower triangle) the
// way the panel solve's product would pack it, into dst (at least
// packedSize(jb, jb, nr) values), so that the product can start on its
// tiles at once.
func packUpperT[T float32 | float64](t []T, jb int, dst []T) {
	nr := sNR
	var zero T
	if _, ok := any(zero).(float64); ok {
		nr = dNR
	}
	pl := gemmPlan[T]{n: jb, k: jb, nr: nr,
		b: operand[T]{data: t, ld: jb, trans: true, mask: maskUpper}}
	pl.packB(dst, 0, jb, 0, jb, 0, ceilDiv(jb, nr))
}

// potrfUnblocked factors the n×n block at a in place (lower triangle,
// row-oriented Cholesky–Crout). off is the block's position in the whole
// matrix, for error reports. Each entry is (a_ij − dot(row i, row j))/l_jj
// with dot's order of operations; the dot products of one column are
// formed in one batched call (dotRows) and finished here exactly as dot
// finishes them.
func potrfUnblocked[T float32 | float64](n int, a []T, lda, off int) error {
	return potrfCols(n, a, lda, off, nil)
}

// potrfCols is potrfUnblocked that, when done is not nil, stores j+1 in
// done as soon as row j of the factor is final (after its diagonal
// entry), and -1 when it fails.
func potrfCols[T float32 | float64](n int, a []T, lda, off int, done *atomic.Int64) error {
	psBuf := getBuf[T](8 * n)
	defer putBuf(psBuf)
	ps := *psBuf
	for j := 0; j < n; j++ {
		rj := a[j*lda : j*lda+j]
		d := a[j*lda+j] - dot(rj, rj)
		if !(d > 0) || !finite(d) {
			if done != nil {
				done.Store(-1)
			}
			return &NotPositiveDefiniteError{Order: off + j + 1, Pivot: float64(d)}
		}
		l := sqrtT(d)
		a[j*lda+j] = l
		if done != nil {
			done.Store(int64(j + 1))
		}
		m := n - j - 1
		if m == 0 {
			break
		}
		n8 := j &^ 7
		dotRows(a[(j+1)*lda:], lda, rj, n8, m, ps)
		for t := 0; t < m; t++ {
			i := j + 1 + t
			ri := a[i*lda : i*lda+j+1]
			s := ps[8*t : 8*t+8 : 8*t+8]
			s0 := s[0]
			for x := n8; x < j; x++ {
				s0 += T(ri[x] * rj[x])
			}
			sum := ((s0 + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
			ri[j] = (ri[j] - sum) / l
		}
	}
	return nil
}

// trtriUnblocked inverts the n×n lower-triangular block at a in place,
// row by row with contiguous row operations: row i of L⁻¹ is
// −(1/L_ii)·Σ_{k<i} L_ik·(row k of L⁻¹), plus 1/L_ii on the diagonal.
func trtriUnblocked[T float32 | float64](n int, a []T, lda, off int) error {
	return trtriRows(n, a, lda, off, nil)
}

// errAborted stops trtriRows when its before hook reports false.
var errAborted = errors.New("kernels: aborted")

// trtriRows is trtriUnblocked calling before(i), when not nil, ahead of
// row i (which reads rows 0..i of a); it stops with errAborted when
// before returns false.
func trtriRows[T float32 | float64](n int, a []T, lda, off int, before func(i int) bool) error {
	if n == 0 {
		return nil
	}
	tBuf := getBuf[T](n)
	defer putBuf(tBuf)
	t := *tBuf
	for i := 0; i < n; i++ {
		if before != nil && !before(i) {
			return errAborted
		}
		ri := a[i*lda : i*lda+i+1]
		d := ri[i]
		if d == 0 || !finite(d) {
			return &SingularError{Index: off + i, Value: float64(d)}
		}
		acc := t[:i]
		clear(acc)
		// axpy(ri[k], row k of L⁻¹, acc[:k+1]) for k < i, in one call.
		axpyTri(ri[:i], a, lda, acc, i)
		inv := 1 / d
		for x := range acc {
			ri[x] = -acc[x] * inv
		}
		ri[i] = inv
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
	return potrf(n, a, lda, nil)
}

// potrf factors A in place. When dinv is not nil (n·cholBlock values) it
// also keeps the inverse of every diagonal block but the last, block j
// (jb×jb, leading dimension jb) at dinv[j·cholBlock:], for trtri.
func potrf[T float32 | float64](n int, a []T, lda int, dinv []T) error {
	nb := cholBlock
	if n <= nb {
		return potrfUnblocked(n, a, lda, 0)
	}
	tBuf := getBuf[T](nb * nb)
	defer putBuf(tBuf)
	pBuf := getBuf[T](n * nb)
	defer putBuf(pBuf)
	p := *pBuf
	// diag factors the diagonal block at j and, unless it is the last,
	// returns its inverse T = L11⁻¹ (in dinv when kept, else in the
	// shared buffer).
	diag := func(j, jb int) ([]T, error) {
		t := *tBuf
		if dinv != nil {
			t = dinv[j*nb : j*nb+jb*jb]
		}
		return cholDiag(n, a, lda, j, jb, t)
	}
	lookahead := Workers() > 1
	var t []T
	ready := false // the diagonal block at j was done during the last update
	for j := 0; j < n; j += nb {
		jb := min(nb, n-j)
		if !ready {
			var err error
			if t, err = diag(j, jb); err != nil {
				return err
			}
		}
		ready = false
		rest := n - j - jb
		if rest == 0 {
			break
		}
		// L21 = A21·L11⁻ᵀ = A21·Tᵀ.
		a21 := a[(j+jb)*lda+j:]
		clear(p[:rest*jb])
		gemmMasked(false, true, rest, jb, jb, 1, a21, lda, maskNone, t, jb, maskUpper, p, jb, false, nil, true)
		// L21 is written back into A21 from p; the products below read
		// it from p (the same values), so the copy needs no parallel
		// region of its own: the calling goroutine does it.
		copyBack := func() {
			for r := 0; r < rest; r++ {
				copy(a21[r*lda:r*lda+jb], p[r*jb:r*jb+jb])
			}
		}
		// A22 −= L21·L21ᵀ, lower triangle only. With one worker, one
		// product. With more, lookahead: two products, the next block
		// column first, then the rest, during which the calling goroutine
		// writes L21 back and factors and inverts the next diagonal block
		// (final after the first part) while the other workers start on
		// the tiles, so the cores do not wait for its scalar work. Each
		// element receives the same chain either way.
		next, jb2 := j+jb, min(nb, rest)
		if !lookahead || rest == jb2 {
			gemmMasked(false, true, rest, rest, jb, -1, p, jb, maskNone, p, jb, maskNone, a[next*lda+next:], lda, true, nil, false)
			copyBack()
			continue
		}
		gemmMasked(false, true, rest, jb2, jb, -1, p, jb, maskNone, p, jb, maskNone, a[next*lda+next:], lda, true, nil, false)
		p31 := p[jb2*jb:]
		var err error
		gemmMasked(false, true, rest-jb2, rest-jb2, jb, -1, p31, jb, maskNone, p31, jb, maskNone, a[(next+jb2)*lda+next+jb2:], lda, true,
			func() {
				copyBack()
				t, err = diag(next, jb2)
			}, false)
		if err != nil {
			return err
		}
		ready = true
	}
	return nil
}

// cholDiag factors the jb×jb diagonal block at (j, j) of the n×n matrix a
// in place and, unless it is the last block, writes its inverse
// T = L_jj⁻¹ to t (leading dimension jb) and returns t.
func cholDiag[T float32 | float64](n int, a []T, lda, j, jb int, t []T) ([]T, error) {
	if err := potrfUnblocked(jb, a[j*lda+j:], lda, j); err != nil {
		return nil, err
	}
	if j+jb == n {
		return nil, nil
	}
	t = t[:jb*jb]
	for r := 0; r < jb; r++ {
		copy(t[r*jb:r*jb+r+1], a[(j+r)*lda+j:(j+r)*lda+j+r+1])
	}
	if err := trtriUnblocked(jb, t, jb, j); err != nil {
		return nil, &NotPositiveDefiniteError{Order: j + jb, Pivot: 0}
	}
	return t, nil
}

// cholDiag2 is cholDiag on two goroutines when the kernels may use two
// and the block is not the last: one factors the block, the other
// inverts each row of the factor as soon as it is final (row i of the
// inverse needs rows 0..i of the factor only), so the two scalar halves
// overlap. Each goroutine performs the operations cholDiag would, in the
// same order, on the same values.
func cholDiag2[T float32 | float64](n int, a []T, lda, j, jb int, t []T) ([]T, error) {
	if j+jb == n || Workers() < 2 {
		return cholDiag(n, a, lda, j, jb, t)
	}
	t = t[:jb*jb]
	var done atomic.Int64
	var perr, terr error
	ParallelFor(2, 2, func(task, _ int) {
		if task == 0 {
			perr = potrfCols(jb, a[j*lda+j:], lda, j, &done)
			return
		}
		terr = trtriRows(jb, t, jb, j, func(i int) bool {
			for spins := 0; ; spins++ {
				d := done.Load()
				if d < 0 {
					return false
				}
				if d > int64(i) {
					break
				}
				if spins&15 == 15 {
					runtime.Gosched()
				}
			}
			copy(t[i*jb:i*jb+i+1], a[(j+i)*lda+j:(j+i)*lda+j+i+1])
			return true
		})
	})
	if perr != nil {
		return nil, perr
	}
	if terr != nil {
		return nil, &NotPositiveDefiniteError{Order: j + jb, Pivot: 0}
	}
	return t, nil
}

// Dtrtri inverts the n×n lower-triangular matrix L in place (the strict
// upper triangle is neither read nor written). It returns a
// *SingularError when a diagonal entry is zero or not finite.
//
// Blocked by 96 columns, right-looking, from the first block row to the
// last: block row j of L⁻¹ is L_jj⁻¹ times what the earlier block rows
// left in it, and then updates all the rows below with one packed GEMM of
// inner dimension 96 (the same shape as the Cholesky trailing update).
func Dtrtri(n int, a []float64, lda int) error {
	checkMatrix("Dtrtri", "L", n, n, lda, len(a))
	return trtri(n, a, lda, nil)
}

// trtri inverts L in place. dinv, when not nil, holds the inverses of the
// diagonal blocks that potrf computed while factoring L (the same
// operations on the same values, so reusing them changes no bit).
func trtri[T float32 | float64](n int, a []T, lda int, dinv []T) error {
	nb := cholBlock
	if n <= nb {
		return trtriUnblocked(n, a, lda, 0)
	}
	// Solve L·X = I block row by block row. Rows below block row j hold,
	// in the columns of the blocks already done, the accumulated
	// −Σ L[i][k]·X[k][·] (starting from the zeros of I), and elsewhere
	// the original L.
	pBuf := getBuf[T](n * nb)
	defer putBuf(pBuf)
	rBuf := getBuf[T](nb * n)
	defer putBuf(rBuf)
	p, r := *pBuf, *rBuf
	for j := 0; j < n; j += nb {
		if err := trtriStep(n, a, lda, j, dinv, p, r, nil); err != nil {
			return err
		}
	}
	return nil
}

// trtriStep is block row j of trtri: p (n·96) and r (96·n) are scratch.
// side, when not nil, runs on the calling goroutine while the other
// workers start on the step's last product (or alone, when there is none):
// it must not touch columns before j+96 or rows up to j+96.
func trtriStep[T float32 | float64](n int, a []T, lda, j int, dinv, p, r []T, side func()) error {
	nb := cholBlock
	jb := min(nb, n-j)
	rest := n - j - jb
	// Save the panel L[j+jb:, j:j+jb] and clear it: from now on that
	// region accumulates −L·X like the columns before it. In the same
	// parallel region, move the accumulated block row j (columns
	// before j) to r for the product below.
	top := 0
	if j > 0 {
		top = jb
	}
	ParallelRows(top+rest, jb, func(i0, i1 int) {
		for i := i0; i < i1; i++ {
			if i < top {
				copy(r[i*j:i*j+j], a[(j+i)*lda:(j+i)*lda+j])
				clear(a[(j+i)*lda : (j+i)*lda+j])
				continue
			}
			row := a[(j+jb+i-top)*lda+j : (j+jb+i-top)*lda+j+jb]
			copy(p[(i-top)*jb:(i-top)*jb+jb], row)
			clear(row)
		}
	})
	if dinv != nil && rest > 0 {
		t := dinv[j*nb : j*nb+jb*jb]
		for i := 0; i < jb; i++ {
			copy(a[(j+i)*lda+j:(j+i)*lda+j+i+1], t[i*jb:i*jb+i+1])
		}
	} else if err := trtriUnblocked(jb, a[j*lda+j:], lda, j); err != nil {
		return err
	}
	if j > 0 {
		// X[j, :j] = L_jj⁻¹ · (accumulated row block).
		gemmMasked(false, false, jb, j, jb, 1, a[j*lda+j:], lda, maskLower, r, j, maskNone, a[j*lda:], lda, false, nil, true)
	}
	if rest > 0 {
		// Rows below: −= panel · X[j block row, :j+jb], one product;
		// the block X_jj is lower triangular (B's mask shifted by j).
		gemmMaskedOff(false, false, rest, j+jb, jb, -1, p, jb, maskNone, a[j*lda:], lda, maskLower, j, a[(j+jb)*lda:], lda, false, side, false)
	} else if side != nil {
		side()
	}
	return nil
}

// Dpotri computes the lower triangle of A⁻¹ = L⁻ᵀ·L⁻¹ in place from the
// Cholesky factor L that Dpotrf left in the lower triangle (the strict
// upper triangle is neither read nor written). It returns a
// *SingularError if L has a zero diagonal entry.
func Dpotri(n int, a []float64, lda int) error {
	checkMatrix("Dpotri", "L", n, n, lda, len(a))
	return potri(n, a, lda)
}

func potri[T float32 | float64](n int, a []T, lda int) error {
	if err := trtri(n, a, lda, nil); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	// A⁻¹[i][j] = Σ_{p ≥ i} Linv[p][i]·Linv[p][j] for i ≥ j; the product
	// needs a copy of L⁻¹ because it overwrites its own input.
	bBuf := getBuf[T](n * n)
	defer putBuf(bBuf)
	li := *bBuf
	for r := 0; r < n; r++ {
		copy(li[r*n:r*n+r+1], a[r*lda:r*lda+r+1])
		clear(a[r*lda : r*lda+r+1])
	}
	gemmMasked(true, false, n, n, n, 1, li, n, maskUpper, li, n, maskLower, a, lda, true, nil, false)
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
	return cholInvUpper(n, h, ldh, u, ldu)
}

// Spotrf is Dpotrf in float32 (float32 products and sums throughout; the
// packed GEMM rounding of Sgemm).
func Spotrf(n int, a []float32, lda int) error {
	checkMatrix("Spotrf", "A", n, n, lda, len(a))
	return potrf(n, a, lda, nil)
}

// Strtri is Dtrtri in float32.
func Strtri(n int, a []float32, lda int) error {
	checkMatrix("Strtri", "L", n, n, lda, len(a))
	return trtri(n, a, lda, nil)
}

// Spotri is Dpotri in float32.
func Spotri(n int, a []float32, lda int) error {
	checkMatrix("Spotri", "L", n, n, lda, len(a))
	return potri(n, a, lda)
}

// CholInvUpper32 is CholInvUpper in float32, the precision of the
// reference GPTQ implementation: about twice as fast, and accurate enough
// for well-damped Hessians; prefer the float64 form for ill-conditioned
// ones.
func CholInvUpper32(n int, h []float32, ldh int, u []float32, ldu int) error {
	checkMatrix("CholInvUpper32", "H", n, n, ldh, len(h))
	checkMatrix("CholInvUpper32", "U", n, n, ldu, len(u))
	return cholInvUpper(n, h, ldh, u, ldu)
}

// CholInvUpperRev is CholInvUpper for a Hessian handed over with its rows
// and columns already in reverse order: the lower triangle of r holds
// P·H·P (r[i][j] = H[n-1-i][n-1-j]) and is used as the work space, so it is
// overwritten. A caller that builds the matrix anyway (a permuted or damped
// copy of H) saves the reordering pass and the in-place rotation of
// CholInvUpper; U is bit for bit the same. r and u must not overlap.
func CholInvUpperRev(n int, r []float64, ldr int, u []float64, ldu int) error {
	checkMatrix("CholInvUpperRev", "R", n, n, ldr, len(r))
	checkMatrix("CholInvUpperRev", "U", n, n, ldu, len(u))
	return cholInvUpperRev(n, r, ldr, u, ldu)
}

// CholInvUpperRev32 is CholInvUpperRev in float32 (CholInvUpper32's
// arithmetic).
func CholInvUpperRev32(n int, r []float32, ldr int, u []float32, ldu int) error {
	checkMatrix("CholInvUpperRev32", "R", n, n, ldr, len(r))
	checkMatrix("CholInvUpperRev32", "U", n, n, ldu, len(u))
	return cholInvUpperRev(n, r, ldr, u, ldu)
}

// invFactorInPlace factors the reversed Hessian in r and inverts the
// factor, leaving M = chol(P·H·P)⁻¹ in the lower triangle of r.
//
// It performs exactly the operations of potrf followed by trtri, on the
// same values in the same order for every element, but interleaves
// them: after Cholesky step j (panel solve and trailing update) comes
// block row j of the triangular inverse, which needs nothing later, and
// the next diagonal block (factored and inverted by scalar code) is the
// side job of that block row's last product. Cholesky step j+1 and later
// read and write only columns from j+96 on; block row j of the inverse
// writes only columns before that; so the diagonal blocks' scalar work
// overlaps a product at every step instead of only while the trailing
// product is long, which at small orders it is not.
//
// It is long by design: the overlapped schedule above is one pipeline whose
// steps hand each other block rows; split, its invariants (which columns
// each step may touch) would be spread over functions.
func invFactorInPlace[T float32 | float64](n int, r []T, ldr int) (err error) {
	defer func() {
		if e, ok := err.(*NotPositiveDefiniteError); ok {
			e.Trailing = true
		}
	}()
	nb := cholBlock
	if n <= nb {
		if err := potrfUnblocked(n, r, ldr, 0); err != nil {
			return err
		}
		return trtriUnblocked(n, r, ldr, 0)
	}
	dBuf := getBuf[T](n * nb)
	defer putBuf(dBuf)
	p0Buf := getBuf[T](n * nb)
	defer putBuf(p0Buf)
	p1Buf := getBuf[T](n * nb)
	defer putBuf(p1Buf)
	xBuf := getBuf[T](nb * n)
	defer putBuf(xBuf)
	rBuf := getBuf[T](nb * n)
	defer putBuf(rBuf)
	paBuf0 := getBuf[T](roundUp(n, max(sMR, dMR)) * nb)
	defer putBuf(paBuf0)
	paBuf := *paBuf0
	dinv, xb, rs := *dBuf, *xBuf, *rBuf
	pb := [2][]T{*p0Buf, *p1Buf}
	a, lda := r, ldr
	// The first diagonal block overlaps nothing else: factor and invert
	// it on two goroutines.
	t0, err := cholDiag2(n, a, lda, 0, nb, dinv)
	if err != nil {
		return err
	}
	// The panel solves' B, Tᵀ of the diagonal block, is packed when
	// the block is inverted (two buffers: the next block's is packed
	// while the current one may still be read).
	tpBuf0 := getBuf[T](2 * roundUp(nb, 16) * nb)
	defer putBuf(tpBuf0)
	tpb := *tpBuf0
	tp := [2][]T{tpb[:roundUp(nb, 16)*nb], tpb[roundUp(nb, 16)*nb:]}
	packUpperT(t0, nb, tp[0])
	clear(pb[0][:(n-nb)*nb])
	for j, step := 0, 0; j < n; j, step = j+nb, step+1 {
		jb := min(nb, n-j)
		rest := n - j - jb
		if rest == 0 {
			// The last block row: no panel below it.
			if err := trtriStep(n, a, lda, j, dinv, nil, rs, nil); err != nil {
				return err
			}
			break
		}
		// Cholesky step j: L21 = A21·L11⁻ᵀ into p (cleared beforehand),
		// then A22 −= L21·L21ᵀ (lower triangle). L21 stays in p, where
		// block row j of the inverse reads it as its panel (the values
		// trtri would save from A21): A21, which from now on accumulates
		// −L·X like the columns before it, is cleared instead of
		// receiving L21, by the calling goroutine during the update,
		// together with x, where block row j of the inverse is formed.
		p := pb[step%2]
		t := dinv[j*nb : j*nb+jb*jb]
		a21 := a[(j+jb)*lda+j:]
		xw := j + jb // width of block row j of the inverse
		gemmMaskedPre(false, true, rest, jb, jb, 1, a21, lda, maskNone, t, jb, maskUpper, 0, p, jb, false, nil, nil, false, tp[step%2], true)
		// −L21, packed as the update's A, is also the A of the product
		// below: packed once, when both products' B fit one packed
		// panel (n ≤ blockN).
		var pa []T
		if n <= blockN {
			pa = paBuf[:roundUp(rest, max(sMR, dMR))*jb]
		}
		gemmMaskedPre(false, true, rest, rest, jb, -1, p, jb, maskNone, p, jb, maskNone, 0, a[(j+jb)*lda+j+jb:], lda, true,
			func() {
				for i := 0; i < rest; i++ {
					clear(a21[i*lda : i*lda+jb])
				}
				clear(xb[:jb*xw])
			}, pa, true, nil, false)
		// Block row j of the inverse, formed in x (leading dimension
		// xw): X[j, :j] = L_jj⁻¹ · (accumulated block row), then the
		// diagonal block L_jj⁻¹ itself.
		if j > 0 {
			gemmMasked(false, false, jb, j, jb, 1, t, jb, maskLower, a[j*lda:], lda, maskNone, xb, xw, false, nil, true)
		}
		for i := 0; i < jb; i++ {
			copy(xb[i*xw+j:i*xw+j+i+1], t[i*jb:i*jb+i+1])
		}
		// Rows below: −= panel · X[j block row, :j+jb]. Meanwhile the
		// calling goroutine moves x into place (the product has packed
		// it already and writes only rows below), factors and inverts
		// the next diagonal block (final after the trailing update) and
		// clears the other panel buffer for the next step.
		var derr error
		next, jb2 := j+jb, min(nb, rest)
		pn := pb[(step+1)%2]
		gemmMaskedPre(false, false, rest, xw, jb, -1, p, jb, maskNone, xb, xw, maskLower, j, a[(j+jb)*lda:], lda, false,
			func() {
				for i := 0; i < jb; i++ {
					copy(a[(j+i)*lda:(j+i)*lda+j+i+1], xb[i*xw:i*xw+j+i+1])
				}
				var tn []T
				if tn, derr = cholDiag(n, a, lda, next, jb2, dinv[next*nb:]); tn != nil {
					packUpperT(tn, jb2, tp[(step+1)%2])
				}
				clear(pn[:(rest-jb2)*jb2])
			}, pa, false, nil, false)
		if derr != nil {
			return derr
		}
	}
	return nil
}

func cholInvUpperRev[T float32 | float64](n int, r []T, ldr int, u []T, ldu int) error {
	if err := invFactorInPlace(n, r, ldr); err != nil {
		return err
	}
	// U[i][j] = M[n-1-i][n-1-j] for j ≥ i: row i of U is row n-1-i of M
	// read backwards; the strict lower part of U is zero.
	ParallelRows(n, n, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			src := r[(n-1-i)*ldr : (n-1-i)*ldr+n-i]
			row := u[i*ldu : i*ldu+n]
			clear(row[:i])
			reverseCopy(row[i:], src)
		}
	})
	return nil
}

// reverseCopy sets dst[j] = src[len(src)-1-j] for every j (equal
// lengths), eight at a time where it can.
func reverseCopy[T float32 | float64](dst, src []T) {
	src = src[:len(dst)]
	k := len(src)
	j := 0
	for ; k >= 8; j, k = j+8, k-8 {
		d := dst[j : j+8 : j+8]
		q := src[k-8 : k : k]
		d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7] = q[7], q[6], q[5], q[4], q[3], q[2], q[1], q[0]
	}
	for ; k > 0; j, k = j+1, k-1 {
		dst[j] = src[k-1]
	}
}

func cholInvUpper[T float32 | float64](n int, h []T, ldh int, u []T, ldu int) error {
	// u (lower) = P·H·P: R[i][j] = H[n-1-i][n-1-j] = H[n-1-j][n-1-i].
	// Tiled so that both the reads (down columns of H) and the writes stay
	// in cache; tile rows are shared among the goroutines, the longest
	// first.
	const bs = 64
	nt := ceilDiv(n, bs)
	workers := Workers()
	if n < 256 {
		workers = 1
	}
	ParallelFor(nt, workers, func(t, _ int) {
		ib := (nt - 1 - t) * bs
		for jb := 0; jb <= ib; jb += bs {
			for j := jb; j < min(jb+bs, n); j++ {
				src := h[(n-1-j)*ldh:]
				for i := max(ib, j); i < min(ib+bs, n); i++ {
					u[i*ldu+j] = src[n-1-i]
				}
			}
		}
	})
	if err := invFactorInPlace(n, u, ldu); err != nil {
		return err
	}
	// Rotate by 180°: U[i][j] = M[n-1-i][n-1-j]. For i < j this reads the
	// strict lower triangle of M and writes the strict upper triangle of
	// u, which holds nothing needed (so rows can be done in any order and
	// concurrently); the diagonal is reversed in place; then the strict
	// lower part is cleared.
	ParallelRows(n, n/2, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			src := u[(n-1-i)*ldu:]
			row := u[i*ldu : i*ldu+n]
			for j := i + 1; j < n; j++ {
				row[j] = src[n-1-j]
			}
		}
	})
	for i := 0; i < n/2; i++ {
		x, y := i*ldu+i, (n-1-i)*ldu+n-1-i
		u[x], u[y] = u[y], u[x]
	}
	ParallelRows(n, n/2, func(r0, r1 int) {
		for i := max(r0, 1); i < r1; i++ {
			clear(u[i*ldu : i*ldu+i])
		}
	})
	return nil
}
