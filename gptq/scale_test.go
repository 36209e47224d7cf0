package gptq

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

// TestHessianScale pins down what docs/gptq.md says about scaling H (our
// per-token H against the reference's per-sequence one): without dead
// columns a scale of 4 leaves Q bit-identical (every step of the solver
// scales exactly by a power of two), in float32 and float64; with a dead
// column the fill H_jj = 1 does not scale, so the damping is no longer the
// same fraction of the live diagonal.
func TestHessianScale(t *testing.T) {
	const rows, cols, tokens = 24, 48, 200
	rng := rand.New(rand.NewPCG(7, 3))
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	hs := NewHessian(cols)
	if err := hs.Add(randActivations(tokens, cols, 5), tokens); err != nil {
		t.Fatal(err)
	}
	h := hs.Matrix()
	scaled := func(h []float64, c float64) []float64 {
		out := slices.Clone(h)
		for i := range out {
			out[i] *= c
		}
		return out
	}
	grid := NewBFPGrid(bfp.BFP4, bfp.AxisInput)
	for _, f64 := range []bool{false, true} {
		for _, act := range []bool{false, true} {
			opt := DefaultOptions()
			opt.BlockSize, opt.Float64, opt.ActOrder = 16, f64, act
			a, err := Quantize(w, rows, cols, h, grid, opt)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Quantize(w, rows, cols, scaled(h, 4), grid, opt)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a.Q, b.Q) {
				t.Errorf("float64=%v act-order=%v: Q changes when H is scaled by 4", f64, act)
			}
			if b.Damp != 4*a.Damp {
				t.Errorf("float64=%v act-order=%v: damping %g for 4·H, want 4 × %g", f64, act, b.Damp, a.Damp)
			}
		}
	}

	// A dead column: its fill of 1 enters the mean diagonal unscaled.
	dead := slices.Clone(h)
	for i := 0; i < cols; i++ {
		dead[i*cols+5], dead[5*cols+i] = 0, 0
	}
	opt := DefaultOptions()
	a, err := Quantize(w, rows, cols, dead, grid, opt)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Quantize(w, rows, cols, scaled(dead, 4), grid, opt)
	if err != nil {
		t.Fatal(err)
	}
	if a.DeadCols != 1 || b.DeadCols != 1 {
		t.Fatalf("dead columns %d and %d, want 1", a.DeadCols, b.DeadCols)
	}
	if b.Damp == 4*a.Damp {
		t.Errorf("with a dead column the damping scaled exactly (%g, %g): the fill of 1 would have to scale too", a.Damp, b.Damp)
	}
}
