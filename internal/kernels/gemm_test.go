package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func randMat32(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func randMat64(r *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	return x
}

func at[T any](x []T, ld int, trans bool, r, c int) T {
	if trans {
		return x[c*ld+r]
	}
	return x[r*ld+c]
}

// specSgemm is the documented rounding of Sgemm written element by
// element, with no packing or tiling: per 256-block fma32 chains from +0,
// added to C.
func specSgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			v := c[i*ldc+j]
			switch beta {
			case 0:
				v = 0
			case 1:
			default:
				v *= beta
			}
			if alpha != 0 {
				for pc := 0; pc < k; pc += blockK {
					acc := float32(0)
					for p := pc; p < min(k, pc+blockK); p++ {
						acc = fma32(alpha*at(a, lda, transA, i, p), at(b, ldb, transB, p, j), acc)
					}
					v += acc
				}
			}
			c[i*ldc+j] = v
		}
	}
}

func specDgemm(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			v := c[i*ldc+j]
			switch beta {
			case 0:
				v = 0
			case 1:
			default:
				v *= beta
			}
			if alpha != 0 {
				for pc := 0; pc < k; pc += blockK {
					acc := 0.0
					for p := pc; p < min(k, pc+blockK); p++ {
						acc = math.FMA(alpha*at(a, lda, transA, i, p), at(b, ldb, transB, p, j), acc)
					}
					v += acc
				}
			}
			c[i*ldc+j] = v
		}
	}
}

type gemmCase struct {
	tA, tB      bool
	m, n, k     int
	alpha, beta float64
	pad         int
}

func gemmCases() []gemmCase {
	var cs []gemmCase
	for _, tA := range []bool{false, true} {
		for _, tB := range []bool{false, true} {
			cs = append(cs,
				gemmCase{tA, tB, 1, 1, 1, 1, 1, 0},
				gemmCase{tA, tB, 7, 17, 5, 1, 0, 3},
				gemmCase{tA, tB, 13, 33, 300, -1, 1, 1},
				gemmCase{tA, tB, 150, 40, 520, 0.75, -0.5, 2},
				gemmCase{tA, tB, 6, 16, 256, 1, 1, 0},
				gemmCase{tA, tB, 0, 5, 3, 1, 1, 0},
				gemmCase{tA, tB, 4, 5, 0, 1, 2, 0},
				gemmCase{tA, tB, 9, 20, 7, 0, 2, 1},
			)
		}
	}
	return cs
}

func TestSgemmMatchesSpec(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, tc := range gemmCases() {
		for _, workers := range []int{1, 3} {
			name := fmt.Sprintf("%+v/w%d", tc, workers)
			lda := max(1, tc.k+tc.pad)
			ra := tc.m
			if tc.tA {
				lda, ra = max(1, tc.m+tc.pad), tc.k
			}
			ldb := max(1, tc.n+tc.pad)
			rb := tc.k
			if tc.tB {
				ldb, rb = max(1, tc.k+tc.pad), tc.n
			}
			ldc := max(1, tc.n+tc.pad)
			a := randMat32(r, max(ra*lda, 1))
			b := randMat32(r, max(rb*ldb, 1))
			c := randMat32(r, max(tc.m*ldc, 1))
			want := append([]float32(nil), c...)
			prev := SetWorkers(workers)
			Sgemm(tc.tA, tc.tB, tc.m, tc.n, tc.k, float32(tc.alpha), a, lda, b, ldb, float32(tc.beta), c, ldc)
			SetWorkers(prev)
			specSgemm(tc.tA, tc.tB, tc.m, tc.n, tc.k, float32(tc.alpha), a, lda, b, ldb, float32(tc.beta), want, ldc)
			for i := range c {
				if !bitsEqual32(c[i], want[i]) {
					t.Fatalf("%s: element %d = %g, spec %g", name, i, c[i], want[i])
				}
			}
		}
	}
}

func TestDgemmMatchesSpec(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, tc := range gemmCases() {
		for _, workers := range []int{1, 2, 5} {
			lda := max(1, tc.k+tc.pad)
			ra := tc.m
			if tc.tA {
				lda, ra = max(1, tc.m+tc.pad), tc.k
			}
			ldb := max(1, tc.n+tc.pad)
			rb := tc.k
			if tc.tB {
				ldb, rb = max(1, tc.k+tc.pad), tc.n
			}
			ldc := max(1, tc.n+tc.pad)
			a := randMat64(r, max(ra*lda, 1))
			b := randMat64(r, max(rb*ldb, 1))
			c := randMat64(r, max(tc.m*ldc, 1))
			want := append([]float64(nil), c...)
			prev := SetWorkers(workers)
			Dgemm(tc.tA, tc.tB, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)
			SetWorkers(prev)
			specDgemm(tc.tA, tc.tB, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, want, ldc)
			for i := range c {
				if !bitsEqual64(c[i], want[i]) {
					t.Fatalf("%+v/w%d: element %d = %g, spec %g", tc, workers, i, c[i], want[i])
				}
			}
		}
	}
}

// TestSgemmAccuracy checks the float32 product against float64 arithmetic
// within a bound that holds for chains of 256 FMAs.
func TestSgemmAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	m, n, k := 37, 45, 700
	a, b := randMat32(r, m*k), randMat32(r, k*n)
	c := make([]float32, m*n)
	Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var ref, mag float64
			for p := 0; p < k; p++ {
				x := float64(a[i*k+p]) * float64(b[p*n+j])
				ref += x
				mag += math.Abs(x)
			}
			if d := math.Abs(float64(c[i*n+j]) - ref); d > 1e-5*mag {
				t.Fatalf("C[%d][%d] = %g, float64 %g (|error| %g, Σ|terms| %g)", i, j, c[i*n+j], ref, d, mag)
			}
		}
	}
}

func TestSyrkLower(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	for _, sz := range [][3]int{{1, 1, 0}, {5, 3, 1}, {23, 270, 2}, {40, 600, 0}, {97, 513, 3}} {
		n, k, pad := sz[0], sz[1], sz[2]
		ldx, ldc := n+pad, n+pad
		x := randMat32(r, k*ldx)
		c64 := randMat64(r, n*ldc)
		c32 := randMat32(r, n*ldc)
		w64 := append([]float64(nil), c64...)
		w32 := append([]float32(nil), c32...)
		for _, workers := range []int{1, 2, 4} {
			g64 := append([]float64(nil), c64...)
			g32 := append([]float32(nil), c32...)
			prev := SetWorkers(workers)
			SyrkLower64(n, k, x, ldx, g64, ldc)
			SyrkLower32(n, k, x, ldx, g32, ldc)
			SetWorkers(prev)
			if workers == 1 {
				// Spec: per 256-row block, fma32 chain from +0, then
				// added (to float64 after exact conversion, or in float32).
				for i := 0; i < n; i++ {
					for j := 0; j <= i; j++ {
						for pc := 0; pc < k; pc += blockK {
							acc := float32(0)
							for p := pc; p < min(k, pc+blockK); p++ {
								acc = fma32(x[p*ldx+i], x[p*ldx+j], acc)
							}
							w64[i*ldc+j] += float64(acc)
							w32[i*ldc+j] += acc
						}
					}
				}
			}
			for i := 0; i < n; i++ {
				for j := 0; j < n; j++ {
					idx := i*ldc + j
					if !bitsEqual64(g64[idx], w64[idx]) {
						t.Fatalf("n=%d k=%d w=%d: SyrkLower64 C[%d][%d] = %g, spec %g", n, k, workers, i, j, g64[idx], w64[idx])
					}
					if !bitsEqual32(g32[idx], w32[idx]) {
						t.Fatalf("n=%d k=%d w=%d: SyrkLower32 C[%d][%d] = %g, spec %g", n, k, workers, i, j, g32[idx], w32[idx])
					}
				}
			}
		}
		SymmetrizeLower64(n, w64, ldc)
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				if w64[i*ldc+j] != w64[j*ldc+i] {
					t.Fatalf("SymmetrizeLower64 left C[%d][%d] != C[%d][%d]", i, j, j, i)
				}
			}
		}
	}
}

func TestGemmPanicsOnBadShapes(t *testing.T) {
	cases := []func(){
		func() {
			Sgemm(false, false, 2, 2, 2, 1, make([]float32, 3), 2, make([]float32, 4), 2, 0, make([]float32, 4), 2)
		},
		func() {
			Sgemm(false, false, 2, 2, 2, 1, make([]float32, 4), 1, make([]float32, 4), 2, 0, make([]float32, 4), 2)
		},
		func() { Dgemm(true, false, -1, 2, 2, 1, nil, 1, nil, 1, 0, nil, 1) },
		func() { SyrkLower64(4, 4, make([]float32, 16), 4, make([]float64, 15), 4) },
	}
	for i, f := range cases {
		func() {
			defer func() {
				r := recover()
				if r == nil {
					t.Errorf("case %d: no panic", i)
				} else if s, ok := r.(string); !ok || len(s) < 9 || s[:9] != "kernels: " {
					t.Errorf("case %d: panic %v lacks the kernels: prefix", i, r)
				}
			}()
			f()
		}()
	}
}

// TestSgemmWidePanel crosses the 4080-column panel boundary of B.
func TestSgemmWidePanel(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	m, n, k := 7, blockN+37, 300
	a, b, c := randMat32(r, m*k), randMat32(r, k*n), randMat32(r, m*n)
	want := append([]float32(nil), c...)
	Sgemm(false, true, m, n, k, 1, a, k, b[:n*k], k, 1, c, n)
	specSgemm(false, true, m, n, k, 1, a, k, b[:n*k], k, 1, want, n)
	for i := range c {
		if !bitsEqual32(c[i], want[i]) {
			t.Fatalf("element %d = %g, spec %g", i, c[i], want[i])
		}
	}
}

// TestConcurrentCalls runs products from several goroutines at once: the
// kernels share only pools of scratch buffers, so results must match the
// serial ones.
func TestConcurrentCalls(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	m, n, k := 50, 70, 300
	a, b := randMat32(r, m*k), randMat32(r, k*n)
	want := make([]float32, m*n)
	Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, want, n)
	x := randMat32(r, k*n)
	wantH := make([]float64, n*n)
	SyrkLower64(n, k, x, n, wantH, n)
	errs := make(chan string, 8)
	done := make(chan struct{})
	for g := 0; g < 8; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			c := make([]float32, m*n)
			h := make([]float64, n*n)
			for it := 0; it < 5; it++ {
				clear(c)
				clear(h)
				Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
				SyrkLower64(n, k, x, n, h, n)
				for i := range c {
					if !bitsEqual32(c[i], want[i]) {
						errs <- "Sgemm differs under concurrency"
						return
					}
				}
				for i := range h {
					if !bitsEqual64(h[i], wantH[i]) {
						errs <- "SyrkLower64 differs under concurrency"
						return
					}
				}
			}
		}()
	}
	for g := 0; g < 8; g++ {
		<-done
	}
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

func TestSgemmPackedMatchesSgemm(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	for _, sz := range [][3]int{{1, 1, 1}, {3, 70, 300}, {20, blockN + 20, 260}, {130, 33, 513}} {
		m, n, k := sz[0], sz[1], sz[2]
		for _, tB := range []bool{false, true} {
			for _, tA := range []bool{false, true} {
				lda := k
				if tA {
					lda = m
				}
				ldb := n + 1
				if tB {
					ldb = k + 1
				}
				a := randMat32(r, m*k)
				rb := k
				if tB {
					rb = n
				}
				b := randMat32(r, rb*ldb)
				pb := PackB32(tB, k, n, b, ldb)
				if pb.Rows() != k || pb.Cols() != n {
					t.Fatalf("packed dims %d×%d", pb.Rows(), pb.Cols())
				}
				c1 := randMat32(r, m*n)
				c2 := append([]float32(nil), c1...)
				Sgemm(tA, tB, m, n, k, -0.5, a, lda, b, ldb, 1, c1, n)
				for _, w := range []int{1, 3} {
					c3 := append([]float32(nil), c2...)
					prev := SetWorkers(w)
					SgemmPacked(tA, m, -0.5, a, lda, pb, 1, c3, n)
					SetWorkers(prev)
					for i := range c1 {
						if !bitsEqual32(c1[i], c3[i]) {
							t.Fatalf("%v tA=%v tB=%v w=%d: element %d = %g, Sgemm %g", sz, tA, tB, w, i, c3[i], c1[i])
						}
					}
				}
			}
		}
	}
}

// TestShortAColumnSplit checks the products that run split over columns
// alone (few rows of A, see byColumns) against the element-by-element
// spec: unpacked and pre-packed B, both transpositions, partial slivers,
// more than one column panel and depth block, 2 and 3 workers, and the
// 2mr×2nr tile step forced on (its portable twin), which only AVX-512
// machines dispatch.
func TestShortAColumnSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	// Shapes just above colMinWork; the transpositions and the worker
	// counts alternate from shape to shape to keep the test short.
	for i, sz := range [][3]int{{1, 4200, 1030}, {5, 800, 1100}, {13, 520, 700}, {64, 260, 256}, {150, 700, 40}, {29, blockN + 70, 260}} {
		m, n, k := sz[0], sz[1], sz[2]
		for _, tB := range []bool{i%2 == 1} {
			tA := i%4 >= 2
			lda := k + 1
			if tA {
				lda = m + 1
			}
			ldb := n + 3
			rb := k
			if tB {
				ldb, rb = k+3, n
			}
			a := randMat32(r, max(m, k)*lda)
			b := randMat32(r, rb*ldb)
			c0 := randMat32(r, m*n)
			want := append([]float32(nil), c0...)
			specSgemm(tA, tB, m, n, k, -0.75, a, lda, b, ldb, 1, want, n)
			pb := PackB32(tB, k, n, b, ldb)
			for _, w := range []int{2 + i%2} {
				for _, form := range []string{"sgemm", "packed", "tile2", "tile2-packed"} {
					name := fmt.Sprintf("%v tA=%v tB=%v w=%d %s", sz, tA, tB, w, form)
					c := append([]float32(nil), c0...)
					prev := SetWorkers(w)
					pl := gemmPlan[float32]{m: m, n: n, k: k, alpha: -0.75,
						a:  operand[float32]{data: a, ld: lda, trans: tA},
						b:  operand[float32]{data: b, ld: ldb, trans: tB},
						mr: sMR, nr: sNR, mcMax: sMCMax, tile: tile32(c, n, false)}
					if form == "tile2" || form == "tile2-packed" {
						pl.tile2 = func(kc int, ap, bp []float32, i, j int) { sgemmKern12Go(kc, ap, bp, c[i*n+j:], n) }
					}
					if !pl.byColumns(w) {
						t.Fatalf("%s: not split over columns", name)
					}
					if form == "packed" || form == "tile2-packed" {
						pl.runPacked(pb.data)
					} else {
						pl.run()
					}
					SetWorkers(prev)
					for i := range c {
						if !bitsEqual32(c[i], want[i]) {
							t.Fatalf("%s: element %d = %g, spec %g", name, i, c[i], want[i])
						}
					}
				}
			}
		}
	}
}
