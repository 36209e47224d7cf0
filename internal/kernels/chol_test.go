package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// randSPD returns a random n×n symmetric positive definite matrix with
// leading dimension ld: XᵀX/rows plus a small diagonal shift; cond
// controls how far the spectrum is stretched.
func randSPD(r *rand.Rand, n, ld int, cond float64) []float64 {
	rows := n + 8
	x := make([]float64, rows*n)
	for j := 0; j < n; j++ {
		scale := math.Pow(cond, -float64(j)/float64(max(n-1, 1))/2)
		for i := 0; i < rows; i++ {
			x[i*n+j] = r.NormFloat64() * scale
		}
	}
	a := make([]float64, n*ld)
	for i := 0; i < n; i++ {
		for j := 0; j <= i; j++ {
			var s float64
			for k := 0; k < rows; k++ {
				s += x[k*n+i] * x[k*n+j]
			}
			s /= float64(rows)
			a[i*ld+j], a[j*ld+i] = s, s
		}
		a[i*ld+i] += 1e-3 / cond
	}
	return a
}

var cholSizes = []int{1, 2, 5, 95, 96, 97, 200, 301, 620}

func TestDpotrf(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, n := range cholSizes {
		ld := n + 3
		a := randSPD(r, n, ld, 1e4)
		l := append([]float64(nil), a...)
		// Poison the strict upper triangle: it must be neither read nor written.
		for i := 0; i < n; i++ {
			for j := i + 1; j < n; j++ {
				l[i*ld+j] = math.NaN()
			}
		}
		if err := Dpotrf(n, l, ld); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		var scale float64
		for i := 0; i < n; i++ {
			scale = max(scale, a[i*ld+i])
			for j := 0; j < n; j++ {
				if j > i {
					if !math.IsNaN(l[i*ld+j]) {
						t.Fatalf("n=%d: upper entry [%d][%d] written", n, i, j)
					}
					continue
				}
				var s float64
				for k := 0; k <= j; k++ {
					s += l[i*ld+k] * l[j*ld+k]
				}
				if d := math.Abs(s - a[i*ld+j]); d > 1e-12*scale {
					t.Fatalf("n=%d: (L·Lᵀ)[%d][%d] = %g, A = %g", n, i, j, s, a[i*ld+j])
				}
			}
		}
		// Worker count independence, bit for bit.
		prev := SetWorkers(1)
		l1 := append([]float64(nil), a...)
		if err := Dpotrf(n, l1, ld); err != nil {
			t.Fatal(err)
		}
		SetWorkers(3)
		l3 := append([]float64(nil), a...)
		if err := Dpotrf(n, l3, ld); err != nil {
			t.Fatal(err)
		}
		SetWorkers(prev)
		for i := range l1 {
			if !bitsEqual64(l1[i], l3[i]) {
				t.Fatalf("n=%d: 1 and 3 workers differ at %d: %g vs %g", n, i, l1[i], l3[i])
			}
		}
	}
}

func TestDpotrfNotPositiveDefinite(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, k := range []int{0, 50, 96, 150, 199} {
		n := 200
		a := randSPD(r, n, n, 10)
		// Make the leading (k+1)-minor indefinite while the k-minor stays
		// positive definite.
		a[k*n+k] = -1
		err := Dpotrf(n, a, n)
		var npd *NotPositiveDefiniteError
		if !errors.As(err, &npd) || npd.Order != k+1 || npd.Trailing || !(npd.Pivot < 0) {
			t.Errorf("k=%d: err = %v, want a leading minor of order %d", k, err, k+1)
		}
	}
	a := []float64{1, 0, 0, math.NaN()}
	if err := Dpotrf(2, a, 2); err == nil {
		t.Error("NaN pivot accepted")
	}
}

func TestDtrtriAndDpotri(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, n := range cholSizes {
		ld := n + 1
		a := randSPD(r, n, ld, 1e3)
		l := append([]float64(nil), a...)
		if err := Dpotrf(n, l, ld); err != nil {
			t.Fatal(err)
		}
		li := append([]float64(nil), l...)
		if err := Dtrtri(n, li, ld); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			for j := 0; j <= i; j++ {
				var s float64
				for k := j; k <= i; k++ {
					s += l[i*ld+k] * li[k*ld+j]
				}
				want := 0.0
				if i == j {
					want = 1
				}
				if math.Abs(s-want) > 1e-10 {
					t.Fatalf("n=%d: (L·L⁻¹)[%d][%d] = %g", n, i, j, s)
				}
			}
		}
		ai := append([]float64(nil), l...)
		if err := Dpotri(n, ai, ld); err != nil {
			t.Fatal(err)
		}
		SymmetrizeLower64(n, ai, ld)
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				var s float64
				for k := 0; k < n; k++ {
					s += ai[i*ld+k] * a[k*ld+j]
				}
				want := 0.0
				if i == j {
					want = 1
				}
				if math.Abs(s-want) > 1e-8 {
					t.Fatalf("n=%d: (A⁻¹·A)[%d][%d] = %g", n, i, j, s)
				}
			}
		}
	}
	if err := Dtrtri(2, []float64{1, 0, 3, 0}, 2); err == nil {
		t.Error("singular triangle accepted")
	}
}

func TestCholInvUpper(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	for _, n := range cholSizes {
		ld := n + 2
		h := randSPD(r, n, ld, 1e3)
		u := make([]float64, n*ld)
		for i := range u {
			u[i] = math.NaN()
		}
		if err := CholInvUpper(n, h, ld, u, ld); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		// The three-step form: L = chol(H), Hinv = L⁻ᵀL⁻¹, U = chol(Hinv)ᵀ.
		hi := append([]float64(nil), h...)
		if err := Dpotrf(n, hi, ld); err != nil {
			t.Fatal(err)
		}
		if err := Dpotri(n, hi, ld); err != nil {
			t.Fatal(err)
		}
		if err := Dpotrf(n, hi, ld); err != nil {
			t.Fatal(err)
		}
		var scale float64
		for i := 0; i < n; i++ {
			scale = max(scale, math.Abs(hi[i*ld+i]))
		}
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				got := u[i*ld+j]
				if j < i {
					if got != 0 {
						t.Fatalf("n=%d: U[%d][%d] = %g below the diagonal", n, i, j, got)
					}
					continue
				}
				want := hi[j*ld+i]
				if math.Abs(got-want) > 1e-9*scale {
					t.Fatalf("n=%d: U[%d][%d] = %g, three-step form %g", n, i, j, got, want)
				}
			}
		}
	}
	h := []float64{4, 0, 0, 0, 1, 0, 0, 0, -1}
	var npd *NotPositiveDefiniteError
	if err := CholInvUpper(3, h, 3, make([]float64, 9), 3); !errors.As(err, &npd) || !npd.Trailing || npd.Order != 1 {
		t.Errorf("indefinite H: err = %v", err)
	}
}

func to32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

func TestFloat32Factorizations(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	for _, n := range cholSizes {
		ld := n + 1
		h := randSPD(r, n, ld, 100)
		h32 := to32(h)
		// Spotrf: L·Lᵀ reproduces H to float32 accuracy.
		l := append([]float32(nil), h32...)
		if err := Spotrf(n, l, ld); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		var scale float64
		for i := 0; i < n; i++ {
			scale = max(scale, h[i*ld+i])
		}
		for i := 0; i < n; i++ {
			for j := 0; j <= i; j++ {
				var s float64
				for k := 0; k <= j; k++ {
					s += float64(l[i*ld+k]) * float64(l[j*ld+k])
				}
				if d := math.Abs(s - float64(h32[i*ld+j])); d > 2e-5*scale {
					t.Fatalf("n=%d: (L·Lᵀ)[%d][%d] = %g, H = %g", n, i, j, s, h32[i*ld+j])
				}
			}
		}
		// Strtri and Spotri against the float64 results.
		li := append([]float32(nil), l...)
		if err := Strtri(n, li, ld); err != nil {
			t.Fatal(err)
		}
		ai := append([]float32(nil), l...)
		if err := Spotri(n, ai, ld); err != nil {
			t.Fatal(err)
		}
		ai64 := append([]float64(nil), h...)
		if err := Dpotrf(n, ai64, ld); err != nil {
			t.Fatal(err)
		}
		if err := Dpotri(n, ai64, ld); err != nil {
			t.Fatal(err)
		}
		var iscale float64
		for i := 0; i < n; i++ {
			iscale = max(iscale, ai64[i*ld+i])
		}
		for i := 0; i < n; i++ {
			for j := 0; j <= i; j++ {
				if d := math.Abs(float64(ai[i*ld+j]) - ai64[i*ld+j]); d > 1e-3*iscale {
					t.Fatalf("n=%d: Spotri [%d][%d] = %g, float64 %g", n, i, j, ai[i*ld+j], ai64[i*ld+j])
				}
			}
		}
		// CholInvUpper32 against CholInvUpper.
		u32 := make([]float32, n*ld)
		u64 := make([]float64, n*ld)
		if err := CholInvUpper32(n, h32, ld, u32, ld); err != nil {
			t.Fatal(err)
		}
		if err := CholInvUpper(n, h, ld, u64, ld); err != nil {
			t.Fatal(err)
		}
		var uscale float64
		for i := 0; i < n; i++ {
			uscale = max(uscale, math.Abs(u64[i*ld+i]))
		}
		for i := range u64 {
			if d := math.Abs(float64(u32[i]) - u64[i]); d > 1e-3*uscale {
				t.Fatalf("n=%d: CholInvUpper32 element %d = %g, float64 %g", n, i, u32[i], u64[i])
			}
		}
		// Worker independence, bit for bit.
		prev := SetWorkers(1)
		u1 := make([]float32, n*ld)
		if err := CholInvUpper32(n, h32, ld, u1, ld); err != nil {
			t.Fatal(err)
		}
		SetWorkers(4)
		u4 := make([]float32, n*ld)
		if err := CholInvUpper32(n, h32, ld, u4, ld); err != nil {
			t.Fatal(err)
		}
		SetWorkers(prev)
		for i := range u1 {
			if !bitsEqual32(u1[i], u4[i]) {
				t.Fatalf("n=%d: 1 and 4 workers differ at %d", n, i)
			}
		}
	}
}

// TestCholInvUpperRev checks that the reversed-input form gives
// CholInvUpper's U bit for bit (float64 and float32), writes the whole of
// U (strict lower part zero) and reports a failure on the same trailing
// minor.
func TestCholInvUpperRev(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, n := range []int{1, 7, 96, 97, 250, 400} {
		ld := n + 2
		h := randSPD(r, n, ld, 1e3)
		rev := make([]float64, n*ld)
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				rev[i*ld+j] = h[(n-1-i)*ld+n-1-j]
			}
		}
		h32, rev32 := to32(h), to32(rev)
		for _, w := range []int{1, 3} {
			prev := SetWorkers(w)
			want := make([]float64, n*ld)
			if err := CholInvUpper(n, h, ld, want, ld); err != nil {
				t.Fatal(err)
			}
			got := make([]float64, n*ld)
			for i := range got {
				got[i] = math.NaN()
			}
			if err := CholInvUpperRev(n, append([]float64(nil), rev...), ld, got, ld); err != nil {
				t.Fatal(err)
			}
			want32 := make([]float32, n*ld)
			if err := CholInvUpper32(n, h32, ld, want32, ld); err != nil {
				t.Fatal(err)
			}
			got32 := make([]float32, n*ld)
			if err := CholInvUpperRev32(n, append([]float32(nil), rev32...), ld, got32, ld); err != nil {
				t.Fatal(err)
			}
			SetWorkers(prev)
			for i := 0; i < n; i++ {
				for j := 0; j < n; j++ {
					x := i*ld + j
					if !bitsEqual64(got[x], want[x]) || !bitsEqual32(got32[x], want32[x]) {
						t.Fatalf("n=%d workers=%d [%d][%d]: %v/%v, want %v/%v", n, w, i, j, got[x], got32[x], want[x], want32[x])
					}
				}
			}
		}
	}
	// A trailing minor of order 1 that is not positive definite.
	n := 5
	h := randSPD(r, n, n, 10)
	h[(n-1)*n+n-1] = -1
	rev := make([]float64, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			rev[i*n+j] = h[(n-1-i)*n+n-1-j]
		}
	}
	err := CholInvUpperRev(n, rev, n, make([]float64, n*n), n)
	var npd *NotPositiveDefiniteError
	if !errors.As(err, &npd) || npd.Order != 1 || !npd.Trailing {
		t.Fatalf("got %v, want a trailing minor of order 1", err)
	}
}

// TestInvFactorInterleaved checks that the interleaved inverse factor
// (Cholesky steps and block rows of the triangular inverse alternating,
// the next diagonal block as a side job) gives exactly the bits of
// potrf followed by trtri, for several orders and worker counts, in both
// precisions, and fails on the same minor when H is not positive
// definite.
func TestInvFactorInterleaved(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	defer SetWorkers(SetWorkers(1))
	for _, n := range []int{96, 97, 200, 385, 500} {
		ld := n + 3
		h := randSPD(r, n, ld, 1e4)
		for _, w := range []int{1, 2, 3} {
			SetWorkers(w)
			want := append([]float64(nil), h...)
			dinv := make([]float64, n*cholBlock)
			if err := potrf(n, want, ld, dinv); err != nil {
				t.Fatal(err)
			}
			if err := trtri(n, want, ld, dinv); err != nil {
				t.Fatal(err)
			}
			got := append([]float64(nil), h...)
			if err := invFactorInPlace(n, got, ld); err != nil {
				t.Fatal(err)
			}
			h32 := to32(h)
			want32 := append([]float32(nil), h32...)
			dinv32 := make([]float32, n*cholBlock)
			if err := potrf(n, want32, ld, dinv32); err != nil {
				t.Fatal(err)
			}
			if err := trtri(n, want32, ld, dinv32); err != nil {
				t.Fatal(err)
			}
			got32 := append([]float32(nil), h32...)
			if err := invFactorInPlace(n, got32, ld); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				for j := 0; j <= i; j++ {
					if !bitsEqual64(got[i*ld+j], want[i*ld+j]) || !bitsEqual32(got32[i*ld+j], want32[i*ld+j]) {
						t.Fatalf("n=%d workers=%d: element (%d,%d) differs: %v/%v, float32 %v/%v", n, w, i, j,
							got[i*ld+j], want[i*ld+j], got32[i*ld+j], want32[i*ld+j])
					}
				}
			}
			// Not positive definite from row/column k on: the same
			// minor must be reported.
			k := n * 2 / 3
			bad := append([]float64(nil), h...)
			bad[k*ld+k] = -1
			errWant := potrf(n, append([]float64(nil), bad...), ld, nil)
			errGot := invFactorInPlace(n, bad, ld)
			var ew, eg *NotPositiveDefiniteError
			if !errors.As(errWant, &ew) || !errors.As(errGot, &eg) || ew.Order != eg.Order || !eg.Trailing {
				t.Fatalf("n=%d workers=%d: errors %v and %v", n, w, errWant, errGot)
			}
		}
	}
}

// TestInvFactorFirstBlockFails checks the two-goroutine factorization of
// the first diagonal block: a pivot that fails inside it is reported as
// potrf reports it (the inverting goroutine stops instead of waiting),
// with one and with two workers.
func TestInvFactorFirstBlockFails(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	defer SetWorkers(SetWorkers(1))
	n := 300
	h := randSPD(r, n, n, 1e3)
	for _, k := range []int{0, 1, 40, cholBlock - 1} {
		for _, w := range []int{1, 2} {
			SetWorkers(w)
			bad := append([]float64(nil), h...)
			bad[k*n+k] = -1
			errWant := potrf(n, append([]float64(nil), bad...), n, nil)
			errGot := invFactorInPlace(n, bad, n)
			var ew, eg *NotPositiveDefiniteError
			if !errors.As(errWant, &ew) || !errors.As(errGot, &eg) || ew.Order != eg.Order || ew.Order != k+1 || !eg.Trailing {
				t.Fatalf("k=%d workers=%d: errors %v and %v", k, w, errWant, errGot)
			}
		}
	}
}

// sameBitsMatrices returns n×n SPD matrices (leading dimension ld) that
// exercise signed zeros: a plain one; banded ones (two off-diagonals)
// with tiny off-diagonal entries (1e-25, 1e-160) next to the diagonal,
// whose fill-in underflows; and one whose off-diagonal entries are all
// the smallest negative float32 subnormal next to a diagonal of 16, so
// that in float32 every product with an off-diagonal entry rounds to −0
// and whole chains end as −0.
func sameBitsMatrices(r *rand.Rand, n, ld int) map[string][]float64 {
	a := randSPD(r, n, ld, 1e3)
	out := map[string][]float64{"plain": a}
	for _, coupling := range []float64{1e-25, 1e-160} {
		h := append([]float64(nil), a...)
		for i := range h {
			if d := i/ld - i%ld; d != 0 {
				h[i] *= coupling
				if d > 2 || d < -2 {
					h[i] = 0
				}
			}
		}
		out[fmt.Sprintf("banded %g", coupling)] = h
	}
	h := make([]float64, len(a))
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			h[i*ld+j] = -float64(math.SmallestNonzeroFloat32)
		}
		h[i*ld+i] = 16
	}
	out["subnormal"] = h
	return out
}

// TestSpanSameBits: the factorizations skipping the masked products of
// their triangular operands (gemmPlan.span) give the bits of the full
// chains, in both precisions, on one and two workers, over the matrices
// of sameBitsMatrices.
func TestSpanSameBits(t *testing.T) {
	defer func() { fullChains = false }()
	defer SetWorkers(SetWorkers(0))
	r := rand.New(rand.NewPCG(41, 42))
	for _, n := range []int{97, 200, 301, 520} {
		ld := n + 1
		for name, h := range sameBitsMatrices(r, n, ld) {
			for _, w := range []int{1, 2} {
				SetWorkers(w)
				run := func(full bool) (out [][]float64) {
					fullChains = full
					h32 := to32(h)
					u := make([]float64, n*ld)
					u32 := make([]float32, n*ld)
					errs := []error{CholInvUpper(n, h, ld, u, ld), CholInvUpper32(n, h32, ld, u32, ld)}
					l, l32 := append([]float64(nil), h...), append([]float32(nil), h32...)
					errs = append(errs, Dpotrf(n, l, ld), Spotrf(n, l32, ld))
					li, li32 := append([]float64(nil), l...), append([]float32(nil), l32...)
					errs = append(errs, Dtrtri(n, li, ld), Strtri(n, li32, ld), Dpotri(n, l, ld), Spotri(n, l32, ld))
					out = [][]float64{u, widen(u32), l, widen(l32), li, widen(li32)}
					for _, err := range errs {
						out = append(out, []float64{errCode(err)})
					}
					return out
				}
				want, got := run(true), run(false)
				for k := range want {
					for i := range want[k] {
						if math.Float64bits(got[k][i]) != math.Float64bits(want[k][i]) {
							t.Fatalf("n=%d %s workers %d: result %d [%d] = %v with spans, %v with full chains", n, name, w, k, i, got[k][i], want[k][i])
						}
					}
				}
			}
		}
	}
}

func widen(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func errCode(err error) float64 {
	if err != nil {
		return 1
	}
	return 0
}
