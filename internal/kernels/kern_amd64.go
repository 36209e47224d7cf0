//go:build amd64 && !purego

package kernels

import (
	"os"
	"unsafe"

	"github.com/ttquant/ttquant/internal/cpu"
)

//go:noescape
func sgemmKernAVX2(kc int, a, b, c *float32, ldc int)

//go:noescape
func sgemmKern64AVX2(kc int, a, b *float32, c *float64, ldc int)

//go:noescape
func dgemmKernAVX2(kc int, a, b, c *float64, ldc int)

func fmaLoop32AVX2(n int)
func fmaLoop64AVX2(n int)

//go:noescape
func sgemmKernAVX512(kc int, a, b, c *float32, ldc int)

//go:noescape
func sgemmKern64AVX512(kc int, a, b *float32, c *float64, ldc int)

//go:noescape
func dgemmKernAVX512(kc int, a, b, c *float64, ldc int)

//go:noescape
func sgemmKern12AVX512(kc int, a, b, c *float32, ldc int)

//go:noescape
func sgemmKern12to64AVX512(kc int, a, b *float32, c *float64, ldc int)

//go:noescape
func transpose8AVX2(n int, src *float32, lds int, dst *float32, ldd int)

// transpose8 sets dst[p*ldd+r] = src[r*lds+p] for r < 8 and p below the
// largest multiple of 8 not above n, which it returns (0 without AVX2):
// the caller's loop interleaves the rest, as it does in the portable build.
func transpose8(n int, src []float32, lds int, dst []float32, ldd int) int {
	n8 := n &^ 7
	if !useAsm || n8 == 0 {
		return 0
	}
	_ = src[7*lds+n8-1]
	_ = dst[(n8-1)*ldd+7]
	transpose8AVX2(n8, unsafe.SliceData(src), lds, unsafe.SliceData(dst), ldd)
	return n8
}

// useAsm selects the AVX2/FMA micro-kernels. It is fixed at start-up by
// CPU feature detection.
var useAsm = cpu.AVX2 && cpu.FMA

// noAVX512Env names the environment variable that, when set to a
// non-empty value, keeps the kernels on AVX2 on a processor with AVX-512.
const noAVX512Env = "TTQUANT_NO_AVX512"

// useAVX512 selects the AVX-512F forms of the three product micro-kernels
// (bit-identical to the AVX2 ones). Fixed at start-up: AVX-512F with the
// ZMM state enabled, unless TTQUANT_NO_AVX512 is set.
var useAVX512 = useAsm && cpu.AVX512F && os.Getenv(noAVX512Env) == ""

// useTile12 selects the 12×32 tiles (sgemmKern12, sgemmKern12to64) for
// the whole tiles of float32 products: with AVX-512 only, where the 6×16
// tile leaves too few independent accumulators.
var useTile12 = useAVX512

// implName names the micro-kernels in use.
func implName() string {
	switch {
	case useAVX512:
		return "avx512f"
	case useAsm:
		return "avx2-fma"
	}
	return "go"
}

// The three micro-kernels below check the slice extents the assembly will
// touch, then hand raw pointers to it. Callers guarantee kc >= 0, a holds
// kc*mr values, b holds kc*nr values and c covers the whole tile.

func sgemmKern(kc int, a, b, c []float32, ldc int) {
	if !useAsm {
		sgemmKernGo(kc, a, b, c, ldc)
		return
	}
	if kc > 0 {
		_ = a[kc*sMR-1]
		_ = b[kc*sNR-1]
	}
	_ = c[(sMR-1)*ldc+sNR-1]
	if useAVX512 {
		sgemmKernAVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
		return
	}
	sgemmKernAVX2(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
}

func sgemmKern64(kc int, a, b []float32, c []float64, ldc int) {
	if !useAsm {
		sgemmKern64Go(kc, a, b, c, ldc)
		return
	}
	if kc > 0 {
		_ = a[kc*sMR-1]
		_ = b[kc*sNR-1]
	}
	_ = c[(sMR-1)*ldc+sNR-1]
	if useAVX512 {
		sgemmKern64AVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
		return
	}
	sgemmKern64AVX2(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
}

// sgemmKern12 computes the 12×32 tile of two 6-row A slivers (a holds
// 2·kc·sMR values) and two 16-column B slivers (b holds 2·kc·sNR): the
// four sgemmKern calls in one, with the same bits.
func sgemmKern12(kc int, a, b, c []float32, ldc int) {
	if !useTile12 {
		sgemmKern12Go(kc, a, b, c, ldc)
		return
	}
	if kc > 0 {
		_ = a[2*kc*sMR-1]
		_ = b[2*kc*sNR-1]
	}
	_ = c[(2*sMR-1)*ldc+2*sNR-1]
	sgemmKern12AVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
}

// sgemmKern12to64 is sgemmKern12 flushing into float64 (the four
// sgemmKern64 calls in one).
func sgemmKern12to64(kc int, a, b []float32, c []float64, ldc int) {
	if !useTile12 {
		sgemmKern12to64Go(kc, a, b, c, ldc)
		return
	}
	if kc > 0 {
		_ = a[2*kc*sMR-1]
		_ = b[2*kc*sNR-1]
	}
	_ = c[(2*sMR-1)*ldc+2*sNR-1]
	sgemmKern12to64AVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
}

func dgemmKern(kc int, a, b, c []float64, ldc int) {
	if !useAsm {
		dgemmKernGo(kc, a, b, c, ldc)
		return
	}
	if kc > 0 {
		_ = a[kc*dMR-1]
		_ = b[kc*dNR-1]
	}
	_ = c[(dMR-1)*ldc+dNR-1]
	if useAVX512 {
		dgemmKernAVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
		return
	}
	dgemmKernAVX2(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
}

func fmaLoop32AVX512(n int)
func fmaLoop64AVX512(n int)

// fmaLoop32 runs n iterations of 12 independent float32 FMAs of the
// widest vectors the product kernels use (8 lanes with AVX2, 16 with
// AVX-512) and returns the number of floating-point operations performed.
func fmaLoop32(n int) float64 {
	switch {
	case useAVX512:
		fmaLoop32AVX512(n)
		return float64(n) * 12 * 16 * 2
	case useAsm:
		fmaLoop32AVX2(n)
		return float64(n) * 12 * 8 * 2
	}
	return fmaLoop32Go(n)
}

// fmaLoop64 is fmaLoop32 for float64 FMAs (4 or 8 lanes).
func fmaLoop64(n int) float64 {
	switch {
	case useAVX512:
		fmaLoop64AVX512(n)
		return float64(n) * 12 * 8 * 2
	case useAsm:
		fmaLoop64AVX2(n)
		return float64(n) * 12 * 4 * 2
	}
	return fmaLoop64Go(n)
}

//go:noescape
func axpyAVX2(c float64, x, y *float64, n int)

//go:noescape
func dotAVX2(x, y *float64, n int, s *[8]float64)

// axpy64 computes y[i] += float64(c*x[i]) (no fusion) for i < len(x).
func axpy64(c float64, x, y []float64) {
	y = y[:len(x)]
	n4 := len(x) &^ 3
	if useAsm && n4 > 0 {
		axpyAVX2(c, unsafe.SliceData(x), unsafe.SliceData(y), n4)
	} else {
		n4 = 0
	}
	for i := n4; i < len(x); i++ {
		y[i] += float64(c * x[i])
	}
}

// dot8x64 returns the eight partial sums of dot8 over the first
// len(x)&^7 elements.
func dot8x64(x, y []float64) (s [8]float64) {
	n8 := len(x) &^ 7
	if n8 == 0 {
		return s
	}
	y = y[:len(x)]
	if useAsm {
		dotAVX2(unsafe.SliceData(x), unsafe.SliceData(y), n8, &s)
		return s
	}
	return dot8Go(x[:n8], y[:n8])
}

//go:noescape
func axpy32AVX2(c float32, x, y *float32, n int)

//go:noescape
func dot32AVX2(x, y *float32, n int, s *[8]float32)

// axpy32 computes y[i] += float32(c*x[i]) (no fusion) for i < len(x).
func axpy32(c float32, x, y []float32) {
	y = y[:len(x)]
	n8 := len(x) &^ 7
	if useAsm && n8 > 0 {
		axpy32AVX2(c, unsafe.SliceData(x), unsafe.SliceData(y), n8)
	} else {
		n8 = 0
	}
	for i := n8; i < len(x); i++ {
		y[i] += float32(c * x[i])
	}
}

// dot8x32 returns the eight partial sums of dot8Go over the first
// len(x)&^7 elements.
func dot8x32(x, y []float32) (s [8]float32) {
	n8 := len(x) &^ 7
	if n8 == 0 {
		return s
	}
	y = y[:len(x)]
	if useAsm {
		dot32AVX2(unsafe.SliceData(x), unsafe.SliceData(y), n8, &s)
		return s
	}
	return dot8Go(x[:n8], y[:n8])
}

//go:noescape
func dotRows32AVX2(x *float32, ldx int, y *float32, n8, rows int, s *float32)

//go:noescape
func dotRows64AVX2(x *float64, ldx int, y *float64, n8, rows int, s *float64)

//go:noescape
func axpyTri32AVX2(c, a *float32, lda int, acc *float32, m int)

//go:noescape
func axpyTri64AVX2(c, a *float64, lda int, acc *float64, m int)

// dotRows stores in s[8r:8r+8] the eight partial sums of dot8 of row r of
// x (rows rows, leading dimension ldx, the first n8 elements, n8 a multiple
// of 8) with y, for r < rows: one call for what dot8x32/dot8x64 compute
// row by row, with the same bits.
func dotRows[T float32 | float64](x []T, ldx int, y []T, n8, rows int, s []T) {
	if rows == 0 {
		return
	}
	if !useAsm || n8 == 0 {
		dotRowsGo(x, ldx, y, n8, rows, s)
		return
	}
	_ = x[(rows-1)*ldx+n8-1]
	_ = y[n8-1]
	_ = s[rows*8-1]
	switch xs := any(x).(type) {
	case []float32:
		dotRows32AVX2(unsafe.SliceData(xs), ldx, unsafe.SliceData(any(y).([]float32)), n8, rows, unsafe.SliceData(any(s).([]float32)))
	case []float64:
		dotRows64AVX2(unsafe.SliceData(xs), ldx, unsafe.SliceData(any(y).([]float64)), n8, rows, unsafe.SliceData(any(s).([]float64)))
	}
}

// axpyTri runs, for k = 0..m-1 in order, axpy(c[k], a[k·lda : k·lda+k+1],
// acc[:k+1]) in one call, with the same bits.
func axpyTri[T float32 | float64](c, a []T, lda int, acc []T, m int) {
	if m == 0 {
		return
	}
	if !useAsm {
		axpyTriGo(c, a, lda, acc, m)
		return
	}
	_ = c[m-1]
	_ = a[(m-1)*lda+m-1]
	_ = acc[m-1]
	switch cs := any(c).(type) {
	case []float32:
		axpyTri32AVX2(unsafe.SliceData(cs), unsafe.SliceData(any(a).([]float32)), lda, unsafe.SliceData(any(acc).([]float32)), m)
	case []float64:
		axpyTri64AVX2(unsafe.SliceData(cs), unsafe.SliceData(any(a).([]float64)), lda, unsafe.SliceData(any(acc).([]float64)), m)
	}
}

//go:noescape
func bfpRound32AVX2(x, q *float32, exps *uint8, n int, p *[5]uint32) bool

//go:noescape
func bfpRoundGroups32AVX2(x, q *float32, n int, p *[5]uint32) bool

// bfpRound32 is bfpRound32Go, eight values at a time in assembly.
func bfpRound32(x, q []float32, exps []uint8, w uint32) bool {
	q = q[:len(x)]
	exps = exps[:len(x)]
	n8 := len(x) &^ 7
	ok := true
	if useAsm && n8 > 0 {
		p := bfpParams(w)
		ok = bfpRound32AVX2(unsafe.SliceData(x), unsafe.SliceData(q), unsafe.SliceData(exps), n8, &p)
	} else {
		n8 = 0
	}
	return bfpRound32Go(x[n8:], q[n8:], exps[n8:], w) && ok
}

// bfpRoundGroups32 is bfpRoundGroups32Go, a group of 16 at a time in
// assembly.
func bfpRoundGroups32(x, q []float32, w uint32) bool {
	if !useAsm || len(x) == 0 {
		return bfpRoundGroups32Go(x, q, w)
	}
	q = q[:len(x)]
	p := bfpParams(w)
	return bfpRoundGroups32AVX2(unsafe.SliceData(x), unsafe.SliceData(q), len(x), &p)
}

//go:noescape
func bfpErrAcc32AVX2(x *float32, exps *uint8, n8 int, p *[5]uint32, wt float64, cands int, a0, a1, a2 *float64)

// bfpErrAcc32 is bfpErrAcc32Go, eight groups at a time in assembly. With
// 16 values per group, up to 64 groups are transposed at a time (transpose8)
// so that row r of the block holds value r of each group, and the
// assembly adds the rows in order: the same sums in the same order.
func bfpErrAcc32(x []float32, exps []uint8, per int, w uint32, wt float64, acc [][]float64) {
	done := 0 // groups done in assembly
	if useAsm && (per == 1 || per == 16) {
		p := bfpParams(w)
		var a [BFPMaxCands]*float64
		call := func(x []float32, g0, n8 int) {
			for k := range a {
				a[k] = &acc[min(k, len(acc)-1)][g0]
			}
			bfpErrAcc32AVX2(unsafe.SliceData(x), &exps[g0], n8, &p, wt, len(acc), a[0], a[1], a[2])
		}
		if per == 1 {
			if done = len(x) &^ 7; done > 0 {
				call(x, 0, done)
			}
		} else {
			var buf [16 * 64]float32
			full := len(x) / 16 &^ 7
			for ; done < full; done += 64 {
				m := min(64, full-done)
				for b := 0; b < m; b += 8 {
					transpose8(16, x[(done+b)*16:], 16, buf[b:], m)
				}
				for r := range 16 {
					call(buf[r*m:(r+1)*m], done, m)
				}
			}
			done = full
		}
	}
	if done*per >= len(x) {
		return
	}
	var rest [BFPMaxCands][]float64
	for k, s := range acc {
		rest[k] = s[done:]
	}
	bfpErrAcc32Go(x[done*per:], exps[done:], per, w, wt, rest[:len(acc)])
}

// bfpParams is the parameter block of the assembly: w, s = 24−w,
// half = 2^(s−1)−1, maxq = 2^w−1, w−1.
func bfpParams(w uint32) [5]uint32 {
	s := 24 - w
	return [5]uint32{w, s, 1<<(s-1) - 1, 1<<w - 1, w - 1}
}

//go:noescape
func axpySubRows32AVX2(a *float32, m int, x *float32, n8 int, y *float32, ldy int)

// axpySubRows32 is axpySubRows32Go with the first len(x)&^7 columns in
// assembly.
func axpySubRows32(a, x, y []float32, ldy int) {
	n8 := len(x) &^ 7
	if !useAsm || n8 == 0 {
		axpySubRows32Go(a, x, y, ldy)
		return
	}
	axpySubRows32AVX2(unsafe.SliceData(a), len(a), unsafe.SliceData(x), n8, unsafe.SliceData(y), ldy)
	if n8 < len(x) {
		axpySubRows32Go(a, x[n8:], y[n8:], ldy)
	}
}

//go:noescape
func allFinite32AVX2(x *float32, n8 int) bool

// allFinite32 is allFinite32Go, eight values at a time in assembly.
func allFinite32(x []float32) bool {
	n8 := len(x) &^ 7
	if !useAsm || n8 == 0 {
		return allFinite32Go(x)
	}
	return allFinite32AVX2(unsafe.SliceData(x), n8) && allFinite32Go(x[n8:])
}

//go:noescape
func maxExponents32AVX2(x *float32, exp *uint8, n32 int)

//go:noescape
func quantErr32AVX2(x, q, e *float32, acc *float64, n8 int, d, d2 float32)

//go:noescape
func groupMaxExponents32AVX2(x *float32, exps *uint8, ng int)

// groupMaxExponents32 is groupMaxExponents32Go, the whole groups in
// assembly.
func groupMaxExponents32(x []float32, exps []uint8) {
	ng := len(x) / 16
	if useAsm && ng > 0 {
		groupMaxExponents32AVX2(unsafe.SliceData(x), unsafe.SliceData(exps), ng)
	} else {
		ng = 0
	}
	groupMaxExponents32Go(x[ng*16:], exps[ng:])
}

// maxExponents32 is maxExponents32Go, 32 values at a time in assembly.
func maxExponents32(x []float32, exp []uint8) {
	n32 := len(x) &^ 31
	if useAsm && n32 > 0 {
		maxExponents32AVX2(unsafe.SliceData(x), unsafe.SliceData(exp), n32)
	} else {
		n32 = 0
	}
	maxExponents32Go(x[n32:], exp[n32:])
}

// quantErr32 is quantErr32Go, eight values at a time in assembly.
func quantErr32(x, q, e []float32, acc []float64, d, d2 float32) {
	n8 := len(x) &^ 7
	if useAsm && n8 > 0 {
		quantErr32AVX2(unsafe.SliceData(x), unsafe.SliceData(q), unsafe.SliceData(e), unsafe.SliceData(acc), n8, d, d2)
	} else {
		n8 = 0
	}
	quantErr32Go(x[n8:], q[n8:], e[n8:], acc[n8:], d, d2)
}

//go:noescape
func dot64TileAVX2(k int, x *float64, pn *float64, acc *[dotMR * dotNR]float64)

// dot64Tile is dot64TileGo with the vector multiply and add of the
// assembly (the same two roundings per step, lanes over the panel's
// columns).
func dot64Tile(k int, x, pn []float64, acc *[dotMR * dotNR]float64) {
	if !useAsm || k == 0 {
		dot64TileGo(k, x, pn, acc)
		return
	}
	_ = x[dotMR*k-1]
	_ = pn[dotNR*k-1]
	dot64TileAVX2(k, unsafe.SliceData(x), unsafe.SliceData(pn), acc)
}
