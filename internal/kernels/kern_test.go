package kernels

import (
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
)

// fma32Big rounds a·b+c once to float32 using exact big-float arithmetic.
func fma32Big(a, b, c float32) float32 {
	x := new(big.Float).SetPrec(1200).SetFloat64(float64(a))
	y := new(big.Float).SetPrec(1200).SetFloat64(float64(b))
	z := new(big.Float).SetPrec(1200).SetFloat64(float64(c))
	x.Mul(x, y).Add(x, z)
	f, _ := x.Float32()
	return f
}

func TestFMA32DoubleRoundingCase(t *testing.T) {
	// 2^24+1 = 24929·673, so a·b = 1+2^-24 exactly: the midpoint between
	// 1 and 1+2^-23. With c = +2^-80 the exact sum is above the midpoint.
	a := float32(24929) / (1 << 15)
	b := float32(673) / (1 << 9)
	if float64(a)*float64(b) != 1+math.Ldexp(1, -24) {
		t.Fatalf("setup: a·b = %v", float64(a)*float64(b))
	}
	c := float32(math.Ldexp(1, -80))
	naive := float32(math.FMA(float64(a), float64(b), float64(c)))
	if naive != 1 {
		t.Fatalf("expected the naive double-rounded result to be 1, got %v", naive)
	}
	want := float32(1 + math.Ldexp(1, -23))
	cases := []struct{ a, b, c, want float32 }{
		{a, b, c, want}, {a, b, -c, 1}, {-a, b, c, -1}, {-a, b, -c, -want},
	}
	for _, tc := range cases {
		if got := fma32(tc.a, tc.b, tc.c); got != tc.want {
			t.Errorf("fma32(%v, %v, %v) = %v, want %v", tc.a, tc.b, tc.c, got, tc.want)
		}
		if got := fma32Big(tc.a, tc.b, tc.c); got != tc.want {
			t.Errorf("reference fma32Big(%v, %v, %v) = %v, want %v", tc.a, tc.b, tc.c, got, tc.want)
		}
	}
}

// randSpecial32 draws float32 values biased towards hard cases: random bit
// patterns (subnormals, huge and tiny exponents), exact small integers,
// values near powers of two.
func randSpecial32(r *rand.Rand) float32 {
	switch r.IntN(6) {
	case 0:
		for {
			v := math.Float32frombits(r.Uint32())
			if !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
				return v
			}
		}
	case 1:
		return float32(r.IntN(1<<12)-1<<11) * float32(math.Ldexp(1, r.IntN(40)-20))
	case 2:
		return float32(math.Ldexp(1+float64(r.IntN(4)-2)*math.Ldexp(1, -23), r.IntN(60)-30))
	case 3:
		return math.Float32frombits(r.Uint32() & 0x807fffff) // subnormal or zero
	default:
		return float32(r.NormFloat64())
	}
}

func TestFMA32MatchesExactRounding(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	n := 200000
	if testing.Short() {
		n = 20000
	}
	for i := 0; i < n; i++ {
		a, b, c := randSpecial32(r), randSpecial32(r), randSpecial32(r)
		if i%3 == 0 {
			// Put c near -a·b to force cancellation, or make a·b land on
			// a float32 midpoint.
			c = -float32(float64(a) * float64(b))
		}
		got, want := fma32(a, b, c), fma32Big(a, b, c)
		if math.Float32bits(got) != math.Float32bits(want) && !(got == 0 && want == 0) {
			t.Fatalf("fma32(%g, %g, %g) = %g (%#x), exact rounding %g (%#x)", a, b, c, got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
}

// TestFMA32Midpoints builds products that are exact float32 midpoints and
// adds tiny perturbations of both signs.
func TestFMA32Midpoints(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	found := 0
	for i := 0; i < 20000; i++ {
		// a·b with a 25-bit odd significand is a midpoint at 24 bits.
		x := uint64(1<<24 | r.Uint64N(1<<24) | 1)
		// factor x = p·q with both < 2^24 when possible: try small q.
		q := uint64(3 + 2*r.IntN(400))
		if x%q != 0 {
			continue
		}
		p := x / q
		if p >= 1<<24 {
			continue
		}
		found++
		a := float32(math.Ldexp(float64(p), -r.IntN(20)))
		b := float32(math.Ldexp(float64(q), -r.IntN(20)))
		for _, e := range []int{-30, -60, -90, -140} {
			for _, s := range []float64{1, -1} {
				c := float32(s * math.Ldexp(1, e+int(math.Ilogb(float64(a)*float64(b)))))
				if got, want := fma32(a, b, c), fma32Big(a, b, c); got != want {
					t.Fatalf("fma32(%g, %g, %g) = %g, exact rounding %g", a, b, c, got, want)
				}
			}
		}
	}
	if found < 100 {
		t.Fatalf("only %d midpoint products generated", found)
	}
}

func bitsEqual32(x, y float32) bool {
	return math.Float32bits(x) == math.Float32bits(y) || (x != x && y != y)
}

func bitsEqual64(x, y float64) bool {
	return math.Float64bits(x) == math.Float64bits(y) || (x != x && y != y)
}

// TestKernelTwins runs the dispatched micro-kernels (assembly when
// available) against the pure-Go twins on random and special data.
func TestKernelTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	t.Logf("micro-kernels: %s", implName())
	for trial := 0; trial < 300; trial++ {
		kc := r.IntN(40)
		if trial%50 == 0 {
			kc = 256
		}
		a := make([]float32, kc*sMR)
		b := make([]float32, kc*sNR)
		for i := range a {
			a[i] = randSpecial32(r)
		}
		for i := range b {
			b[i] = randSpecial32(r)
		}
		if trial%7 == 0 && kc > 0 {
			a[r.IntN(len(a))] = float32(math.Inf(1))
			b[r.IntN(len(b))] = float32(math.NaN())
		}
		ldc := sNR + r.IntN(5)
		c1 := make([]float32, sMR*ldc)
		for i := range c1 {
			c1[i] = randSpecial32(r)
		}
		c2 := append([]float32(nil), c1...)
		sgemmKern(kc, a, b, c1, ldc)
		sgemmKernGo(kc, a, b, c2, ldc)
		for i := range c1 {
			if !bitsEqual32(c1[i], c2[i]) {
				t.Fatalf("float32 kernel trial %d kc=%d element %d: %g vs Go twin %g", trial, kc, i, c1[i], c2[i])
			}
		}
		d1 := make([]float64, sMR*ldc)
		for i := range d1 {
			d1[i] = r.NormFloat64()
		}
		d2 := append([]float64(nil), d1...)
		sgemmKern64(kc, a, b, d1, ldc)
		sgemmKern64Go(kc, a, b, d2, ldc)
		for i := range d1 {
			if !bitsEqual64(d1[i], d2[i]) {
				t.Fatalf("float32→64 kernel trial %d element %d: %g vs Go twin %g", trial, i, d1[i], d2[i])
			}
		}
		da := make([]float64, kc*dMR)
		db := make([]float64, kc*dNR)
		for i := range da {
			da[i] = float64(randSpecial32(r)) * (1 + r.Float64())
		}
		for i := range db {
			db[i] = r.NormFloat64() * math.Ldexp(1, r.IntN(200)-100)
		}
		ldd := dNR + r.IntN(3)
		e1 := make([]float64, dMR*ldd)
		for i := range e1 {
			e1[i] = r.NormFloat64()
		}
		e2 := append([]float64(nil), e1...)
		dgemmKern(kc, da, db, e1, ldd)
		dgemmKernGo(kc, da, db, e2, ldd)
		for i := range e1 {
			if !bitsEqual64(e1[i], e2[i]) {
				t.Fatalf("float64 kernel trial %d element %d: %g vs Go twin %g", trial, i, e1[i], e2[i])
			}
		}
	}
}

// TestKernelFMAExactness uses kc = 2 so that the kernel computes
// fma(a1, b1, a0·b0) with a0·b0 chosen to be an exact float32 c: the
// assembly must agree with exact rounding on the double-rounding traps.
func TestKernelFMAExactness(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	a := make([]float32, 2*sMR)
	b := make([]float32, 2*sNR)
	c := make([]float32, sMR*sNR)
	x := float32(24929) / (1 << 15)
	y := float32(673) / (1 << 9)
	for trial := 0; trial < 200; trial++ {
		var want [sMR * sNR]float32
		for i := 0; i < sMR; i++ {
			a[i] = 1 // p = 0: c0 = 1·b0
			a[sMR+i] = x
			if trial > 0 {
				a[sMR+i] = randSpecial32(r)
			}
		}
		for j := 0; j < sNR; j++ {
			b[j] = float32(math.Ldexp(1, -80+r.IntN(60))) * float32(1-2*r.IntN(2))
			b[sNR+j] = y
			if trial > 0 {
				b[sNR+j] = randSpecial32(r)
			}
		}
		for i := 0; i < sMR; i++ {
			for j := 0; j < sNR; j++ {
				want[i*sNR+j] = fma32Big(a[sMR+i], b[sNR+j], b[j])
			}
		}
		for i := range c {
			c[i] = negZero32
		}
		sgemmKern(2, a, b, c, sNR)
		for i := range c {
			if !bitsEqual32(c[i], want[i]) && !(c[i] == 0 && want[i] == 0) {
				t.Fatalf("trial %d element %d: kernel %g, exact %g", trial, i, c[i], want[i])
			}
		}
	}
}

// FuzzFMA32 checks the portable float32 FMA against exact rounding on
// arbitrary bit patterns (the seeds include the double-rounding trap).
func FuzzFMA32(f *testing.F) {
	f.Add(math.Float32bits(float32(24929)/(1<<15)), math.Float32bits(float32(673)/(1<<9)), math.Float32bits(float32(math.Ldexp(1, -80))))
	f.Add(uint32(0x00000001), uint32(0x3f800000), uint32(0x80000001))
	f.Add(uint32(0x7f7fffff), uint32(0x3f800001), uint32(0xff7fffff))
	f.Add(uint32(0x00800000), uint32(0x3f000000), uint32(0x00000001))
	f.Fuzz(func(t *testing.T, ab, bb, cb uint32) {
		a, b, c := math.Float32frombits(ab), math.Float32frombits(bb), math.Float32frombits(cb)
		for _, v := range []float32{a, b, c} {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return
			}
		}
		got, want := fma32(a, b, c), fma32Big(a, b, c)
		if !bitsEqual32(got, want) && !(got == 0 && want == 0) {
			t.Fatalf("fma32(%g, %g, %g) = %g, exact rounding %g", a, b, c, got, want)
		}
	})
}

// TestVectorTwins checks the float64 dot-product and axpy helpers of the
// factorizations against their Go twins for all small lengths.
func TestVectorTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for n := 0; n < 70; n++ {
		x, y := randMat64(r, n), randMat64(r, n)
		for i := range x {
			x[i] *= math.Ldexp(1, r.IntN(80)-40)
		}
		got := dot8x64(x, y)
		want := dot8Go(x[:n&^7], y[:n&^7])
		for k := range got {
			if !bitsEqual64(got[k], want[k]) {
				t.Fatalf("n=%d: dot partial %d = %g, Go twin %g", n, k, got[k], want[k])
			}
		}
		x32, y32 := to32(x), to32(y)
		g32 := dot8x32(x32, y32)
		w32 := dot8Go(x32[:n&^7], y32[:n&^7])
		for k := range g32 {
			if !bitsEqual32(g32[k], w32[k]) {
				t.Fatalf("n=%d: float32 dot partial %d = %g, Go twin %g", n, k, g32[k], w32[k])
			}
		}
		c32 := float32(r.NormFloat64())
		z32 := append([]float32(nil), y32...)
		axpy32(c32, x32, z32)
		for i := range y32 {
			if w := y32[i] + float32(c32*x32[i]); !bitsEqual32(z32[i], w) {
				t.Fatalf("n=%d: float32 axpy[%d] = %g, want %g", n, i, z32[i], w)
			}
		}
		c := r.NormFloat64()
		y1 := append([]float64(nil), y...)
		axpy64(c, x, y1)
		for i := range y {
			if w := y[i] + float64(c*x[i]); !bitsEqual64(y1[i], w) {
				t.Fatalf("n=%d: axpy[%d] = %g, want %g", n, i, y1[i], w)
			}
		}
	}
}

// TestBatchedVectorTwins checks the batched dot products and triangular
// axpy of the factorizations' diagonal blocks against the row-by-row
// operations they replace (dot8x32/dot8x64 and axpy32/axpy64), bit for
// bit, and against the pure-Go twins, on every length class of the
// vector loops and their scalar tails.
func TestBatchedVectorTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, n := range []int{1, 2, 7, 8, 9, 15, 16, 17, 33, 96, 101} {
		ld := n + 3
		a32, a64 := make([]float32, n*ld), make([]float64, n*ld)
		for i := range a32 {
			a32[i] = float32(r.NormFloat64())
			a64[i] = r.NormFloat64()
		}
		y32, y64 := a32[(n-1)*ld:(n-1)*ld+n], a64[(n-1)*ld:(n-1)*ld+n]
		for _, n8 := range []int{0, n &^ 7} {
			s32, g32 := make([]float32, 8*n), make([]float32, 8*n)
			s64, g64 := make([]float64, 8*n), make([]float64, 8*n)
			dotRows(a32, ld, y32, n8, n, s32)
			dotRowsGo(a32, ld, y32, n8, n, g32)
			dotRows(a64, ld, y64, n8, n, s64)
			dotRowsGo(a64, ld, y64, n8, n, g64)
			for row := 0; row < n; row++ {
				w32 := dot8x32(a32[row*ld:row*ld+n8], y32[:n8])
				w64 := dot8x64(a64[row*ld:row*ld+n8], y64[:n8])
				for k := 0; k < 8; k++ {
					if !bitsEqual32(s32[8*row+k], w32[k]) || !bitsEqual32(g32[8*row+k], w32[k]) {
						t.Fatalf("dotRows32 n=%d n8=%d row %d lane %d: %v / %v, want %v", n, n8, row, k, s32[8*row+k], g32[8*row+k], w32[k])
					}
					if !bitsEqual64(s64[8*row+k], w64[k]) || !bitsEqual64(g64[8*row+k], w64[k]) {
						t.Fatalf("dotRows64 n=%d n8=%d row %d lane %d: %v / %v, want %v", n, n8, row, k, s64[8*row+k], g64[8*row+k], w64[k])
					}
				}
			}
		}
		c32, c64 := y32, y64
		acc32, want32, go32 := make([]float32, n), make([]float32, n), make([]float32, n)
		acc64, want64, go64 := make([]float64, n), make([]float64, n), make([]float64, n)
		axpyTri(c32, a32, ld, acc32, n)
		axpyTriGo(c32, a32, ld, go32, n)
		axpyTri(c64, a64, ld, acc64, n)
		axpyTriGo(c64, a64, ld, go64, n)
		for k := 0; k < n; k++ {
			axpy32(c32[k], a32[k*ld:k*ld+k+1], want32[:k+1])
			axpy64(c64[k], a64[k*ld:k*ld+k+1], want64[:k+1])
		}
		for x := 0; x < n; x++ {
			if !bitsEqual32(acc32[x], want32[x]) || !bitsEqual32(go32[x], want32[x]) {
				t.Fatalf("axpyTri32 n=%d [%d]: %v / %v, want %v", n, x, acc32[x], go32[x], want32[x])
			}
			if !bitsEqual64(acc64[x], want64[x]) || !bitsEqual64(go64[x], want64[x]) {
				t.Fatalf("axpyTri64 n=%d [%d]: %v / %v, want %v", n, x, acc64[x], go64[x], want64[x])
			}
		}
	}
}

// TestAVX512KernelTwins runs the AVX-512 micro-kernels, where the
// processor has them, against the AVX2 ones and the Go twins on random
// tiles with special values: all three must agree bit for bit. Elsewhere
// (no AVX-512F, the purego tag, another architecture) it is skipped; the
// Go twin still defines the result and TestKernelTwins checks the
// dispatching kernels against it.
func TestAVX512KernelTwins(t *testing.T) {
	if !kernelVariants.avx512 {
		t.Skipf("no AVX-512 micro-kernels on this processor/build (%s)", implName())
	}
	r := rand.New(rand.NewPCG(71, 72))
	for trial := 0; trial < 300; trial++ {
		kc := r.IntN(40)
		if trial%50 == 0 {
			kc = 256
		}
		a, b := make([]float32, kc*sMR), make([]float32, kc*sNR)
		for i := range a {
			a[i] = randSpecial32(r)
		}
		for i := range b {
			b[i] = randSpecial32(r)
		}
		ldc := sNR + r.IntN(5)
		c := make([]float32, sMR*ldc)
		for i := range c {
			c[i] = randSpecial32(r)
		}
		c2, c5 := slices.Clone(c), slices.Clone(c)
		kernelVariants.s2(kc, a, b, c2, ldc)
		kernelVariants.s5(kc, a, b, c5, ldc)
		sgemmKernGo(kc, a, b, c, ldc)
		for i := range c {
			if !bitsEqual32(c5[i], c[i]) || !bitsEqual32(c2[i], c[i]) {
				t.Fatalf("float32 trial %d element %d: avx512 %g avx2 %g go %g", trial, i, c5[i], c2[i], c[i])
			}
		}
		d := make([]float64, sMR*ldc)
		for i := range d {
			d[i] = r.NormFloat64()
		}
		d2, d5 := slices.Clone(d), slices.Clone(d)
		kernelVariants.s64x2(kc, a, b, d2, ldc)
		kernelVariants.s64x5(kc, a, b, d5, ldc)
		sgemmKern64Go(kc, a, b, d, ldc)
		for i := range d {
			if !bitsEqual64(d5[i], d[i]) || !bitsEqual64(d2[i], d[i]) {
				t.Fatalf("float32→64 trial %d element %d: avx512 %g avx2 %g go %g", trial, i, d5[i], d2[i], d[i])
			}
		}
		da, db := make([]float64, kc*dMR), make([]float64, kc*dNR)
		for i := range da {
			da[i] = float64(randSpecial32(r)) * (1 + r.Float64())
		}
		for i := range db {
			db[i] = r.NormFloat64() * math.Ldexp(1, r.IntN(200)-100)
		}
		ldd := dNR + r.IntN(3)
		e := make([]float64, dMR*ldd)
		for i := range e {
			e[i] = r.NormFloat64()
		}
		e2, e5 := slices.Clone(e), slices.Clone(e)
		kernelVariants.d2(kc, da, db, e2, ldd)
		kernelVariants.d5(kc, da, db, e5, ldd)
		dgemmKernGo(kc, da, db, e, ldd)
		for i := range e {
			if !bitsEqual64(e5[i], e[i]) || !bitsEqual64(e2[i], e[i]) {
				t.Fatalf("float64 trial %d element %d: avx512 %g avx2 %g go %g", trial, i, e5[i], e2[i], e[i])
			}
		}
	}
}

// TestAVX512Tile12Twins compares the 12×32 AVX-512 kernels with their Go
// twins (four 6×16 tiles of sgemmKernGo / sgemmKern64Go) on random and
// special values, inner lengths up to 256, several strides of C. Skipped
// where the AVX-512 kernels do not exist.
func TestAVX512Tile12Twins(t *testing.T) {
	if !kernelVariants.avx512 {
		t.Skipf("no AVX-512 micro-kernels on this processor/build (%s)", implName())
	}
	r := rand.New(rand.NewPCG(73, 74))
	for trial := 0; trial < 300; trial++ {
		kc := r.IntN(40)
		if trial%50 == 0 {
			kc = 256
		}
		a, b := make([]float32, 2*kc*sMR), make([]float32, 2*kc*sNR)
		for i := range a {
			a[i] = randSpecial32(r)
		}
		for i := range b {
			b[i] = randSpecial32(r)
		}
		if trial%7 == 0 && kc > 0 {
			a[r.IntN(len(a))] = float32(math.Inf(-1))
			b[r.IntN(len(b))] = float32(math.NaN())
		}
		ldc := 2*sNR + r.IntN(5)
		c := make([]float32, 2*sMR*ldc)
		for i := range c {
			c[i] = randSpecial32(r)
		}
		c5 := slices.Clone(c)
		kernelVariants.s12(kc, a, b, c5, ldc)
		sgemmKern12Go(kc, a, b, c, ldc)
		for i := range c {
			if !bitsEqual32(c5[i], c[i]) {
				t.Fatalf("float32 trial %d kc=%d element %d: avx512 12x32 %g go %g", trial, kc, i, c5[i], c[i])
			}
		}
		d := make([]float64, 2*sMR*ldc)
		for i := range d {
			d[i] = r.NormFloat64()
		}
		d5 := slices.Clone(d)
		kernelVariants.s12x64(kc, a, b, d5, ldc)
		sgemmKern12to64Go(kc, a, b, d, ldc)
		for i := range d {
			if !bitsEqual64(d5[i], d[i]) {
				t.Fatalf("float32→64 trial %d kc=%d element %d: avx512 12x32 %g go %g", trial, kc, i, d5[i], d[i])
			}
		}
	}
}

// TestTranspose8: the register transpose packB's interleave uses sets
// exactly dst[p*ldd+r] = src[r*lds+p] for the leading multiple of 8 of n
// it reports (all of it with AVX2, none in the portable build), and
// writes nothing else.
func TestTranspose8(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, n := range []int{0, 7, 8, 44, 256} {
		lds, ldd := n+5, 16
		src := randMat32(r, 8*lds)
		dst := randMat32(r, max(n, 1)*ldd)
		orig := append([]float32(nil), dst...)
		done := transpose8(n, src, lds, dst, ldd)
		if done%8 != 0 || done > n || (useAsm && done != n&^7) {
			t.Fatalf("n=%d: transposed %d", n, done)
		}
		for p := 0; p < max(n, 1); p++ {
			for c := 0; c < ldd; c++ {
				want := orig[p*ldd+c]
				if p < done && c < 8 {
					want = src[c*lds+p]
				}
				if !bitsEqual32(dst[p*ldd+c], want) {
					t.Fatalf("n=%d: dst[%d][%d] = %g, want %g", n, p, c, dst[p*ldd+c], want)
				}
			}
		}
	}
}
