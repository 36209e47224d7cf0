package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/mat"
)

// The tests in this file use gonum as an independent oracle: its LAPACK
// and BLAS ports share no code with ours, so agreement on random matrices
// (to a tolerance scaled by the size and the condition) says our blocked
// kernels compute the same mathematical objects.

// gonumSPD returns a random symmetric positive definite n×n matrix
// X·Xᵀ/k + 0.01·I, row-major.
func gonumSPD(rng *rand.Rand, n int) []float64 {
	k := n + 8
	x := make([]float64, n*k)
	for i := range x {
		x[i] = rng.NormFloat64()
	}
	a := make([]float64, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j <= i; j++ {
			var s float64
			for t := 0; t < k; t++ {
				s += x[i*k+t] * x[j*k+t]
			}
			s /= float64(k)
			if i == j {
				s += 0.01
			}
			a[i*n+j], a[j*n+i] = s, s
		}
	}
	return a
}

func maxRelDiff(a, b []float64) float64 {
	var worst, scale float64
	for i := range a {
		worst = math.Max(worst, math.Abs(a[i]-b[i]))
		scale = math.Max(scale, math.Abs(b[i]))
	}
	return worst / scale
}

// TestCholeskyAgainstGonum: Dpotrf's L against gonum's Cholesky, and
// Dtrtri's L⁻¹ against gonum's triangular inverse, across the 96-column
// block boundary.
func TestCholeskyAgainstGonum(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{1, 7, 95, 96, 97, 200} {
		a := gonumSPD(rng, n)
		var ch mat.Cholesky
		if !ch.Factorize(mat.NewSymDense(n, append([]float64(nil), a...))) {
			t.Fatalf("n=%d: gonum says the matrix is not positive definite", n)
		}
		var lg mat.TriDense
		ch.LTo(&lg)

		l := append([]float64(nil), a...)
		if err := Dpotrf(n, l, n); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		ours, theirs := make([]float64, 0, n*n), make([]float64, 0, n*n)
		for i := 0; i < n; i++ {
			for j := 0; j <= i; j++ {
				ours = append(ours, l[i*n+j])
				theirs = append(theirs, lg.At(i, j))
			}
		}
		if d := maxRelDiff(ours, theirs); d > 1e-12*float64(n) {
			t.Errorf("n=%d: Cholesky factor differs from gonum's by %.3g (relative)", n, d)
		}

		if err := Dtrtri(n, l, n); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		var inv mat.TriDense
		if err := inv.InverseTri(&lg); err != nil {
			t.Fatalf("n=%d: gonum InverseTri: %v", n, err)
		}
		ours, theirs = ours[:0], theirs[:0]
		for i := 0; i < n; i++ {
			for j := 0; j <= i; j++ {
				ours = append(ours, l[i*n+j])
				theirs = append(theirs, inv.At(i, j))
			}
		}
		if d := maxRelDiff(ours, theirs); d > 1e-9*float64(n) {
			t.Errorf("n=%d: triangular inverse differs from gonum's by %.3g (relative)", n, d)
		}
	}
}

// TestDgemmAgainstGonum: Dgemm with every transpose combination against
// gonum's product.
func TestDgemmAgainstGonum(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	randM := func(r, c int) *mat.Dense {
		d := make([]float64, r*c)
		for i := range d {
			d[i] = rng.NormFloat64()
		}
		return mat.NewDense(r, c, d)
	}
	for _, sz := range [][3]int{{1, 1, 1}, {5, 7, 3}, {64, 33, 129}, {130, 70, 96}} {
		m, n, k := sz[0], sz[1], sz[2]
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				a, b := randM(m, k), randM(k, n)
				if ta {
					a = mat.DenseCopyOf(a.T())
				}
				if tb {
					b = mat.DenseCopyOf(b.T())
				}
				var want mat.Dense
				var ao, bo mat.Matrix = a, b
				if ta {
					ao = a.T()
				}
				if tb {
					bo = b.T()
				}
				want.Mul(ao, bo)
				c := make([]float64, m*n)
				Dgemm(ta, tb, m, n, k, 1, a.RawMatrix().Data, a.RawMatrix().Stride, b.RawMatrix().Data, b.RawMatrix().Stride, 0, c, n)
				if d := maxRelDiff(c, want.RawMatrix().Data); d > 1e-13*float64(k) {
					t.Errorf("%d×%d×%d transA=%v transB=%v: differs from gonum by %.3g (relative)", m, n, k, ta, tb, d)
				}
			}
		}
	}
}
