package kernels

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Blocking constants. Only blockK influences results: every output element
// receives one fused-multiply-add chain per block of blockK consecutive
// inner indices, added to it in increasing block order. blockN and the row
// blocking only decide which goroutine does what and where data sits in
// the caches.
const (
	blockK  = 256  // inner dimension per packed panel (KC)
	blockN  = 4080 // columns of B per packed panel (NC), a multiple of sNR and dNR
	sMCMax  = 144  // rows of A per packed block, float32 (MC, a multiple of sMR)
	dMCMax  = 96   // rows of A per packed block, float64 (a multiple of dMR)
	minTask = 4    // row blocks per worker the scheduler aims for

	// smallWork is the flop count below which a product runs on the
	// calling goroutine alone; packSerial the size of a B panel (values)
	// below which the calling goroutine packs it alone. A region of the
	// worker team starts and joins in a few microseconds, so both are
	// small: the products of a factorization's last blocks (a few
	// hundred thousand flops) and its narrow panels are worth sharing.
	smallWork  = 1 << 18
	packSerial = 1 << 11
)

// mask describes which part of a stored operand is read; the rest is taken
// as zero whatever the memory holds.
type mask uint8

const (
	maskNone  mask = iota
	maskLower      // op(X)[r][c] is zero for c > r
	maskUpper      // op(X)[r][c] is zero for c < r
)

// operand is op(X): X stored row-major with leading dimension ld,
// transposed when trans is set.
type operand[T float32 | float64] struct {
	data  []T
	ld    int
	trans bool
	mask  mask
	// off shifts a mask of B by off columns: maskLower zeroes
	// op(B)[r][c] for c > r+off, maskUpper for c < r+off. (A's masks
	// are not shifted.)
	off int
}

// tileFunc computes one micro-tile: rows [i, i+mv) and columns [j, j+nv)
// of C receive the product of the packed slivers ap (kc×mr) and bp
// (kc×nr).
type tileFunc[T float32 | float64] func(kc int, ap, bp []T, i, j, mv, nv int)

// tile2Func computes one 2mr×2nr tile at rows [i, i+2mr), columns
// [j, j+2nr) of C from the packed slivers ap (2 × kc×mr) and bp (2 ×
// kc×nr).
type tile2Func[T float32 | float64] func(kc int, ap, bp []T, i, j int)

type gemmPlan[T float32 | float64] struct {
	m, n, k int
	alpha   T
	a, b    operand[T]
	lowerC  bool // only C[i][j] with i >= j is computed
	mr, nr  int
	mcMax   int
	tile    tileFunc[T]
	// tile2, when not nil, computes a whole 2mr×2nr tile at once (rows
	// [i, i+2mr), columns [j, j+2nr)) from two consecutive A slivers
	// and two consecutive B slivers, each element with the chain tile
	// gives it: the wider register blocking of AVX-512. It is used only
	// where the four mr×nr tiles would all be whole, off the diagonal
	// and not skipped, so which one runs changes no bit.
	tile2 tile2Func[T]
	// side, when not nil, runs on the calling goroutine at the start of
	// the first compute step while the other workers start on the tiles
	// (once, and before the call returns; alone first with one worker).
	side func()
	// preA, when not nil, holds op(A)·alpha packed whole (mr-row
	// slivers of the k ≤ blockK inner indices, row block ic at
	// preA[ic·k:]), for a product whose B fits one panel (n ≤ blockN).
	// With fillA set the tasks pack their A blocks there (and use
	// them); otherwise they use what an earlier product with the same
	// op(A) and alpha packed there, and pack nothing.
	preA  []T
	fillA bool
	// preB, when not nil, holds op(B) packed whole (see packedSize).
	preB []T
	// clearC says that C holds no negative zero where the product adds
	// to it (a cleared buffer): then the masked-out products at the end
	// of a tile's chains are skipped as well as those at the start (see
	// span).
	clearC bool
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
func roundUp(a, b int) int { return ceilDiv(a, b) * b }

// skipTile reports whether the micro-tile at rows [i, i+mv), columns
// [j, j+nv), inner block [pc, pc+kc) contributes nothing to what is
// computed. Tiles sit at absolute multiples of mr and nr, so the decision
// does not depend on how rows were split among goroutines.
func (pl *gemmPlan[T]) skipTile(i, mv, j, pc, kc int) bool {
	if pl.lowerC && i+mv-1 < j {
		return true
	}
	switch pl.a.mask {
	case maskLower:
		return pc > i+mv-1
	case maskUpper:
		return pc+kc-1 < i
	}
	return false
}

// span returns the part [p0, p1) of the inner block [pc, pc+kc) over
// which the micro-tile at rows [i, i+mv), columns [j, j+nv) has products
// that the operand masks do not zero for every element; the tile's
// chains run over it alone (a triangular operand then costs half a
// dense one, as in a blocked TRMM). Both builds skip the same terms, and
// skipping changes no bit. A chain starts from +0, and a product the mask
// zeroes is a signed zero: before the first unmasked one, fma(±0, +0)
// keeps the chain at +0, so leading terms are always skipped. After the
// last one a signed zero leaves a non-zero chain as it is and can only
// turn a chain of −0 into +0; that difference disappears when the chain
// is added to C unless C holds −0 there, so trailing terms are skipped
// when clearC. (Masked zeros times a non-finite value would give NaN
// rather than nothing; such a value also meets unmasked weights in
// other tiles, so a non-finite input still gives non-finite output.)
func (pl *gemmPlan[T]) span(i, mv, j, nv, pc, kc int) (p0, p1 int) {
	p1 = kc
	if fullChains {
		return
	}
	switch pl.a.mask {
	case maskUpper: // op(A)[r][c] zero for c < r: rows from i
		p0 = max(p0, i-pc)
	case maskLower: // zero for c > r: rows up to i+mv-1
		if pl.clearC {
			p1 = min(p1, i+mv-pc)
		}
	}
	switch pl.b.mask {
	case maskLower: // op(B)[r][c] zero for c > r+off: columns from j
		p0 = max(p0, j-pl.b.off-pc)
	case maskUpper: // zero for c < r+off: columns up to j+nv-1
		if pl.clearC {
			p1 = min(p1, j+nv-pl.b.off-pc)
		}
	}
	p0 = min(p0, kc)
	return p0, max(p1, p0)
}

// fullChains turns span off (every chain runs over the whole inner
// block), for the tests that compare the two.
var fullChains bool

// trims reports whether span can be shorter than the inner block.
func (pl *gemmPlan[T]) trims() bool {
	return pl.a.mask == maskUpper || pl.b.mask == maskLower ||
		(pl.clearC && (pl.a.mask == maskLower || pl.b.mask == maskUpper))
}

// packA packs op(A)[ic:ic+mc, pc:pc+kc] as mr-row slivers, each stored
// p-major (kc groups of mr values), scaled by alpha, zero padded.
func (pl *gemmPlan[T]) packA(dst []T, ic, mc, pc, kc int) {
	mr := pl.mr
	a := pl.a
	for s := 0; s < mc; s += mr {
		sl := dst[(s/mr)*mr*kc : (s/mr+1)*mr*kc]
		i0 := ic + s
		rows := min(mr, pl.m-i0)
		scaled := false // the gathered values are already multiplied by alpha
		if !a.trans && rows == 6 && mr == 6 {
			// Six row streams interleaved, sequential writes.
			o := i0*a.ld + pc
			r0 := a.data[o : o+kc]
			r1 := a.data[o+a.ld : o+a.ld+kc]
			r2 := a.data[o+2*a.ld : o+2*a.ld+kc]
			r3 := a.data[o+3*a.ld : o+3*a.ld+kc]
			r4 := a.data[o+4*a.ld : o+4*a.ld+kc]
			r5 := a.data[o+5*a.ld : o+5*a.ld+kc]
			// Equal lengths, stated so that the loop needs no bounds
			// checks.
			r1, r2, r3, r4, r5 = r1[:len(r0)], r2[:len(r0)], r3[:len(r0)], r4[:len(r0)], r5[:len(r0)]
			d := sl[:6*len(r0)]
			if al := pl.alpha; al != 1 {
				// Scaled while gathering (the same one rounding as
				// scaling afterwards).
				for p := range r0 {
					e := d[6*p : 6*p+6 : 6*p+6]
					e[0], e[1], e[2], e[3], e[4], e[5] = r0[p]*al, r1[p]*al, r2[p]*al, r3[p]*al, r4[p]*al, r5[p]*al
				}
				scaled = true
			} else {
				for p := range r0 {
					e := d[6*p : 6*p+6 : 6*p+6]
					e[0], e[1], e[2], e[3], e[4], e[5] = r0[p], r1[p], r2[p], r3[p], r4[p], r5[p]
				}
			}
		} else if !a.trans {
			for r := 0; r < rows; r++ {
				src := a.data[(i0+r)*a.ld+pc : (i0+r)*a.ld+pc+kc]
				for p, v := range src {
					sl[p*mr+r] = v
				}
			}
		} else if rows == 6 && mr == 6 {
			for p := 0; p < kc; p++ {
				off := (pc+p)*a.ld + i0
				src := a.data[off : off+6 : off+6]
				d := sl[p*6 : p*6+6 : p*6+6]
				d[0], d[1], d[2], d[3], d[4], d[5] = src[0], src[1], src[2], src[3], src[4], src[5]
			}
		} else {
			for p := 0; p < kc; p++ {
				off := (pc+p)*a.ld + i0
				copy(sl[p*mr:p*mr+rows], a.data[off:off+rows])
			}
		}
		// Zeros (padding, masked entries) are scaled like the rest:
		// 0·alpha, a negative zero when alpha is negative.
		var zero T
		if scaled {
			zero *= pl.alpha
		}
		for r := rows; r < mr; r++ {
			for p := 0; p < kc; p++ {
				sl[p*mr+r] = zero
			}
		}
		switch a.mask {
		case maskLower: // zero where pc+p > i
			for r := 0; r < rows; r++ {
				for p := max(0, i0+r+1-pc); p < kc; p++ {
					sl[p*mr+r] = zero
				}
			}
		case maskUpper: // zero where pc+p < i
			for r := 0; r < rows; r++ {
				for p := 0; p < min(kc, i0+r-pc); p++ {
					sl[p*mr+r] = zero
				}
			}
		}
		if pl.alpha != 1 && !scaled {
			for x := range sl {
				sl[x] *= pl.alpha
			}
		}
	}
}

// packB packs slivers [s0, s1) of op(B)[pc:pc+kc, jc:jc+nc], each nr
// columns wide, stored p-major, zero padded.
func (pl *gemmPlan[T]) packB(dst []T, jc, nc, pc, kc, s0, s1 int) {
	nr := pl.nr
	b := pl.b
	for s := s0; s < s1; s++ {
		sl := dst[s*nr*kc : (s+1)*nr*kc]
		j0 := jc + s*nr
		cols := min(nr, jc+nc-j0)
		if !b.trans {
			for p := 0; p < kc; p++ {
				off := (pc+p)*b.ld + j0
				row := sl[p*nr : p*nr+nr]
				copy(row[:cols], b.data[off:off+cols])
				clear(row[cols:])
			}
		} else {
			c := 0
			d32, b32 := as32(dst), as32(b.data)
			// Eight rows of B at a time, interleaved: contiguous writes
			// of eight values instead of one value per cache line; in
			// float32 the leading multiple of 8 of them by the 8×8
			// register transpose where there is one.
			for ; c+8 <= cols; c += 8 {
				o := (j0+c)*b.ld + pc
				p0 := 0
				if d32 != nil {
					p0 = transpose8(kc, b32[o:], b.ld, d32[s*nr*kc+c:], nr)
				}
				r0 := b.data[o : o+kc]
				r1 := b.data[o+b.ld : o+b.ld+kc]
				r2 := b.data[o+2*b.ld : o+2*b.ld+kc]
				r3 := b.data[o+3*b.ld : o+3*b.ld+kc]
				r4 := b.data[o+4*b.ld : o+4*b.ld+kc]
				r5 := b.data[o+5*b.ld : o+5*b.ld+kc]
				r6 := b.data[o+6*b.ld : o+6*b.ld+kc]
				r7 := b.data[o+7*b.ld : o+7*b.ld+kc]
				r1, r2, r3, r4, r5, r6, r7 = r1[:len(r0)], r2[:len(r0)], r3[:len(r0)], r4[:len(r0)], r5[:len(r0)], r6[:len(r0)], r7[:len(r0)]
				for p := p0; p < len(r0); p++ {
					e := sl[p*nr+c : p*nr+c+8 : p*nr+c+8]
					e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7] = r0[p], r1[p], r2[p], r3[p], r4[p], r5[p], r6[p], r7[p]
				}
			}
			for ; c < cols; c++ {
				src := b.data[(j0+c)*b.ld+pc : (j0+c)*b.ld+pc+kc]
				for p, v := range src {
					sl[p*nr+c] = v
				}
			}
			if cols < nr {
				for p := 0; p < kc; p++ {
					clear(sl[p*nr+cols : p*nr+nr])
				}
			}
		}
		switch b.mask {
		case maskLower: // op(B)[p][j] zero where j > p (+off): p < j-pc-off
			for c := 0; c < cols; c++ {
				for p := 0; p < min(kc, j0+c-pc-b.off); p++ {
					sl[p*nr+c] = 0
				}
			}
		case maskUpper: // zero where j < p (+off): p > j-pc-off
			for c := 0; c < cols; c++ {
				for p := max(0, j0+c-pc-b.off+1); p < kc; p++ {
					sl[p*nr+c] = 0
				}
			}
		}
	}
}

// as32 views s as a []float32 when T is float32, and returns nil when it
// is float64.
func as32[T float32 | float64](s []T) []float32 {
	var z T
	if unsafe.Sizeof(z) != 4 || len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(s))), len(s))
}

// panelOffset returns where the packed panel (jc, pc) of op(B) starts in
// a whole-matrix packing: panels are stored jc-major, then pc, each
// roundUp(nc, nr)×kc.
func panelOffset(n, k, nr, jc, pc int) int {
	nc := min(blockN, n-jc)
	return jc*k + roundUp(nc, nr)*pc
}

// packedSize is the length of a whole-matrix packing of a k×n op(B).
func packedSize(n, k, nr int) int {
	if n == 0 || k == 0 {
		return 0
	}
	last := (n - 1) / blockN * blockN
	return panelOffset(n, k, nr, last, 0) + roundUp(n-last, nr)*k
}

// run executes the plan on up to Workers() goroutines. When pre is not
// nil it holds op(B) already packed for every panel (see packedSize).
func (pl *gemmPlan[T]) run() { pl.runPacked(pl.preB) }

// It is long by design: the loop nest of the blocked product (column
// panels, depth panels, packing, row pairs on the team, the side job) is
// one unit whose order of additions the golden digest pins; split, the hot
// path would go through closures.
func (pl *gemmPlan[T]) runPacked(pre []T) {
	m, n, k := pl.m, pl.n, pl.k
	side := pl.side
	if m == 0 || n == 0 || k == 0 {
		if side != nil {
			side()
		}
		return
	}
	mr, nr := pl.mr, pl.nr
	workers := Workers()
	if 2*float64(m)*float64(n)*float64(k) < smallWork {
		workers = 1 // not worth waking goroutines; results do not depend on it
	}
	if workers > 1 && pl.byColumns(workers) {
		pl.runColumns(pre, workers)
		return
	}
	mc := pl.mcMax
	if workers > 1 {
		tasks := minTask * workers
		if pl.lowerC {
			tasks *= 2
		}
		step := mr
		if pl.tile2 != nil {
			step = 2 * mr // row blocks of whole 2mr-row tiles
		}
		if t := roundUp(ceilDiv(m, tasks), step); t < mc {
			mc = t
		}
	}
	nRow := ceilDiv(m, mc)
	// Few row blocks (a short A): split the columns too, so that every
	// worker has something to do. Each task packs its own copy of its A
	// block, which is small in that case.
	nCol := 1
	if workers > 1 && !pl.lowerC && nRow < minTask*workers {
		nCol = ceilDiv(minTask*workers, nRow)
	}
	kcMax := min(k, blockK)
	ncMax := min(roundUp(n, nr), blockN)
	var bp []T
	if pre == nil {
		bpBuf := getBuf[T](ncMax * kcMax)
		defer putBuf(bpBuf)
		bp = *bpBuf
	}
	if pl.preA != nil {
		if k > blockK || n > blockN || len(pl.preA) < roundUp(m, mr)*k || (pl.fillA && nCol > 1) {
			panic(fmt.Sprintf("kernels: shared packed A does not fit the product %d×%d×%d", m, n, k))
		}
	}
	// The wide tiles run the whole inner block; products whose masks
	// shorten the chains (span) run the mr×nr tiles.
	pair := pl.tile2 != nil && !pl.trims()
	apBufs := make([]*[]T, min(workers, nRow*nCol))
	defer func() {
		for _, b := range apBufs {
			if b != nil {
				putBuf(b)
			}
		}
	}()
	for jc := 0; jc < n; jc += blockN {
		nc := min(blockN, n-jc)
		nSl := ceilDiv(nc, nr)
		nColJ := min(nCol, nSl)
		nTasks := nRow * nColJ
		for pc := 0; pc < k; pc += blockK {
			kc := min(blockK, k-pc)
			panel := bp
			// With more than one worker the B panel is packed by the
			// first nPack tasks of the product's own parallel region
			// (one region per panel instead of two): the compute tasks
			// after them pack their A block and then wait until every
			// pack task has finished. Tasks are handed out in order, so
			// every pack task has been taken, and is running, by the
			// time a compute task waits.
			nPack := 0
			var packed atomic.Int64
			if pre != nil {
				off := panelOffset(n, k, nr, jc, pc)
				panel = pre[off : off+roundUp(nc, nr)*kc]
			} else {
				chunks := min(workers, nSl)
				if nSl*nr*kc < packSerial || workers <= 1 {
					pl.packB(bp, jc, nc, pc, kc, 0, nSl)
				} else {
					nPack = chunks
				}
			}
			parallelForSide(nPack+nTasks, workers, func(t, w int) {
				if t < nPack {
					pl.packB(bp, jc, nc, pc, kc, t*nSl/nPack, (t+1)*nSl/nPack)
					packed.Add(1)
					return
				}
				t -= nPack
				if pl.lowerC {
					// The bottom row blocks of a triangle carry the
					// most tiles: hand them out first.
					t = nTasks - 1 - t
				}
				ic := (t / nColJ) * mc
				s0, s1 := (t%nColJ)*nSl/nColJ, (t%nColJ+1)*nSl/nColJ
				mcc := min(mc, m-ic)
				var ap []T
				if pl.preA != nil {
					ap = pl.preA[ic*k : (ic+roundUp(mcc, mr))*k]
					if pl.fillA {
						pl.packA(ap, ic, mcc, pc, kc)
					}
				}
				if pl.skipTile(ic, mcc, jc, pc, kc) {
					return
				}
				if pl.preA == nil {
					if apBufs[w] == nil {
						apBufs[w] = getBuf[T](roundUp(mc, mr) * kcMax)
					}
					ap = *apBufs[w]
					pl.packA(ap, ic, mcc, pc, kc)
				}
				for spins := 0; packed.Load() < int64(nPack); spins++ {
					if spins&15 == 15 {
						runtime.Gosched()
					}
				}
				// Along a row block of C: the A sliver stays in L1, the B
				// panel streams in order, C is walked row-wise.
				for ir := 0; ir < mcc; {
					i := ic + ir
					if pair && ir+2*mr <= mcc {
						pl.rowPair(kc, ap[(ir/mr)*mr*kc:(ir/mr+2)*mr*kc], panel, i, jc, pc, s0, s1)
						ir += 2 * mr
						continue
					}
					pl.rowSliver(kc, ap[(ir/mr)*mr*kc:(ir/mr+1)*mr*kc], panel, i, jc, pc, s0, s1)
					ir += mr
				}
			}, side)
			side = nil
		}
	}
}

// Column split for a short A. A product with fewer row blocks than the
// workers need tasks (a few tokens against a weight matrix: a routed
// expert's products, the LM head) is split over its columns alone: op(A)
// is packed whole once (it is small), and each task owns a run of at most
// colSlivers B slivers of one column panel for the whole inner dimension,
// packing those slivers itself (or reading them from a whole-matrix
// packing). Each task reads its part of B once, from memory into the
// caches, and keeps the sliver in use in L1 while the A slivers stream
// from L2; there is one parallel region for the whole product instead of
// one per depth panel, and no task waits for another's panel. An element
// of C still receives its blocks' chains in increasing block order from
// one goroutine, so the bits are those of the row split.
const (
	colSlivers = 16      // B slivers per task at most (16×16 columns × 256 inner = 256 KiB)
	colMaxA    = 1 << 22 // values of the whole packed op(A) at most
	// colMinWork is the flop count below which a product keeps the row
	// split: the chunked delta rule's 64-row products of a few MFLOP,
	// run from inside parallel tasks, gain nothing from the column split
	// (measured no better and possibly a few per cent slower on the 35B
	// Gated DeltaNet mixer).
	colMinWork = 1 << 23
)

// byColumns reports whether the product runs split over columns alone
// (see runColumns): not a triangle, no masks, no shared packed A, too few
// row blocks for the workers, enough column slivers, a small op(A) and
// enough work.
func (pl *gemmPlan[T]) byColumns(workers int) bool {
	if pl.lowerC || pl.a.mask != maskNone || pl.b.mask != maskNone || pl.preA != nil {
		return false
	}
	tasks := minTask * workers
	return ceilDiv(pl.m, pl.mcMax) < tasks && ceilDiv(pl.n, pl.nr) >= tasks &&
		roundUp(pl.m, pl.mr)*pl.k <= colMaxA && 2*float64(pl.m)*float64(pl.n)*float64(pl.k) >= colMinWork
}

// runColumns runs the product split over columns (see byColumns) on
// workers goroutines; pre, when not nil, is op(B) packed whole.
func (pl *gemmPlan[T]) runColumns(pre []T, workers int) {
	m, n, k, mr, nr := pl.m, pl.n, pl.k, pl.mr, pl.nr
	mp := roundUp(m, mr)
	// Row blocks of at most mcMax rows, balanced, whole tile pairs where
	// there are 2mr-row tiles.
	step := mr
	if pl.tile2 != nil {
		step = 2 * mr
	}
	mc := min(roundUp(ceilDiv(m, ceilDiv(m, pl.mcMax)), step), roundUp(pl.mcMax, step))
	// Slivers per task: at most colSlivers, and few enough that there
	// are minTask tasks per worker.
	cw := max(1, min(colSlivers, ceilDiv(ceilDiv(n, nr), minTask*workers)))
	perPanel := ceilDiv(blockN/nr, cw) // tasks of a whole column panel
	last := (n - 1) / blockN * blockN  // the last panel's first column
	nTasks := (last/blockN)*perPanel + ceilDiv(ceilDiv(n-last, nr), cw)
	nK := ceilDiv(k, blockK)
	apBuf := getBuf[T](mp * k)
	defer putBuf(apBuf)
	ap := *apBuf
	var bBufs []*[]T
	if pre == nil {
		bBufs = make([]*[]T, workers)
		defer func() {
			for _, b := range bBufs {
				if b != nil {
					putBuf(b)
				}
			}
		}()
	}
	// The first nK tasks pack op(A), one depth block each, into ap (the
	// block at pc holds mr-row slivers of kc values from ap[pc·mp:]); the
	// compute tasks after them wait until all are packed (tasks are
	// handed out in order, so every pack task is running by then).
	var packed atomic.Int64
	parallelForSide(nK+nTasks, workers, func(t, w int) {
		if t < nK {
			pc := t * blockK
			pl.packA(ap[pc*mp:], 0, m, pc, min(blockK, k-pc))
			packed.Add(1)
			return
		}
		t -= nK
		jc := (t / perPanel) * blockN
		nc := min(blockN, n-jc)
		s0 := (t % perPanel) * cw
		s1 := min(ceilDiv(nc, nr), s0+cw)
		j0 := jc + s0*nr
		var own []T
		if pre == nil {
			if bBufs[w] == nil {
				bBufs[w] = getBuf[T](cw * nr * min(k, blockK))
			}
			own = *bBufs[w]
		}
		for spins := 0; packed.Load() < int64(nK); spins++ {
			if spins&15 == 15 {
				runtime.Gosched()
			}
		}
		for pc := 0; pc < k; pc += blockK {
			kc := min(blockK, k-pc)
			var bs []T // slivers s0..s1-1 of the panel, nr×kc each
			if pre != nil {
				off := panelOffset(n, k, nr, jc, pc) + s0*nr*kc
				bs = pre[off : off+(s1-s0)*nr*kc]
			} else {
				pl.packB(own, j0, min(nc-s0*nr, (s1-s0)*nr), pc, kc, 0, s1-s0)
				bs = own[:(s1-s0)*nr*kc]
			}
			as := ap[pc*mp : pc*mp+mp*kc]
			for ic := 0; ic < m; ic += mc {
				pl.colBlock(kc, as[ic*kc:], bs, ic, min(mc, m-ic), j0)
			}
		}
	}, pl.side)
}

// colBlock runs the tiles of rows [i0, i0+mv) (A slivers from as, packed
// from row i0) against the B slivers bs (columns from j0), B sliver by B
// sliver (pairs of them with the 2mr×2nr tile), all row slivers for each.
func (pl *gemmPlan[T]) colBlock(kc int, as, bs []T, i0, mv, j0 int) {
	mr, nr := pl.mr, pl.nr
	ns := len(bs) / (nr * kc)
	for sl := 0; sl < ns; {
		j := j0 + sl*nr
		pair := pl.tile2 != nil && sl+1 < ns && j+2*nr <= pl.n
		for ir := 0; ir < mv; {
			a := as[ir*kc:]
			if pair && ir+2*mr <= mv {
				pl.tile2(kc, a[:2*mr*kc], bs[sl*nr*kc:(sl+2)*nr*kc], i0+ir, j)
				ir += 2 * mr
				continue
			}
			rows := min(mr, mv-ir)
			for h := 0; h < 1 || (pair && h < 2); h++ {
				jh := j + h*nr
				pl.tile(kc, a[:mr*kc], bs[(sl+h)*nr*kc:(sl+h+1)*nr*kc], i0+ir, jh, rows, min(nr, pl.n-jh))
			}
			ir += mr
		}
		if pair {
			sl += 2
		} else {
			sl++
		}
	}
}

// rowSliver runs the micro-tiles of the A sliver as (rows [i, i+mr))
// against B slivers [s0, s1) of the panel starting at column jc.
func (pl *gemmPlan[T]) rowSliver(kc int, as, panel []T, i, jc, pc, s0, s1 int) {
	mr, nr := pl.mr, pl.nr
	mv := min(mr, pl.m-i)
	for sl := s0; sl < s1; sl++ {
		j := jc + sl*nr
		if pl.lowerC && j > i+mv-1 {
			break // the rest of the row block is above the diagonal
		}
		if pl.skipTile(i, mv, j, pc, kc) {
			continue
		}
		nv := min(nr, pl.n-j)
		bs := panel[sl*nr*kc : (sl+1)*nr*kc]
		if p0, p1 := pl.span(i, mv, j, nv, pc, kc); p1-p0 < kc {
			pl.tile(p1-p0, as[p0*mr:p1*mr], bs[p0*nr:p1*nr], i, j, mv, nv)
			continue
		}
		pl.tile(kc, as, bs, i, j, mv, nv)
	}
}

// rowPair is rowSliver for two consecutive whole A slivers as (rows [i,
// i+2mr)): pairs of B slivers whose four mr×nr tiles are all whole, below
// the diagonal and not skipped go to tile2 in one call; every other
// column sliver gets the two tiles rowSliver would give it.
func (pl *gemmPlan[T]) rowPair(kc int, as, panel []T, i, jc, pc, s0, s1 int) {
	mr, nr := pl.mr, pl.nr
	lo, hi := as[:mr*kc], as[mr*kc:]
	for sl := s0; sl < s1; {
		j := jc + sl*nr
		if pl.lowerC && j > i+2*mr-1 {
			return // the rest of both row slivers is above the diagonal
		}
		if sl+1 < s1 && j+2*nr <= pl.n && (!pl.lowerC || i >= j+2*nr-1) &&
			!pl.skipTile(i, mr, j, pc, kc) && !pl.skipTile(i+mr, mr, j, pc, kc) &&
			!pl.skipTile(i, mr, j+nr, pc, kc) && !pl.skipTile(i+mr, mr, j+nr, pc, kc) {
			pl.tile2(kc, as, panel[sl*nr*kc:(sl+2)*nr*kc], i, j)
			sl += 2
			continue
		}
		bs := panel[sl*nr*kc : (sl+1)*nr*kc]
		nv := min(nr, pl.n-j)
		for h, a := range [2][]T{lo, hi} {
			ih := i + h*mr
			if pl.lowerC && j > ih+mr-1 {
				continue
			}
			if !pl.skipTile(ih, mr, j, pc, kc) {
				pl.tile(kc, a, bs, ih, j, mr, nv)
			}
		}
		sl++
	}
}

// checkMatrix panics unless data holds a rows×cols row-major matrix with
// leading dimension ld.
func checkMatrix(fn, name string, rows, cols, ld, n int) {
	if rows < 0 || cols < 0 {
		panic(fmt.Sprintf("kernels: %s: negative dimension of %s (%d×%d)", fn, name, rows, cols))
	}
	if ld < max(1, cols) {
		panic(fmt.Sprintf("kernels: %s: leading dimension %d of %s is below its %d columns", fn, ld, name, cols))
	}
	if rows > 0 && cols > 0 && n < (rows-1)*ld+cols {
		panic(fmt.Sprintf("kernels: %s: %s has %d elements, a %d×%d matrix with leading dimension %d needs %d",
			fn, name, n, rows, cols, ld, (rows-1)*ld+cols))
	}
}

func checkGemm(fn string, transA, transB bool, m, n, k, lda, ldb, ldc, na, nb, nc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("kernels: %s: negative dimension m=%d n=%d k=%d", fn, m, n, k))
	}
	if transA {
		checkMatrix(fn, "A", k, m, lda, na)
	} else {
		checkMatrix(fn, "A", m, k, lda, na)
	}
	if transB {
		checkMatrix(fn, "B", n, k, ldb, nb)
	} else {
		checkMatrix(fn, "B", k, n, ldb, nb)
	}
	checkMatrix(fn, "C", m, n, ldc, nc)
}

// scaleC applies C = beta·C to an m×n matrix (beta 0 sets C to zero, so a
// NaN in C does not survive; beta 1 leaves C untouched).
func scaleC[T float32 | float64](m, n int, beta T, c []T, ldc int, lower bool) {
	if beta == 1 {
		return
	}
	for i := 0; i < m; i++ {
		w := n
		if lower {
			w = min(n, i+1)
		}
		row := c[i*ldc : i*ldc+w]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// negZeroTile32 and negZeroTile64 are scratch tiles of -0, copied before
// use: adding an accumulator to -0 returns the accumulator bit for bit, so
// partial tiles flushed through a scratch tile get exactly what a direct
// flush would give.
var (
	negZeroTile32 [sMR * sNR]float32
	negZeroTile64 [dMR * dNR]float64
)

func init() {
	for i := range negZeroTile32 {
		negZeroTile32[i] = negZero32
	}
	for i := range negZeroTile64 {
		negZeroTile64[i] = negZero64
	}
}
