package kernels

import (
	"fmt"
	"math"
	"sync/atomic"
)

// addTile adds the mv×nv corner of the scratch tile t (row stride nr) to
// C at rows [i, i+mv), columns [j, j+nv), only on or below the diagonal
// when lowerC: the flush of a partial or diagonal micro-tile.
func addTile[T, C float32 | float64](c []C, ldc int, lowerC bool, t []T, nr, i, j, mv, nv int) {
	for r := 0; r < mv; r++ {
		w := nv
		if lowerC {
			w = min(nv, i+r-j+1)
		}
		row := c[(i+r)*ldc+j : (i+r)*ldc+j+max(w, 0)]
		for col := range row {
			row[col] += C(t[r*nr+col])
		}
	}
}

// tile32, tile32to64 and tile64 return the micro-tile step of a product
// into C: whole tiles off the diagonal go straight to the micro-kernel,
// the others through a scratch tile and addTile.
func tile32(c []float32, ldc int, lowerC bool) tileFunc[float32] {
	return func(kc int, ap, bp []float32, i, j, mv, nv int) {
		if mv == sMR && nv == sNR && (!lowerC || i >= j+sNR-1) {
			sgemmKern(kc, ap, bp, c[i*ldc+j:], ldc)
			return
		}
		t := negZeroTile32
		sgemmKern(kc, ap, bp, t[:], sNR)
		addTile(c, ldc, lowerC, t[:], sNR, i, j, mv, nv)
	}
}

func tile32to64(c []float64, ldc int, lowerC bool) tileFunc[float32] {
	return func(kc int, ap, bp []float32, i, j, mv, nv int) {
		if mv == sMR && nv == sNR && (!lowerC || i >= j+sNR-1) {
			sgemmKern64(kc, ap, bp, c[i*ldc+j:], ldc)
			return
		}
		t := negZeroTile32
		sgemmKern(kc, ap, bp, t[:], sNR)
		addTile(c, ldc, lowerC, t[:], sNR, i, j, mv, nv)
	}
}

// tile32x2 and tile32to64x2 return the 12×32 tile step of a float32
// product into C, or nil where no such micro-kernel exists (the 6×16
// tiles then cover everything).
func tile32x2(c []float32, ldc int) tile2Func[float32] {
	if !useTile12 {
		return nil
	}
	return func(kc int, ap, bp []float32, i, j int) { sgemmKern12(kc, ap, bp, c[i*ldc+j:], ldc) }
}

func tile32to64x2(c []float64, ldc int) tile2Func[float32] {
	if !useTile12 {
		return nil
	}
	return func(kc int, ap, bp []float32, i, j int) { sgemmKern12to64(kc, ap, bp, c[i*ldc+j:], ldc) }
}

func tile64(c []float64, ldc int, lowerC bool) tileFunc[float64] {
	return func(kc int, ap, bp []float64, i, j, mv, nv int) {
		if mv == dMR && nv == dNR && (!lowerC || i >= j+dNR-1) {
			dgemmKern(kc, ap, bp, c[i*ldc+j:], ldc)
			return
		}
		t := negZeroTile64
		dgemmKern(kc, ap, bp, t[:], dNR)
		addTile(c, ldc, lowerC, t[:], dNR, i, j, mv, nv)
	}
}

// Sgemm computes C ← beta·C + (alpha·op(A))·op(B) for float32 row-major
// matrices: op(A) is m×k (A is stored k×m when transA is set), op(B) is
// k×n (B is stored n×k when transB is set), C is m×n; lda, ldb and ldc are
// the leading dimensions (row strides) of the stored matrices.
//
// Rounding, which the pure-Go build reproduces bit for bit: alpha·a is
// rounded to float32 when A is packed (exact when alpha is 1 or −1); beta
// is applied first (beta 0 clears C, beta 1 leaves it); then for every
// block of 256 consecutive inner indices, in increasing order, each
// element of C receives the chain of fused multiply-adds over the block
// started from +0, added to C with one float32 addition.
//
// The GPTQ lazy block update W[:, i2:] −= E·U[i1:i2, i2:] is
//
//	Sgemm(false, false, rows, cols-i2, i2-i1, -1, e, i2-i1,
//		u[i1*ldu+i2:], ldu, 1, w[i2:], cols)
//
// Dimension or length errors are programming errors and panic.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkGemm("Sgemm", transA, transB, m, n, k, lda, ldb, ldc, len(a), len(b), len(c))
	scaleC(m, n, beta, c, ldc, false)
	if alpha == 0 {
		return
	}
	sgemmMasked(transA, transB, m, n, k, alpha, a, lda, maskNone, b, ldb, maskNone, 0, c, ldc, false, nil)
}

// SgemmAcc is Sgemm with beta 1, C += (alpha·op(A))·op(B), with a side
// job: side, when not nil, runs once on the calling goroutine while the
// other workers start on the product, and has returned when SgemmAcc
// returns (with one worker it runs first, then the product). It lets a
// caller overlap work that touches neither A, B nor C with the product;
// it may start parallel regions of its own. The bits of C are those of
// Sgemm.
func SgemmAcc(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, side func()) {
	checkGemm("SgemmAcc", transA, transB, m, n, k, lda, ldb, ldc, len(a), len(b), len(c))
	if alpha == 0 {
		if side != nil {
			side()
		}
		return
	}
	sgemmMasked(transA, transB, m, n, k, alpha, a, lda, maskNone, b, ldb, maskNone, 0, c, ldc, false, side)
}

// DgemmAcc is SgemmAcc for float64.
func DgemmAcc(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, c []float64, ldc int, side func()) {
	checkGemm("DgemmAcc", transA, transB, m, n, k, lda, ldb, ldc, len(a), len(b), len(c))
	if alpha == 0 {
		if side != nil {
			side()
		}
		return
	}
	dgemmMasked(transA, transB, m, n, k, alpha, a, lda, maskNone, b, ldb, maskNone, 0, c, ldc, false, side)
}

// Dgemm is Sgemm for float64 (math.FMA chains, float64 additions).
func Dgemm(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	checkGemm("Dgemm", transA, transB, m, n, k, lda, ldb, ldc, len(a), len(b), len(c))
	scaleC(m, n, beta, c, ldc, false)
	if alpha == 0 {
		return
	}
	dgemmMasked(transA, transB, m, n, k, alpha, a, lda, maskNone, b, ldb, maskNone, 0, c, ldc, false, nil)
}

// sgemmMasked is Sgemm without beta, with operand masks and an optional
// lower-triangle-only C (m == n then, C square). boff shifts B's mask
// (see operand.off). side, when not nil, runs
// on the calling goroutine while the other workers start on the product
// (see gemmPlan.side).
func sgemmMasked(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, am mask, b []float32, ldb int, bm mask, boff int, c []float32, ldc int, lowerC bool, side func()) {
	sgemmMaskedA(transA, transB, m, n, k, alpha, a, lda, am, b, ldb, bm, boff, c, ldc, lowerC, side, nil, false, nil, false)
}

// sgemmMaskedA is sgemmMasked with op(A) packed once for several
// products (see gemmPlan.preA), optionally op(B) packed beforehand
// (gemmPlan.preB), and clearC when C holds no −0 (gemmPlan.clearC).
func sgemmMaskedA(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, am mask, b []float32, ldb int, bm mask, boff int, c []float32, ldc int, lowerC bool, side func(), preA []float32, fillA bool, preB []float32, clearC bool) {
	pl := gemmPlan[float32]{m: m, n: n, k: k, alpha: alpha, side: side, preA: preA, fillA: fillA, preB: preB, clearC: clearC,
		a:      operand[float32]{data: a, ld: lda, trans: transA, mask: am},
		b:      operand[float32]{data: b, ld: ldb, trans: transB, mask: bm, off: boff},
		lowerC: lowerC,
		mr:     sMR, nr: sNR, mcMax: sMCMax, tile: tile32(c, ldc, lowerC), tile2: tile32x2(c, ldc)}
	pl.run()
}

// dgemmMasked is Dgemm without beta, with operand masks and an optional
// lower-triangle-only C (m == n then, C square). boff shifts B's mask
// (see operand.off). side, when not nil, runs
// on the calling goroutine while the other workers start on the product
// (see gemmPlan.side).
func dgemmMasked(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, am mask, b []float64, ldb int, bm mask, boff int, c []float64, ldc int, lowerC bool, side func()) {
	dgemmMaskedA(transA, transB, m, n, k, alpha, a, lda, am, b, ldb, bm, boff, c, ldc, lowerC, side, nil, false, nil, false)
}

// dgemmMaskedA is sgemmMaskedA in float64.
func dgemmMaskedA(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, am mask, b []float64, ldb int, bm mask, boff int, c []float64, ldc int, lowerC bool, side func(), preA []float64, fillA bool, preB []float64, clearC bool) {
	pl := gemmPlan[float64]{m: m, n: n, k: k, alpha: alpha, side: side, preA: preA, fillA: fillA, preB: preB, clearC: clearC,
		a:      operand[float64]{data: a, ld: lda, trans: transA, mask: am},
		b:      operand[float64]{data: b, ld: ldb, trans: transB, mask: bm, off: boff},
		lowerC: lowerC,
		mr:     dMR, nr: dNR, mcMax: dMCMax, tile: tile64(c, ldc, lowerC)}
	pl.run()
}

// SyrkLower64 adds XᵀX to the lower triangle (diagonal included) of the
// n×n float64 matrix C, where X is k×n float32 (k rows of n features, the
// layout of a batch of activations) with leading dimension ldx. This is the
// Hessian update H += Σ_t x_t x_tᵀ. The strict upper triangle of C is
// neither read nor written; SymmetrizeLower64 copies the lower triangle
// up.
//
// Products are accumulated in float32 micro-tiles, each over at most 256
// consecutive rows of X (fused multiply-adds from +0), and every tile
// partial sum is converted exactly to float64 and added to C. The float32
// partials limit the relative error of one 256-row block to about
// 256·2⁻²⁴; blocks are summed in float64, so long token streams do not
// lose the small contributions of late rows.
//
// Work counted as n(n+1)·k floating-point operations (the triangle) is
// what the kernel needs; a full XᵀX product would count 2·n²·k. Every call
// reads and writes the triangle of C once per 256 rows of X, so batches of
// at least a few hundred rows keep the kernel compute-bound; much smaller
// batches make it bound by memory traffic on C.
func SyrkLower64(n, k int, x []float32, ldx int, c []float64, ldc int) {
	checkMatrix("SyrkLower64", "X", k, n, ldx, len(x))
	checkMatrix("SyrkLower64", "C", n, n, ldc, len(c))
	pl := gemmPlan[float32]{m: n, n: n, k: k, alpha: 1,
		a:      operand[float32]{data: x, ld: ldx, trans: true},
		b:      operand[float32]{data: x, ld: ldx},
		lowerC: true,
		mr:     sMR, nr: sNR, mcMax: sMCMax, tile: tile32to64(c, ldc, true), tile2: tile32to64x2(c, ldc)}
	pl.run()
}

// SyrkLower32 adds XᵀX to the lower triangle of the n×n float32 matrix C
// (X is k×n float32), with the rounding of Sgemm: one float32 addition
// into C per 256-row block.
func SyrkLower32(n, k int, x []float32, ldx int, c []float32, ldc int) {
	checkMatrix("SyrkLower32", "X", k, n, ldx, len(x))
	checkMatrix("SyrkLower32", "C", n, n, ldc, len(c))
	sgemmMasked(true, false, n, n, k, 1, x, ldx, maskNone, x, ldx, maskNone, 0, c, ldc, true, nil)
}

// SymmetrizeLower64 copies the strict lower triangle of the n×n matrix C
// onto its upper triangle.
func SymmetrizeLower64(n int, c []float64, ldc int) {
	checkMatrix("SymmetrizeLower64", "C", n, n, ldc, len(c))
	symmetrize(n, c, ldc)
}

func symmetrize[T float32 | float64](n int, c []T, ldc int) {
	// Blocked transpose copy to stay cache friendly for large n.
	const bs = 64
	for ib := 0; ib < n; ib += bs {
		for jb := 0; jb <= ib; jb += bs {
			for i := ib; i < min(ib+bs, n); i++ {
				for j := jb; j < min(jb+bs, i); j++ {
					c[j*ldc+i] = c[i*ldc+j]
				}
			}
		}
	}
}

// Axpy32 computes y[i] += float32(c·x[i]) for i < len(x): every product is
// rounded to float32 before its addition (never fused), so the assembly and
// pure-Go builds give the same bits, and with c = −a it equals
// y[i] −= float32(a·x[i]) bit for bit. y must be at least as long as x.
func Axpy32(c float32, x, y []float32) {
	if len(y) < len(x) {
		panic(fmt.Sprintf("kernels: Axpy32: y has %d elements, x %d", len(y), len(x)))
	}
	axpy32(c, x, y)
}

// AxpySubRows32 computes y[j·ldy+i] −= float32(a[j]·x[i]) for j < len(a)
// and i < len(x): one call for the rank-1 update that Axpy32(−a[j], x,
// row j of y) makes row by row, with the same bits (every product rounded
// to float32 before the subtraction, never fused). Row j of y must not
// overlap x.
func AxpySubRows32(a, x, y []float32, ldy int) {
	m, n := len(a), len(x)
	if m == 0 || n == 0 {
		return
	}
	if ldy < n || len(y) < (m-1)*ldy+n {
		panic(fmt.Sprintf("kernels: AxpySubRows32: y has %d elements, want %d rows of %d with stride %d", len(y), m, n, ldy))
	}
	axpySubRows32(a, x, y, ldy)
}

// axpySubRows32Go is the pure-Go form of AxpySubRows32.
func axpySubRows32Go(a, x, y []float32, ldy int) {
	for j, c := range a {
		row := y[j*ldy : j*ldy+len(x)]
		for i, v := range x {
			row[i] -= float32(c * v)
		}
	}
}

// AllFinite32 reports whether no value of x is NaN or ±Inf, scanning
// ranges of x on up to Workers() goroutines.
func AllFinite32(x []float32) bool { return FirstNonFinite32(x) < 0 }

// FirstNonFinite32 returns the index of the first NaN or ±Inf of x, or -1
// when every value is finite, scanning ranges of x on up to Workers()
// goroutines (a range after one that holds a non-finite value is not
// scanned).
func FirstNonFinite32(x []float32) int {
	const chunk = 1 << 16
	n := (len(x) + chunk - 1) / chunk
	if n <= 1 {
		return firstNonFinite32(x)
	}
	var first atomic.Int64
	first.Store(int64(len(x)))
	ParallelFor(n, Workers(), func(t, _ int) {
		lo := t * chunk
		if int64(lo) >= first.Load() {
			return
		}
		i := firstNonFinite32(x[lo:min(lo+chunk, len(x))])
		for i >= 0 {
			old := first.Load()
			if int64(lo+i) >= old || first.CompareAndSwap(old, int64(lo+i)) {
				break
			}
		}
	})
	if f := int(first.Load()); f < len(x) {
		return f
	}
	return -1
}

// firstNonFinite32 is FirstNonFinite32 on the calling goroutine: blocks
// of x pass allFinite32, and only a block that fails is searched value by
// value.
func firstNonFinite32(x []float32) int {
	const block = 1024
	for b := 0; b < len(x); b += block {
		blk := x[b:min(len(x), b+block)]
		if allFinite32(blk) {
			continue
		}
		for i, v := range blk {
			if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
				return b + i
			}
		}
	}
	return -1
}

// allFinite32Go is the pure-Go form of allFinite32: a value is finite
// when its exponent field is not all ones.
func allFinite32Go(x []float32) bool {
	var worst uint32
	for _, v := range x {
		worst = max(worst, math.Float32bits(v)&0x7f800000)
	}
	return worst != 0x7f800000
}
