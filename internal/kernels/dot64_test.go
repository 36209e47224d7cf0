package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestDot64T: every element is the plain float64 loop's sum rounded to
// float32, bit for bit, for row counts around the 4-row tiles and the
// tasks' groups of them, column counts around the 8-column panels, depths
// from 0 up, leading dimensions wider than the rows, one and two workers
// and enough work for the parallel split.
func TestDot64T(t *testing.T) {
	defer SetWorkers(SetWorkers(0))
	r := rand.New(rand.NewPCG(31, 32))
	for _, sh := range []struct{ m, n, k int }{
		{1, 1, 1}, {3, 7, 5}, {4, 8, 0}, {5, 9, 17}, {17, 16, 33}, {33, 257, 64}, {300, 256, 2048},
	} {
		lda, ldb, ldc := sh.k+3, sh.k+1, sh.n+2
		a, b := randMat32(r, sh.m*lda), randMat32(r, sh.n*ldb)
		for i := range a {
			a[i] *= float32(math.Ldexp(1, r.IntN(40)-20)) // a wide range of exponents
		}
		want := make([]float32, sh.m*ldc)
		for i := 0; i < sh.m; i++ {
			for j := 0; j < sh.n; j++ {
				var s float64
				for p := 0; p < sh.k; p++ {
					s += float64(float64(a[i*lda+p]) * float64(b[j*ldb+p]))
				}
				want[i*ldc+j] = float32(s)
			}
		}
		for _, w := range []int{1, 2} {
			SetWorkers(w)
			got := make([]float32, len(want))
			Dot64T(sh.m, sh.n, sh.k, a, lda, b, ldb, got, ldc)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%+v, %d workers: element %d: %g, want %g", sh, w, i, got[i], want[i])
				}
			}
		}
	}
}

// TestDot64TileTwins: the tile of the assembly and its Go twin agree bit
// for bit on float64 values that are not float32 values (their products
// are rounded), with signed zeros and extremes, for several depths.
func TestDot64TileTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	for _, k := range []int{1, 2, 7, 64, 1001} {
		x, pn := make([]float64, dotMR*k), make([]float64, dotNR*k)
		for i := range x {
			x[i] = r.NormFloat64() * math.Ldexp(1, r.IntN(200)-100)
		}
		for i := range pn {
			pn[i] = r.NormFloat64()
		}
		x[0], pn[1] = math.Copysign(0, -1), math.MaxFloat64
		var got, want [dotMR * dotNR]float64
		dot64Tile(k, x, pn, &got)
		dot64TileGo(k, x, pn, &want)
		for i := range want {
			if math.Float64bits(got[i]) != math.Float64bits(want[i]) && !(math.IsNaN(got[i]) && math.IsNaN(want[i])) {
				t.Fatalf("k=%d: element %d: %g, twin %g", k, i, got[i], want[i])
			}
		}
	}
}
