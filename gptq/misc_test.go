package gptq

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

// TestHessianFromInputs rebuilds H from the stored activations: our
// token-normalised H times tokens/sequences must equal the reference's h
// within 1e-5 of max|H|, accumulated in one call, per reference batch, and
// from merged partial Hessians.
func TestHessianFromInputs(t *testing.T) {
	for _, p := range loadProblems(t) {
		if p.X == nil {
			continue
		}
		cols := p.Cols
		one := NewHessian(cols)
		if err := one.Add(p.X, p.Tokens); err != nil {
			t.Fatal(err)
		}
		merged := NewHessian(cols)
		off := 0
		for _, b := range p.Batches {
			part := NewHessian(cols)
			n := b * p.SeqLen
			if err := part.Add(p.X[off*cols:(off+n)*cols], n); err != nil {
				t.Fatal(err)
			}
			off += n
			if err := merged.Merge(part); err != nil {
				t.Fatal(err)
			}
		}
		if one.Tokens() != int64(p.Tokens) || merged.Tokens() != int64(p.Tokens) {
			t.Fatalf("%s: tokens %d / %d, want %d", p.ID, one.Tokens(), merged.Tokens(), p.Tokens)
		}
		scale := float64(p.Tokens) / float64(p.NSeq)
		maxH := 0.0
		for _, v := range p.H {
			maxH = max(maxH, math.Abs(v))
		}
		for name, hs := range map[string]*Hessian{"single": one, "merged": merged} {
			m := hs.Matrix()
			worst := 0.0
			for i, v := range m {
				worst = max(worst, math.Abs(v*scale-p.H[i]))
				if v != m[(i%cols)*cols+i/cols] {
					t.Fatalf("%s %s: not symmetric at %d", p.ID, name, i)
				}
			}
			t.Logf("%s %s: max|ΔH| / max|H| = %.2g", p.ID, name, worst/maxH)
			if worst > 1e-5*maxH {
				t.Errorf("%s %s: max|ΔH| = %g > 1e-5·max|H| = %g", p.ID, name, worst, 1e-5*maxH)
			}
		}
	}
}

// TestInverseFactor compares U from the stored h with the reference's hinv
// (max|ΔU| ≤ 1e-4·max|U|), with float32 damping as in float32 mode.
func TestInverseFactor(t *testing.T) {
	for _, p := range loadProblems(t) {
		cols := p.Cols
		for name, ref := range p.HInv {
			perm := make([]int, cols)
			for j := range perm {
				perm[j] = j
			}
			diag := make([]float64, cols)
			for j := range diag {
				diag[j] = p.H[j*cols+j]
				if diag[j] == 0 {
					diag[j] = 1
				}
			}
			if name == "hinv_actorder" {
				slices.SortStableFunc(perm, func(a, b int) int {
					switch {
					case diag[a] > diag[b]:
						return -1
					case diag[a] < diag[b]:
						return 1
					}
					return 0
				})
			}
			var mean float64
			for _, d := range diag {
				mean += d
			}
			mean /= float64(cols)
			lam := float32(float32(0.01) * float32(mean))
			hp := make([]float64, cols*cols)
			for a := 0; a < cols; a++ {
				for b := 0; b < a; b++ {
					hp[a*cols+b] = p.H[perm[a]*cols+perm[b]]
				}
				hp[a*cols+a] = float64(float32(diag[perm[a]]) + lam)
			}
			u, ok := inverseFactor(hp, cols)
			if !ok {
				t.Fatalf("%s %s: factorization failed", p.ID, name)
			}
			maxU, worst := 0.0, 0.0
			for i, v := range ref {
				a, b := i/cols, i%cols
				if diag[perm[a]] == 1 || diag[perm[b]] == 1 {
					// Dead columns may sit in another order among
					// themselves; their rows and columns are trivial.
					continue
				}
				maxU = max(maxU, math.Abs(float64(v)))
				worst = max(worst, math.Abs(u[i]-float64(v)))
			}
			t.Logf("%s %s: max|ΔU| / max|U| = %.2g", p.ID, name, worst/maxU)
			if worst > 1e-4*maxU {
				t.Errorf("%s %s: max|ΔU| = %g > 1e-4·max|U| = %g", p.ID, name, worst, 1e-4*maxU)
			}
		}
	}
}

// TestDeterministic: identical inputs give bit-identical results.
func TestDeterministic(t *testing.T) {
	p := newSynthProblem("det", 64, 200, 150, 11)
	for _, g := range []Grid{NewBFPGrid(bfp.BFP4, bfp.AxisInput), NewBFPGrid(bfp.BFP4, bfp.AxisOutput), NewIntGrid(IntConfig{Bits: 4, GroupSize: 32, MSE: true})} {
		for _, f64 := range []bool{false, true} {
			opt := Options{BlockSize: 64, PercDamp: 0.01, ActOrder: true, Float64: f64, NoProxyLoss: f64}
			a, err := Quantize(p.W, p.Rows, p.Cols, p.H, g, opt)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Quantize(p.W, p.Rows, p.Cols, p.H, g, opt)
			if err != nil {
				t.Fatal(err)
			}
			for i := range a.Q {
				if math.Float32bits(a.Q[i]) != math.Float32bits(b.Q[i]) {
					t.Fatalf("%v f64=%v: Q[%d] differs between runs", g, f64, i)
				}
			}
			if a.Error != b.Error || a.ProxyLoss != b.ProxyLoss || a.RTNProxyLoss != b.RTNProxyLoss {
				t.Errorf("%v f64=%v: reported losses differ between runs", g, f64)
			}
		}
	}
}

// TestDampingIncrease: an indefinite H makes the first factorizations fail;
// the damping is raised until it succeeds, and a hopeless H falls back to no
// error feedback; the output is finite either way.
func TestDampingIncrease(t *testing.T) {
	w := []float32{0.3, -0.7, 0.25, 1.1, 0.05, -0.4}
	g := NewIntGrid(IntConfig{Bits: 4})
	// Eigenvalues 1 ± 1.05: mildly indefinite.
	h := []float64{1, 1.05, 1.05, 1}
	res, err := Quantize(w, 3, 2, h, g, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if res.DampIncreases == 0 || res.NoFeedback || !(res.PercDamp > 0.01) {
		t.Errorf("mild: increases %d, percdamp %g, no-feedback %v", res.DampIncreases, res.PercDamp, res.NoFeedback)
	}
	if want := res.PercDamp * 1; math.Abs(res.Damp-want) > 1e-6*want {
		t.Errorf("damp %g, want percdamp·mean diag = %g", res.Damp, want)
	}
	checkFinite(t, res)
	// Far from semidefinite: no damping level helps.
	h = []float64{1, 100, 100, 1}
	res, err = Quantize(w, 3, 2, h, g, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if !res.NoFeedback {
		t.Errorf("hopeless H: NoFeedback not set (percdamp %g)", res.PercDamp)
	}
	checkFinite(t, res)
	rq, _ := RTN(w, 3, 2, g)
	if !slices.Equal(rq, res.Q) {
		t.Errorf("without feedback Q = %v, want RTN %v", res.Q, rq)
	}
	// A zero H (no tokens): every column dead. As in the reference the
	// dead weights are zeroed; with KeepDead they are rounded instead,
	// which without any coupling is exactly RTN.
	res, err = Quantize(w, 3, 2, make([]float64, 4), g, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if res.DeadCols != 2 || !slices.Equal(make([]float32, 6), res.Q) {
		t.Errorf("zero H: dead %d, Q %v, want zeros", res.DeadCols, res.Q)
	}
	opt := DefaultOptions()
	opt.KeepDead = true
	res, err = Quantize(w, 3, 2, make([]float64, 4), g, opt)
	if err != nil {
		t.Fatal(err)
	}
	if res.DeadCols != 2 || !slices.Equal(rq, res.Q) {
		t.Errorf("zero H, KeepDead: dead %d, Q %v, want RTN %v", res.DeadCols, res.Q, rq)
	}
}

func checkFinite(t *testing.T, res *Result) {
	t.Helper()
	for i, v := range res.Q {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("Q[%d] = %v", i, v)
		}
	}
	for _, v := range []float64{res.Error, res.ProxyLoss, res.RTNProxyLoss, res.Damp} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("report value %v", v)
		}
	}
}

// TestBadInput: bad input is an error wrapping the package's sentinels,
// never a panic.
func TestBadInput(t *testing.T) {
	w := make([]float32, 6)
	h := []float64{1, 0, 0, 1}
	g := NewBFPGrid(bfp.BFP4, bfp.AxisInput)
	nan := float32(math.NaN())
	cases := []struct {
		name string
		run  func() error
		want error
	}{
		{"short w", func() error { _, err := Quantize(w[:5], 3, 2, h, g, DefaultOptions()); return err }, ErrShape},
		{"zero rows", func() error { _, err := Quantize(nil, 0, 2, h, g, DefaultOptions()); return err }, ErrShape},
		{"h not square", func() error { _, err := Quantize(w, 3, 2, h[:3], g, DefaultOptions()); return err }, ErrShape},
		{"h wrong size", func() error { _, err := Quantize(w, 2, 3, h, g, DefaultOptions()); return err }, ErrShape},
		{"nan w", func() error {
			w2 := []float32{0, 1, nan, 0, 0, 0}
			_, err := Quantize(w2, 3, 2, h, g, DefaultOptions())
			return err
		}, ErrNotFinite},
		{"inf h", func() error {
			_, err := Quantize(w, 3, 2, []float64{1, math.Inf(1), math.Inf(1), 1}, g, DefaultOptions())
			return err
		}, ErrNotFinite},
		{"negative diag", func() error { _, err := Quantize(w, 3, 2, []float64{-1, 0, 0, 1}, g, DefaultOptions()); return err }, ErrHessian},
		{"asymmetric", func() error { _, err := Quantize(w, 3, 2, []float64{1, 0.5, 0, 1}, g, DefaultOptions()); return err }, ErrHessian},
		{"asymmetric 70x70", func() error {
			h70 := make([]float64, 70*70)
			for i := 0; i < 70; i++ {
				h70[i*70+i] = 1
			}
			h70[65*70+3] = 0.5 // below the diagonal, in a tile off the first
			_, err := NewFactor(h70, 70, DefaultOptions())
			return err
		}, ErrHessian},
		{"nil grid", func() error { _, err := Quantize(w, 3, 2, h, nil, DefaultOptions()); return err }, ErrOptions},
		{"bad bits", func() error {
			_, err := Quantize(w, 3, 2, h, NewIntGrid(IntConfig{Bits: 9}), DefaultOptions())
			return err
		}, ErrOptions},
		{"bad format", func() error {
			_, err := Quantize(w, 3, 2, h, NewBFPGrid(0, bfp.AxisInput), DefaultOptions())
			return err
		}, ErrOptions},
		{"bad axis", func() error { _, err := Quantize(w, 3, 2, h, NewBFPGrid(bfp.BFP4, ""), DefaultOptions()); return err }, ErrOptions},
		{"negative block", func() error { _, err := Quantize(w, 3, 2, h, g, Options{BlockSize: -1}); return err }, ErrOptions},
		{"nan damp", func() error { _, err := Quantize(w, 3, 2, h, g, Options{PercDamp: math.NaN()}); return err }, ErrOptions},
		{"rtn short", func() error { _, err := RTN(w[:4], 3, 2, g); return err }, ErrShape},
		{"hessian add short", func() error { return NewHessian(2).Add(make([]float32, 5), 3) }, ErrShape},
		{"hessian add nan", func() error { return NewHessian(2).Add([]float32{1, nan}, 1) }, ErrNotFinite},
		{"hessian add huge", func() error { return NewHessian(2).Add([]float32{1, 1e16}, 1) }, ErrNotFinite},
		{"hessian merge", func() error { return NewHessian(2).Merge(NewHessian(3)) }, ErrShape},
	}
	for _, c := range cases {
		err := c.run()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.want)
		}
	}
}

// TestHessianEmptyAndUnchanged: no tokens gives a zero matrix; a rejected
// batch leaves the Hessian unchanged.
func TestHessianEmptyAndUnchanged(t *testing.T) {
	h := NewHessian(3)
	for _, v := range h.Matrix() {
		if v != 0 {
			t.Fatal("empty Hessian not zero")
		}
	}
	if err := h.Add([]float32{1, 2, 3}, 1); err != nil {
		t.Fatal(err)
	}
	before := h.Matrix()
	if err := h.Add([]float32{1, float32(math.Inf(1)), 3}, 1); err == nil {
		t.Fatal("Inf accepted")
	}
	if !slices.Equal(before, h.Matrix()) || h.Tokens() != 1 {
		t.Error("rejected batch changed the Hessian")
	}
	// (2/1)·x·xᵀ for x = (1,2,3).
	want := []float64{2, 4, 6, 4, 8, 12, 6, 12, 18}
	if !slices.Equal(before, want) {
		t.Errorf("H = %v, want %v", before, want)
	}
}

// TestReport: the report carries the result's numbers and the loss ratio.
func TestReport(t *testing.T) {
	p := newSynthProblem("rep", 32, 64, 100, 5)
	g := NewBFPGrid(bfp.BFP4, bfp.AxisOutput)
	res, err := Quantize(p.W, p.Rows, p.Cols, p.H, g, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	rep := res.Report("layer.w", p.Rows, p.Cols, g)
	if rep.Name != "layer.w" || rep.Rows != 32 || rep.Cols != 64 || rep.Grid != "BFP4_b output-axis" {
		t.Errorf("report header %+v", rep)
	}
	if rep.ProxyLoss != res.ProxyLoss || rep.RTNProxyLoss != res.RTNProxyLoss || rep.Damp != res.Damp || rep.PercDamp != 0.01 {
		t.Errorf("report numbers %+v", rep)
	}
	if want := res.ProxyLoss / res.RTNProxyLoss; rep.LossRatio != want || !(want > 0 && want < 1) {
		t.Errorf("loss ratio %g, want %g in (0, 1)", rep.LossRatio, want)
	}
	if !(rep.Seconds > 0) {
		t.Errorf("seconds %g", rep.Seconds)
	}
}

// TestFactorShared: one Factor quantizes several matrices (concurrently)
// exactly as separate Quantize calls do, and rejects options that would
// need another factorization.
func TestFactorShared(t *testing.T) {
	p := newSynthProblem("fac", 40, 96, 120, 17)
	q := newSynthProblem("fac2", 24, 96, 10, 18) // other weights, same cols
	for _, opt := range []Options{DefaultOptions(), {BlockSize: 32, PercDamp: 0.05, ActOrder: true, Float64: true}} {
		f, err := NewFactor(p.H, p.Cols, opt)
		if err != nil {
			t.Fatal(err)
		}
		g := NewBFPGrid(bfp.BFP4, bfp.AxisInput)
		type out struct {
			res *Result
			err error
		}
		ch := make(chan out, 2)
		for _, w := range [][]float32{p.W, q.W} {
			go func() {
				r, err := f.Quantize(w, len(w)/p.Cols, g, opt)
				ch <- out{r, err}
			}()
		}
		got := map[int]*Result{}
		for range 2 {
			o := <-ch
			if o.err != nil {
				t.Fatal(o.err)
			}
			got[len(o.res.Q)] = o.res
		}
		for _, w := range [][]float32{p.W, q.W} {
			want, err := Quantize(w, len(w)/p.Cols, p.Cols, p.H, g, opt)
			if err != nil {
				t.Fatal(err)
			}
			r := got[len(w)]
			if !slices.Equal(r.Q, want.Q) || r.Error != want.Error || r.ProxyLoss != want.ProxyLoss || r.Damp != want.Damp {
				t.Errorf("%+v: factor result differs from Quantize", opt)
			}
		}
		bad := opt
		bad.ActOrder = !bad.ActOrder
		if _, err := f.Quantize(p.W, p.Rows, g, bad); !errors.Is(err, ErrOptions) {
			t.Errorf("mismatched options: %v", err)
		}
		if _, err := f.Quantize(p.W[:p.Cols*3], 4, g, opt); !errors.Is(err, ErrShape) {
			t.Errorf("short weights: %v", err)
		}
	}
	if _, err := NewFactor(p.H, p.Cols+1, DefaultOptions()); !errors.Is(err, ErrShape) {
		t.Errorf("wrong cols: %v", err)
	}
}

// TestRank1SubMatchesScalar: the kernel-based rank-1 update equals the
// scalar loop that rounds each product before subtracting, bit for bit.
func TestRank1SubMatchesScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, sz := range [][2]int{{1, 1}, {7, 33}, {127, 2048}, {40, 100}} {
		m, n := sz[0], sz[1]
		u := make([]float32, m)
		e := make([]float32, n)
		c := make([]float32, m*n)
		for i := range u {
			u[i] = float32(rng.NormFloat64())
		}
		for i := range e {
			e[i] = float32(rng.NormFloat64() * 1e-3)
		}
		for i := range c {
			c[i] = float32(rng.NormFloat64())
		}
		want := slices.Clone(c)
		for j := 0; j < m; j++ {
			axpySub(u[j], e, want[j*n:(j+1)*n])
		}
		rank1Sub(m, n, u, e, c, n)
		for i := range c {
			if c[i] != want[i] {
				t.Fatalf("%dx%d: element %d: %g, scalar loop gives %g", m, n, i, c[i], want[i])
			}
		}
		u64, e64, c64 := make([]float64, m), make([]float64, n), make([]float64, m*n)
		for i := range u {
			u64[i] = float64(u[i]) * (1 + 1e-9)
		}
		for i := range e {
			e64[i] = float64(e[i]) / 3
		}
		for i := range c64 {
			c64[i] = float64(want[i]) / 7
		}
		want64 := slices.Clone(c64)
		for j := 0; j < m; j++ {
			axpySub(u64[j], e64, want64[j*n:(j+1)*n])
		}
		rank1Sub(m, n, u64, e64, c64, n)
		if !slices.Equal(c64, want64) {
			t.Fatalf("%dx%d: float64 rank-1 update differs from the scalar loop", m, n)
		}
	}
}
