package kernels

import "math"

// Micro-tile shapes. The float32 kernel computes a 6×16 tile (twelve
// 8-lane YMM accumulators), the float64 kernel a 6×8 tile.
const (
	sMR = 6
	sNR = 16
	dMR = 6
	dNR = 8
)

// fma32 returns a·b+c rounded once to float32 (round to nearest, ties to
// even), exactly as the VFMADD instructions do for finite results.
//
// The product of two float32 values is exact in float64 (48 significant
// bits), so s = p + c is the exact sum rounded once to float64. Rounding s
// again to float32 gives the correctly rounded result unless that second
// rounding meets a tie that the first rounding created: double rounding
// can only go wrong when s lies exactly half-way between two adjacent
// float32 values while the exact sum does not. Round to nearest is
// monotonic, so if s is not such a midpoint, s and the exact sum lie
// strictly on the same side of every midpoint and both round to the same
// float32. A concrete failure of the naive float32(math.FMA(...)) is
// a·b = 1+2⁻²⁴ (a = 24929·2⁻¹⁵, b = 673·2⁻⁹, since 2²⁴+1 = 24929·673)
// with c = 2⁻⁸⁰: the exact sum is just above the midpoint and rounds up
// to 1+2⁻²³, but float64 rounding lands on the midpoint and the tie then
// goes to the even neighbour 1. The tests pin this case.
//
// In the rare midpoint case (and outside the normal float32 range, where
// the midpoint test by bit pattern does not apply) the rounding error of
// s is recovered exactly with TwoSum and s is replaced by its round-to-odd
// counterpart; rounding a round-to-odd result with at least two extra bits
// of precision to float32 is correct (Boldo and Melquiond, "When double
// rounding is odd", 2005), and 53 ≥ 24+2.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b) // exact
	cc := float64(c)
	s := p + cc
	bits := math.Float64bits(s)
	e := (bits >> 52) & 0x7ff
	// Normal float32 range: biased float64 exponents 1023-126 .. 1023+127.
	// A float32 midpoint there has its 29 low mantissa bits equal to
	// 1 followed by 28 zeros.
	if e >= 1023-126 && e <= 1023+127 && bits&0x1fffffff != 0x10000000 {
		return float32(s)
	}
	return fma32Slow(p, cc, s)
}

// fma32Slow rounds the exact p+cc (s is its float64 rounding) to float32
// through round-to-odd.
func fma32Slow(p, cc, s float64) float32 {
	if math.IsInf(s, 0) || math.IsNaN(s) || s == 0 {
		return float32(s)
	}
	// TwoSum: err = (p + cc) - s exactly.
	pp := s - cc
	cp := s - pp
	err := (p - pp) + (cc - cp)
	if err == 0 {
		return float32(s)
	}
	bits := math.Float64bits(s)
	if bits&1 == 0 {
		// Move one ulp towards the exact value: the neighbour with an
		// odd last bit.
		if (err > 0) == (s > 0) {
			bits++
		} else {
			bits--
		}
		s = math.Float64frombits(bits)
	}
	return float32(s)
}

// sgemmKernGo is the portable twin of the AVX2 float32 micro-kernel: for
// the 6×16 tile, acc[i][j] starts at +0 and takes fma32(a[p][i], b[p][j],
// acc) for p = 0..kc-1; then c[i*ldc+j] += acc[i][j] in float32.
func sgemmKernGo(kc int, a, b, c []float32, ldc int) {
	var acc [sMR * sNR]float32
	sgemmAccGo(kc, a, b, &acc)
	for i := 0; i < sMR; i++ {
		row := c[i*ldc : i*ldc+sNR]
		for j := range row {
			row[j] += acc[i*sNR+j]
		}
	}
}

// sgemmKern64Go is the portable twin of the float32 micro-kernel that
// flushes into float64: c[i*ldc+j] += float64(acc[i][j]).
func sgemmKern64Go(kc int, a, b []float32, c []float64, ldc int) {
	var acc [sMR * sNR]float32
	sgemmAccGo(kc, a, b, &acc)
	for i := 0; i < sMR; i++ {
		row := c[i*ldc : i*ldc+sNR]
		for j := range row {
			row[j] += float64(acc[i*sNR+j])
		}
	}
}

// sgemmKern12Go is the twin of the 12×32 kernels: the four 6×16 tiles
// of A slivers a[:kc·sMR], a[kc·sMR:] and B slivers b[:kc·sNR],
// b[kc·sNR:], each by sgemmKernGo.
func sgemmKern12Go(kc int, a, b, c []float32, ldc int) {
	for h := 0; h < 2; h++ {
		for v := 0; v < 2; v++ {
			sgemmKernGo(kc, a[h*kc*sMR:(h+1)*kc*sMR], b[v*kc*sNR:(v+1)*kc*sNR], c[h*sMR*ldc+v*sNR:], ldc)
		}
	}
}

// sgemmKern12to64Go is sgemmKern12Go flushing into float64.
func sgemmKern12to64Go(kc int, a, b []float32, c []float64, ldc int) {
	for h := 0; h < 2; h++ {
		for v := 0; v < 2; v++ {
			sgemmKern64Go(kc, a[h*kc*sMR:(h+1)*kc*sMR], b[v*kc*sNR:(v+1)*kc*sNR], c[h*sMR*ldc+v*sNR:], ldc)
		}
	}
}

func sgemmAccGo(kc int, a, b []float32, acc *[sMR * sNR]float32) {
	a = a[:kc*sMR]
	b = b[:kc*sNR]
	for p := 0; p < kc; p++ {
		ap := a[p*sMR : p*sMR+sMR]
		bp := b[p*sNR : p*sNR+sNR]
		for i, av := range ap {
			row := acc[i*sNR : i*sNR+sNR]
			for j, bv := range bp {
				row[j] = fma32(av, bv, row[j])
			}
		}
	}
}

// dgemmKernGo is the portable twin of the AVX2 float64 micro-kernel (6×8
// tile, math.FMA chains from +0, then c += acc).
func dgemmKernGo(kc int, a, b, c []float64, ldc int) {
	var acc [dMR * dNR]float64
	a = a[:kc*dMR]
	b = b[:kc*dNR]
	for p := 0; p < kc; p++ {
		ap := a[p*dMR : p*dMR+dMR]
		bp := b[p*dNR : p*dNR+dNR]
		for i, av := range ap {
			row := acc[i*dNR : i*dNR+dNR]
			for j, bv := range bp {
				row[j] = math.FMA(av, bv, row[j])
			}
		}
	}
	for i := 0; i < dMR; i++ {
		row := c[i*ldc : i*ldc+dNR]
		for j := range row {
			row[j] += acc[i*dNR+j]
		}
	}
}

// fmaLoop32Go runs n iterations of 12 independent scalar fma32 chains and
// returns the number of floating-point operations performed.
func fmaLoop32Go(n int) float64 {
	var x [12]float32
	for i := 0; i < n; i++ {
		for j := range x {
			x[j] = fma32(0.5, x[j], 0.25)
		}
	}
	sink32 = x[0]
	return float64(n) * 12 * 2
}

// fmaLoop64Go is fmaLoop32Go with math.FMA on float64.
func fmaLoop64Go(n int) float64 {
	var x [12]float64
	for i := 0; i < n; i++ {
		for j := range x {
			x[j] = math.FMA(0.5, x[j], 0.25)
		}
	}
	sink64 = x[0]
	return float64(n) * 12 * 2
}

var (
	sink32 float32
	sink64 float64
)

// dot8Go returns the eight partial sums s[k] = Σ_{i ≡ k (mod 8)} x[i]·y[i],
// each in increasing i, every product rounded before its addition; len(x)
// is a multiple of 8. It is the twin of the assembly dot product.
func dot8Go[T float32 | float64](x, y []T) (s [8]T) {
	y = y[:len(x)]
	for i := 0; i+8 <= len(x); i += 8 {
		for k := 0; k < 8; k++ {
			s[k] += T(x[i+k] * y[i+k])
		}
	}
	return s
}

// dotRowsGo is the twin of the batched dot products: s[8r:8r+8] =
// dot8Go(row r of x[:n8], y[:n8]) for r < rows.
func dotRowsGo[T float32 | float64](x []T, ldx int, y []T, n8, rows int, s []T) {
	for r := 0; r < rows; r++ {
		p := dot8Go(x[r*ldx:r*ldx+n8], y[:n8])
		copy(s[8*r:8*r+8], p[:])
	}
}

// axpyTriGo is the twin of the batched triangular axpy: for k = 0..m-1,
// acc[x] += T(c[k]·a[k·lda+x]) for x ≤ k, each product rounded before the
// addition.
func axpyTriGo[T float32 | float64](c, a []T, lda int, acc []T, m int) {
	for k := 0; k < m; k++ {
		ck := c[k]
		row := a[k*lda : k*lda+k+1]
		dst := acc[:k+1]
		for x, v := range row {
			dst[x] += T(ck * v)
		}
	}
}
