package gptq

import (
	"math"
	"testing"

	"gonum.org/v1/gonum/mat"
)

// TestHessianAgainstGonum: the Hessian accumulated in two batches against
// gonum's (2/n)·XᵀX formed in float64 from the same inputs, an oracle that
// shares no code with ours. The accumulator multiplies in float32 (as the
// reference does), sums blocks of 256 rows in float32 and the block sums in
// float64, so the two agree to float32 rounding, not exactly. (The
// kernels' Cholesky and products are checked against gonum in
// internal/kernels.)
func TestHessianAgainstGonum(t *testing.T) {
	for _, sz := range [][2]int{{5, 3}, {200, 48}, {300, 130}} {
		tokens, cols := sz[0], sz[1]
		x := randActivations(tokens, cols, uint64(tokens))
		h := NewHessian(cols)
		// Two batches, as a caller streaming tokens would add them.
		half := tokens / 2
		if err := h.Add(x[:half*cols], half); err != nil {
			t.Fatal(err)
		}
		if err := h.Add(x[half*cols:], tokens-half); err != nil {
			t.Fatal(err)
		}
		got := h.Matrix()

		x64 := make([]float64, len(x))
		for i, v := range x {
			x64[i] = float64(v)
		}
		xm := mat.NewDense(tokens, cols, x64)
		var want mat.Dense
		want.Mul(xm.T(), xm)
		want.Scale(2/float64(tokens), &want)
		var worst, scale float64
		for i := 0; i < cols; i++ {
			for j := 0; j < cols; j++ {
				worst = math.Max(worst, math.Abs(got[i*cols+j]-want.At(i, j)))
				scale = math.Max(scale, math.Abs(want.At(i, j)))
			}
		}
		if worst > 1e-5*scale {
			t.Errorf("%d tokens × %d: Hessian differs from gonum's (2/n)·XᵀX by %.3g (scale %.3g)", tokens, cols, worst, scale)
		}

		if h.Tokens() != int64(tokens) || h.Cols() != cols {
			t.Errorf("Tokens %d, Cols %d", h.Tokens(), h.Cols())
		}
	}
}
