package kernels

import "fmt"

// PackedB32 is the right-hand operand op(B) of Sgemm packed once into the
// kernel's panel layout, for products that reuse the same B with many
// left-hand operands (a weight matrix applied to batch after batch of
// tokens). Packing costs about as much as reading B once; for a short A
// (a few tokens) it dominates an unpacked Sgemm.
type PackedB32 struct {
	k, n int
	data []float32
}

// PackB32 packs op(B), which is k×n (B is stored n×k when transB is set),
// with leading dimension ldb. The result does not alias b.
func PackB32(transB bool, k, n int, b []float32, ldb int) *PackedB32 {
	if k < 0 || n < 0 {
		panic(fmt.Sprintf("kernels: PackB32: negative dimension k=%d n=%d", k, n))
	}
	if transB {
		checkMatrix("PackB32", "B", n, k, ldb, len(b))
	} else {
		checkMatrix("PackB32", "B", k, n, ldb, len(b))
	}
	p := &PackedB32{}
	p.pack(transB, k, n, b, ldb)
	return p
}

// Repack packs a new op(B) (see PackB32) into p, reusing its storage when
// it is large enough: for products whose B changes from call to call but
// is used by several of them in turn.
func (p *PackedB32) Repack(transB bool, k, n int, b []float32, ldb int) {
	if k < 0 || n < 0 {
		panic(fmt.Sprintf("kernels: Repack: negative dimension k=%d n=%d", k, n))
	}
	if transB {
		checkMatrix("Repack", "B", n, k, ldb, len(b))
	} else {
		checkMatrix("Repack", "B", k, n, ldb, len(b))
	}
	p.pack(transB, k, n, b, ldb)
}

func (p *PackedB32) pack(transB bool, k, n int, b []float32, ldb int) {
	size := packedSize(n, k, sNR)
	if cap(p.data) < size {
		p.data = make([]float32, size)
	}
	p.k, p.n, p.data = k, n, p.data[:size]
	pl := gemmPlan[float32]{m: 1, n: n, k: k, b: operand[float32]{data: b, ld: ldb, trans: transB}, nr: sNR}
	workers := Workers()
	for jc := 0; jc < n; jc += blockN {
		nc := min(blockN, n-jc)
		nSl := ceilDiv(nc, sNR)
		for pc := 0; pc < k; pc += blockK {
			kc := min(blockK, k-pc)
			off := panelOffset(n, k, sNR, jc, pc)
			dst := p.data[off : off+roundUp(nc, sNR)*kc]
			chunks := min(workers, nSl)
			ParallelFor(chunks, workers, func(t, _ int) {
				pl.packB(dst, jc, nc, pc, kc, t*nSl/chunks, (t+1)*nSl/chunks)
			})
		}
	}
}

// Rows returns k, the number of rows of op(B).
func (p *PackedB32) Rows() int { return p.k }

// Cols returns n, the number of columns of op(B).
func (p *PackedB32) Cols() int { return p.n }

// SgemmPacked computes C ← beta·C + (alpha·op(A))·op(B) like Sgemm, with
// op(B) taken from pb: op(A) is m×pb.Rows(), C is m×pb.Cols(). The result
// is bit-identical to Sgemm on the unpacked B.
func SgemmPacked(transA bool, m int, alpha float32, a []float32, lda int, pb *PackedB32, beta float32, c []float32, ldc int) {
	k, n := pb.k, pb.n
	if m < 0 {
		panic(fmt.Sprintf("kernels: SgemmPacked: negative dimension m=%d", m))
	}
	if transA {
		checkMatrix("SgemmPacked", "A", k, m, lda, len(a))
	} else {
		checkMatrix("SgemmPacked", "A", m, k, lda, len(a))
	}
	checkMatrix("SgemmPacked", "C", m, n, ldc, len(c))
	scaleC(m, n, beta, c, ldc, false)
	if alpha == 0 {
		return
	}
	pl := gemmPlan[float32]{m: m, n: n, k: k, alpha: alpha,
		a:  operand[float32]{data: a, ld: lda, trans: transA},
		mr: sMR, nr: sNR, mcMax: sMCMax, tile: tile32(c, ldc, false), tile2: tile32x2(c, ldc)}
	pl.runPacked(pb.data)
}

// SgemmPackedAcc is SgemmPacked with beta 1 and a side job, as SgemmAcc:
// side, when not nil, runs once on the calling goroutine while the other
// workers start on the product (first, with one worker). The bits of C
// are those of Sgemm.
func SgemmPackedAcc(transA bool, m int, alpha float32, a []float32, lda int, pb *PackedB32, c []float32, ldc int, side func()) {
	k, n := pb.k, pb.n
	if m < 0 {
		panic(fmt.Sprintf("kernels: SgemmPackedAcc: negative dimension m=%d", m))
	}
	if transA {
		checkMatrix("SgemmPackedAcc", "A", k, m, lda, len(a))
	} else {
		checkMatrix("SgemmPackedAcc", "A", m, k, lda, len(a))
	}
	checkMatrix("SgemmPackedAcc", "C", m, n, ldc, len(c))
	if alpha == 0 {
		if side != nil {
			side()
		}
		return
	}
	pl := gemmPlan[float32]{m: m, n: n, k: k, alpha: alpha, side: side,
		a:  operand[float32]{data: a, ld: lda, trans: transA},
		mr: sMR, nr: sNR, mcMax: sMCMax, tile: tile32(c, ldc, false), tile2: tile32x2(c, ldc)}
	pl.runPacked(pb.data)
}
