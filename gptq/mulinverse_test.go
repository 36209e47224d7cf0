package gptq

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestMulInverse checks m·H′⁻¹·H′ = m for the damped Hessian the factor
// inverted, with a dead column, in both precisions, with and without
// act-order.
func TestMulInverse(t *testing.T) {
	const n, tokens, rows = 40, 90, 3
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, tokens*n)
	for i := range x {
		if i%n == 7 {
			continue // column 7 is dead
		}
		x[i] = float32(r.NormFloat64()) * float32(1+i%n)
	}
	hs := NewHessian(n)
	if err := hs.Add(x, tokens); err != nil {
		t.Fatal(err)
	}
	h := hs.Matrix()
	for _, f64 := range []bool{false, true} {
		for _, act := range []bool{false, true} {
			opt := DefaultOptions()
			opt.Float64, opt.ActOrder = f64, act
			f, err := NewFactor(h, n, opt)
			if err != nil {
				t.Fatal(err)
			}
			m := make([]float64, rows*n)
			for i := range m {
				m[i] = r.NormFloat64()
			}
			want := append([]float64(nil), m...)
			if err := f.MulInverse(m, rows); err != nil {
				t.Fatal(err)
			}
			// H′ = H with the dead diagonal set to 1, plus λ·I.
			hp := append([]float64(nil), h...)
			for j := 0; j < n; j++ {
				if hp[j*n+j] == 0 {
					hp[j*n+j] = 1
				}
				hp[j*n+j] += f.damp
			}
			tol := 1e-3
			if f64 {
				tol = 1e-9
			}
			for row := 0; row < rows; row++ {
				for c := 0; c < n; c++ {
					var s float64
					for k := 0; k < n; k++ {
						s += m[row*n+k] * hp[k*n+c]
					}
					if d := math.Abs(s - want[row*n+c]); d > tol*(1+math.Abs(want[row*n+c])) {
						t.Fatalf("float64 %v act-order %v: row %d col %d: m·H′⁻¹·H′ = %g, want %g", f64, act, row, c, s, want[row*n+c])
					}
				}
			}
			if err := f.MulInverse(m[:5], rows); !errors.Is(err, ErrShape) {
				t.Errorf("short matrix: %v, want ErrShape", err)
			}
			f.Release()
			if err := f.MulInverse(m, rows); !errors.Is(err, ErrOptions) {
				t.Errorf("released factor: %v, want ErrOptions", err)
			}
		}
	}
}
