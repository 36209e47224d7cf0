package calib

import (
	"context"
	"math"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

// TestStoreHessians: SiteHessian and SwiGLUHessian against Hessians formed
// here from the activations LoadActivations returns, the SwiGLU computed
// in float64 (an independent formulation of silu(x·Gᵀ) ⊙ (x·Uᵀ)).
func TestStoreHessians(t *testing.T) {
	m, cfg, st := tinyModel(t, testmodel.Default)
	const layer, heldOut = 1, 2
	cal, _, err := st.LoadActivations(layer, SiteMoE, heldOut)
	if err != nil {
		t.Fatal(err)
	}
	tokens := int64(cal.Tokens)
	hidden := cfg.MoE().Hidden
	ctx := context.Background()

	got, err := st.SiteHessian(ctx, layer, SiteMoE, tokens)
	if err != nil {
		t.Fatal(err)
	}
	want := gram(cal.X, cal.Tokens, hidden, func(x []float64) []float64 { return x })
	if d := relDiff(got.Matrix(), want); got.Tokens() != tokens || d > 1e-5 {
		t.Errorf("site Hessian: %d tokens (want %d), relative difference %.3g", got.Tokens(), tokens, d)
	}

	l, err := LoadMoELayer(m, cfg, layer)
	if err != nil {
		t.Fatal(err)
	}
	inter := cfg.MoE().SharedInter
	g, u := l.Shared.Gate, l.Shared.Up
	got, err = st.SwiGLUHessian(ctx, layer, SiteMoE, tokens, g, u, inter)
	if err != nil {
		t.Fatal(err)
	}
	want = gram(cal.X, cal.Tokens, hidden, func(x []float64) []float64 {
		a := make([]float64, inter)
		for j := range a {
			var sg, su float64
			for k, v := range x {
				sg += v * float64(g[j*hidden+k])
				su += v * float64(u[j*hidden+k])
			}
			a[j] = sg / (1 + math.Exp(-sg)) * su
		}
		return a
	})
	if d := relDiff(got.Matrix(), want); got.Tokens() != tokens || d > 1e-4 {
		t.Errorf("SwiGLU Hessian: %d tokens (want %d), relative difference %.3g", got.Tokens(), tokens, d)
	}
	if _, err := st.SwiGLUHessian(ctx, layer, SiteMoE, tokens, g[1:], u, inter); err == nil {
		t.Error("a gate of the wrong size was accepted")
	}
	if _, err := st.SiteHessian(ctx, layer, "no-such-site", tokens); err == nil {
		t.Error("a missing site was accepted")
	}
}

// gram returns (2/n)·Σ f(x_t)·f(x_t)ᵀ over the n rows of x (n×cols), the
// convention of gptq.Hessian.
func gram(x []float32, n, cols int, f func([]float64) []float64) []float64 {
	var h []float64
	row := make([]float64, cols)
	for t := 0; t < n; t++ {
		for k := range row {
			row[k] = float64(x[t*cols+k])
		}
		a := f(row)
		if h == nil {
			h = make([]float64, len(a)*len(a))
		}
		for i := range a {
			for j := range a {
				h[i*len(a)+j] += 2 * a[i] * a[j] / float64(n)
			}
		}
	}
	return h
}

func relDiff(a, b []float64) float64 {
	var d, s float64
	for i := range a {
		d = math.Max(d, math.Abs(a[i]-b[i]))
		s = math.Max(s, math.Abs(b[i]))
	}
	return d / s
}
