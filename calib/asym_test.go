package calib

import (
	"math"
	"reflect"
	"testing"

	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/model"
)

// drift returns x·B for B = I + s·R (R uniform in [−1, 1)/√cols, seeded):
// a linear distortion of the rows that a least-squares fit can undo.
func drift(x []float32, cols int, s float32, seed uint64) []float32 {
	rng := splitmix{State: seed}
	b := make([]float32, cols*cols)
	for i := range b {
		b[i] = s * (2*rng.Unit() - 1) / sqrtApprox(float32(cols))
	}
	for i := 0; i < cols; i++ {
		b[i*cols+i]++
	}
	out := make([]float32, len(x))
	matmulT(out, x, len(x)/cols, cols, transpose(b, cols, cols), cols)
	return out
}

func transpose(a []float32, rows, cols int) []float32 {
	t := make([]float32, len(a))
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			t[j*rows+i] = a[i*cols+j]
		}
	}
	return t
}

// TestAsymmetricTargetLinear: when the original inputs are a linear map of
// the drifted ones, t = x·B, the fit is w·Bᵀ (up to the damping), and with
// t = x it is w exactly.
func TestAsymmetricTargetLinear(t *testing.T) {
	const n, cols, rows = 600, 24, 6
	x := activations(t, 0, n, cols, 3).X
	tg := drift(x, cols, 0.5, 9)
	w := make([]float32, rows*cols)
	rng := splitmix{State: 4}
	for i := range w {
		w[i] = 2*rng.Unit() - 1
	}
	hs := gptq.NewHessian(cols)
	if err := hs.Add(x, n); err != nil {
		t.Fatal(err)
	}
	opt := gptq.DefaultOptions()
	opt.PercDamp, opt.Float64 = 1e-9, true
	f, err := gptq.NewFactor(hs.Matrix(), cols, opt)
	if err != nil {
		t.Fatal(err)
	}
	same, err := AsymmetricTarget(w, rows, cols, n, f, RowsOf(x, append([]float32(nil), x...), cols))
	if err != nil {
		t.Fatal(err)
	}
	if same != nil {
		t.Fatal("target equal to the inputs gave a fit other than the weights themselves")
	}
	got, err := AsymmetricTarget(w, rows, cols, n, f, RowsOf(x, tg, cols))
	if err != nil {
		t.Fatal(err)
	}
	// w·Bᵀ: row r of the fit is Σ_k w[r,k]·B[c,k]... computed through the
	// drift of the weight rows themselves (w·Bᵀ = (B·wᵀ)ᵀ, and a row of w
	// drifted is w_r·B).
	bt := drift(transpose(identityF32(cols), cols, cols), cols, 0.5, 9) // I·B = B
	var e, r float64
	for i := 0; i < rows; i++ {
		for c := 0; c < cols; c++ {
			var want float64
			for k := 0; k < cols; k++ {
				want += float64(w[i*cols+k]) * float64(bt[c*cols+k])
			}
			d := float64(got[i*cols+c]) - want
			e += d * d
			r += want * want
		}
	}
	if rel := math.Sqrt(e / r); rel > 1e-4 {
		t.Fatalf("fit differs from w·Bᵀ by %.3g (relative)", rel)
	}
	short := func(r0, r1 int) ([]float32, []float32, error) { return x[r0*cols : r1*cols], tg[:cols], nil }
	if _, err := AsymmetricTarget(w, rows, cols, n, f, short); err == nil {
		t.Error("short targets accepted")
	}
}

func identityF32(n int) []float32 {
	m := make([]float32, n*n)
	for i := 0; i < n; i++ {
		m[i*n+i] = 1
	}
	return m
}

// TestAsymmetricLayer quantizes a MoE block whose inputs drifted from the
// original model's (x = t·B): fitted to the original outputs, the block
// reproduces them on held-out tokens better than the symmetric fit; with
// targets equal to the inputs the result is the symmetric one, byte for
// byte.
func TestAsymmetricLayer(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 4, TopK: 2, ExpertInter: 32, SharedInter: 32, NormTopK: true}
	l := testLayer(cfg, 7)
	orig := activations(t, 0, 3072, cfg.Hidden, 100)
	heldOrig := activations(t, 3072, 512, cfg.Hidden, 100)
	x := Activations{X: drift(orig.X, cfg.Hidden, 0.15, 5), Tokens: orig.Tokens}
	hx := drift(heldOrig.X, cfg.Hidden, 0.15, 5)
	opt := LayerOptions{MinTokens: -1}
	_, sym := collect(t, l, x, Activations{}, opt)
	withSelf := x
	withSelf.Target = append([]float32(nil), x.X...)
	_, self := collect(t, l, withSelf, Activations{}, opt)
	// Targets equal to the inputs leave gate and up as the symmetric fit
	// makes them; down is still fitted to the original expert's
	// intermediate, so it compensates the rounding of gate and up.
	for i := range sym {
		if !reflect.DeepEqual(sym[i].Quantized.Gate, self[i].Quantized.Gate) || !reflect.DeepEqual(sym[i].Quantized.Up, self[i].Quantized.Up) {
			t.Fatalf("expert %d: targets equal to the inputs changed gate or up", sym[i].Expert)
		}
	}
	asymAct := x
	asymAct.Target = orig.X
	_, asym := collect(t, l, asymAct, Activations{}, opt)
	// errAgainst is the held-out block error of the quantized experts on
	// the drifted inputs against the original block on inputs in.
	errAgainst := func(res []*ExpertResult, in []float32) float64 {
		ref, err := l.Forward(in, heldOrig.Tokens)
		if err != nil {
			t.Fatal(err)
		}
		out, err := quantizedLayer(l, res).Forward(hx, heldOrig.Tokens)
		if err != nil {
			t.Fatal(err)
		}
		return meanSqDiff(out, ref)
	}
	es, ea := errAgainst(sym, heldOrig.X), errAgainst(asym, heldOrig.X)
	t.Logf("held-out error against the original block on the original inputs: symmetric %.4g, asymmetric %.4g (%.3f×)", es, ea, ea/es)
	if !(ea < 0.9*es) {
		t.Errorf("asymmetric fit %.4g not below 0.9 × the symmetric %.4g", ea, es)
	}
	// Without drift, on the same inputs: down's compensation alone.
	s0, s1 := errAgainst(sym, hx), errAgainst(self, hx)
	t.Logf("held-out error on the same inputs: symmetric %.4g, down compensating gate/up %.4g (%.3f×)", s0, s1, s1/s0)
	if !(s1 < s0) {
		t.Errorf("down fitted to the original intermediate: error %.4g not below the symmetric %.4g", s1, s0)
	}
	bad := x
	bad.Target = orig.X[:len(orig.X)-1]
	if _, err := QuantizeMoELayer(t.Context(), l, bad, Activations{}, opt, nil); err == nil {
		t.Error("targets of the wrong size accepted")
	}
}

// TestAsymmetricTargetNoFactorization: without a usable factorization
// there is no H′⁻¹ and so no fit; the weights are their own.
func TestAsymmetricTargetNoFactorization(t *testing.T) {
	h := []float64{1, 100, 100, 1} // far from semidefinite: no damping helps
	f, err := gptq.NewFactor(h, 2, gptq.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if !f.NoFeedback() {
		t.Fatal("the factor of a hopeless Hessian has feedback")
	}
	w := []float32{0.3, -0.7}
	x := []float32{1, 2, 3, 4}
	tg := []float32{1.5, 2, 3, 4.5}
	got, err := AsymmetricTarget(w, 1, 2, 2, f, RowsOf(x, tg, 2))
	if err != nil || got != nil {
		t.Errorf("fit %v, %v: want none", got, err)
	}
}
