package calib

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
	"github.com/ttquant/ttquant/internal/quant"
)

// testLayer builds a small MoE block with deterministic weights.
func testLayer(cfg model.MoEConfig, seed uint64) *ffn.MoE {
	rng := splitmix{State: seed}
	mat := func(rows, cols int) []float32 {
		w := make([]float32, rows*cols)
		s := 1 / sqrtApprox(float32(cols))
		for i := range w {
			w[i] = (2*rng.Unit() - 1) * s
		}
		return w
	}
	l := &ffn.MoE{Config: cfg, Router: mat(cfg.Experts, cfg.Hidden)}
	var experts ffn.ExpertList
	for e := 0; e < cfg.Experts; e++ {
		experts = append(experts, &ffn.ExpertWeights{Gate: mat(cfg.ExpertInter, cfg.Hidden),
			Up: mat(cfg.ExpertInter, cfg.Hidden), Down: mat(cfg.Hidden, cfg.ExpertInter)})
	}
	l.Experts = experts
	if cfg.SharedInter > 0 {
		l.Shared = &ffn.ExpertWeights{Gate: mat(cfg.SharedInter, cfg.Hidden),
			Up: mat(cfg.SharedInter, cfg.Hidden), Down: mat(cfg.Hidden, cfg.SharedInter)}
		l.SharedGate = mat(1, cfg.Hidden)
	}
	return l
}

// activations returns tokens rows of the synthetic distribution seed,
// starting at row first: calibration and held-out sets of one distribution
// differ only in their row ranges.
func activations(t testing.TB, first, tokens, hidden int, seed uint64) Activations {
	s, err := NewSynth(SynthConfig{Hidden: hidden, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, tokens*hidden)
	s.Rows(x, first, tokens)
	return Activations{X: x, Tokens: tokens}
}

// collect runs QuantizeMoELayer and returns the report and the emitted
// experts (shared expert last).
func collect(t *testing.T, l *ffn.MoE, cal, held Activations, opt LayerOptions) (*LayerReport, []*ExpertResult) {
	t.Helper()
	var got []*ExpertResult
	rep, err := QuantizeMoELayer(context.Background(), l, cal, held, opt, func(r *ExpertResult) error {
		got = append(got, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rep, got
}

// quantizedLayer returns l with its experts replaced by the results.
func quantizedLayer(l *ffn.MoE, res []*ExpertResult) *ffn.MoE {
	q := *l
	var experts ffn.ExpertList
	for _, r := range res {
		if r.Expert == SharedExpert {
			q.Shared = r.Quantized
		} else {
			experts = append(experts, r.Quantized)
		}
	}
	q.Experts = experts
	return &q
}

func TestQuantizeMoELayerHeldOut(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 128, Experts: 8, TopK: 2, ExpertInter: 32, SharedInter: 48, NormTopK: true}
	l := testLayer(cfg, 1)
	cal := activations(t, 0, 2048, cfg.Hidden, 100)
	held := activations(t, 2048, 512, cfg.Hidden, 100)
	rep, res := collect(t, l, cal, held, LayerOptions{})
	if len(res) != cfg.Experts+1 || res[cfg.Experts].Expert != SharedExpert {
		t.Fatalf("emitted %d results, want %d experts then the shared expert", len(res), cfg.Experts)
	}
	for i, r := range res[:cfg.Experts] {
		if r.Expert != i {
			t.Fatalf("result %d is expert %d: not in ascending order", i, r.Expert)
		}
	}
	// The reported held-out error must be the real block computation:
	// Forward with the quantized experts against Forward with the originals.
	ref, err := l.Forward(held.X, held.Tokens)
	if err != nil {
		t.Fatal(err)
	}
	qout, err := quantizedLayer(l, res).Forward(held.X, held.Tokens)
	if err != nil {
		t.Fatal(err)
	}
	if mse := meanSqDiff(qout, ref); mse != rep.HeldOut.MSE {
		t.Fatalf("held-out MSE %g, Forward with the quantized experts gives %g", rep.HeldOut.MSE, mse)
	}
	// And the RTN baseline likewise.
	var rtnRes []*ExpertResult
	for _, r := range res {
		w := l.Shared
		if r.Expert != SharedExpert {
			w, _ = l.Experts.Expert(r.Expert)
		}
		g := gptq.NewBFPGrid(rep.formatValue(t), bfp.DefaultAxis)
		q := &ffn.ExpertWeights{}
		q.Gate, _ = gptq.RTN(w.Gate, len(w.Gate)/cfg.Hidden, cfg.Hidden, g)
		q.Up, _ = gptq.RTN(w.Up, len(w.Up)/cfg.Hidden, cfg.Hidden, g)
		q.Down, _ = gptq.RTN(w.Down, cfg.Hidden, len(w.Down)/cfg.Hidden, g)
		rtnRes = append(rtnRes, &ExpertResult{Expert: r.Expert, Quantized: q})
	}
	rout, _ := quantizedLayer(l, rtnRes).Forward(held.X, held.Tokens)
	if mse := meanSqDiff(rout, ref); mse != rep.HeldOut.RTNMSE {
		t.Fatalf("held-out RTN MSE %g, Forward with RTN experts gives %g", rep.HeldOut.RTNMSE, mse)
	}
	t.Logf("held-out MSE: GPTQ %.4g, RTN %.4g, ratio %.3f (output mean square %.4g)",
		rep.HeldOut.MSE, rep.HeldOut.RTNMSE, rep.HeldOut.Ratio, rep.HeldOut.RefMeanSquare)
	if rep.HeldOut.Ratio > 0.8 {
		t.Errorf("GPTQ/RTN held-out MSE ratio %.3f, want <= 0.8", rep.HeldOut.Ratio)
	}
	for _, st := range append(rep.Experts, *rep.Shared) {
		for _, m := range st.Matrices {
			if m.Method != quant.GPTQ || m.Fallback != nil {
				t.Errorf("expert %d %s: method %s fallback %v", st.Expert, m.Name, m.Method, m.Fallback)
			}
			if !(m.ProxyLoss <= m.RTNProxyLoss) {
				t.Errorf("expert %d %s: proxy loss %g above RTN's %g", st.Expert, m.Name, m.ProxyLoss, m.RTNProxyLoss)
			}
		}
	}
}

func (r *LayerReport) formatValue(t *testing.T) bfpFormat {
	t.Helper()
	f, err := parseBFP(r.Format)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// starvedLayer returns a block in which expert 6 never wins and expert 7
// wins exactly for three tokens of cal: channel 0 is a constant 1 in every
// token ("bias"), channel 1 is 3 in tokens 10, 500 and 1500 and 0
// elsewhere; the router rows of experts 6 and 7 read only those channels,
// and no other row reads them.
func starvedLayer(t *testing.T) (*ffn.MoE, Activations, Activations) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 8, TopK: 2, ExpertInter: 32, SharedInter: 32, NormTopK: true}
	l := testLayer(cfg, 7)
	cal := activations(t, 0, 2048, cfg.Hidden, 300)
	held := activations(t, 2048, 256, cfg.Hidden, 300)
	for _, a := range []Activations{cal, held} {
		for tk := 0; tk < a.Tokens; tk++ {
			a.X[tk*64] = 1
			a.X[tk*64+1] = 0
		}
	}
	for _, tk := range []int{10, 500, 1500} {
		cal.X[tk*64+1] = 3
	}
	for e := 0; e < cfg.Experts; e++ {
		l.Router[e*64], l.Router[e*64+1] = 0, 0
	}
	for e := 6; e < 8; e++ {
		clear(l.Router[e*64 : (e+1)*64])
		l.Router[e*64] = -30
	}
	l.Router[7*64+1] = 20
	return l, cal, held
}

func TestStarvedExperts(t *testing.T) {
	l, cal, held := starvedLayer(t)
	r, err := ffn.Route(cal.X, cal.Tokens, l.Router, l.Config)
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Counts(); c[6] != 0 || c[7] != 3 {
		t.Fatalf("routed tokens per expert %v: the fixture needs 0 for expert 6 and 3 for expert 7", c)
	}
	for _, pol := range []StarvedPolicy{StarvedRTN, StarvedIdentity, StarvedAllTokens} {
		t.Run(string(pol), func(t *testing.T) {
			rep, res := collect(t, l, cal, held, LayerOptions{Starved: pol})
			if rep.MinTokens != 11 { // ceil(0.005 × 2048)
				t.Errorf("minimum tokens %d, want 11", rep.MinTokens)
			}
			if !reflect.DeepEqual(rep.Starved, []int{6, 7}) {
				t.Errorf("starved experts %v, want [6 7]", rep.Starved)
			}
			for _, e := range []int{6, 7} {
				st := rep.Experts[e]
				wantReason := []string{"no routed calibration tokens", "3 routed calibration tokens, minimum 11"}[e-6]
				if !st.Starved || st.Policy != pol || st.Reason != wantReason {
					t.Errorf("expert %d: starved %v policy %q reason %q", e, st.Starved, st.Policy, st.Reason)
				}
				if st.Tokens != []int{0, 3}[e-6] {
					t.Errorf("expert %d: %d tokens recorded", e, st.Tokens)
				}
				w, _ := l.Experts.Expert(e)
				q := res[e].Quantized
				for i, m := range st.Matrices {
					got := [][]float32{q.Gate, q.Up, q.Down}[i]
					for _, v := range got {
						if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
							t.Fatalf("expert %d %s: non-finite value", e, m.Name)
						}
					}
					if !finite(m.ProxyLoss) || !finite(m.RTNProxyLoss) || !finite(m.Damp) {
						t.Fatalf("expert %d %s: non-finite stats %+v", e, m.Name, m)
					}
					switch pol {
					case StarvedRTN:
						rows := []int{32, 32, 64}[i]
						want, _ := gptq.RTN([][]float32{w.Gate, w.Up, w.Down}[i], rows, len(got)/rows, gptq.NewBFPGrid(bfpDefault, bfp.DefaultAxis))
						if m.Method != quant.RTN || m.Hessian != HessianNone || m.Fallback == nil || !errors.Is(m.Fallback, ErrStarved) || !reflect.DeepEqual(got, want) {
							t.Errorf("expert %d %s: %+v, or values differ from RTN", e, m.Name, m)
						}
					case StarvedIdentity:
						if m.Method != quant.GPTQ || m.Hessian != HessianIdentity {
							t.Errorf("expert %d %s: %+v", e, m.Name, m)
						}
					case StarvedAllTokens:
						if m.Method != quant.GPTQ || m.Hessian != HessianAllTokens || m.HessianTokens != 2048 {
							t.Errorf("expert %d %s: %+v", e, m.Name, m)
						}
					}
				}
			}
			for e, st := range rep.Experts {
				if e < 6 && (st.Starved || st.Matrices[0].Hessian != HessianRouted) {
					t.Errorf("expert %d (%d tokens): starved %v hessian %s", e, st.Tokens, st.Starved, st.Matrices[0].Hessian)
				}
			}
		})
	}
	// With the minimum disabled, the 3-token expert runs GPTQ on its own
	// rank-3 Hessian (damping keeps it usable) and only the empty one starves.
	rep, _ := collect(t, l, cal, held, LayerOptions{MinTokens: -1})
	if !reflect.DeepEqual(rep.Starved, []int{6}) || rep.Experts[7].Matrices[2].Hessian != HessianRouted {
		t.Errorf("minimum disabled: starved %v, expert 7 %+v", rep.Starved, rep.Experts[7].Matrices)
	}
}

func TestWorkersIdentical(t *testing.T) {
	l, cal, held := starvedLayer(t)
	var reps [][]byte
	var outs [][]*ExpertResult
	for _, w := range []int{1, 4} {
		rep, res := collect(t, l, cal, held, LayerOptions{Workers: w, Starved: StarvedAllTokens})
		b, _ := json.Marshal(rep)
		reps = append(reps, b)
		outs = append(outs, res)
	}
	if string(reps[0]) != string(reps[1]) {
		t.Fatalf("reports differ between 1 and 4 workers:\n%s\n%s", reps[0], reps[1])
	}
	for i := range outs[0] {
		a, b := outs[0][i], outs[1][i]
		if a.Expert != b.Expert {
			t.Fatalf("result %d: expert %d vs %d", i, a.Expert, b.Expert)
		}
		for k, m := range [][2][]float32{{a.Quantized.Gate, b.Quantized.Gate}, {a.Quantized.Up, b.Quantized.Up}, {a.Quantized.Down, b.Quantized.Down}} {
			for j := range m[0] {
				if math.Float32bits(m[0][j]) != math.Float32bits(m[1][j]) {
					t.Fatalf("expert %d matrix %d value %d: %g with 1 worker, %g with 4", a.Expert, k, j, m[0][j], m[1][j])
				}
			}
		}
	}
}

func TestQuantizeMoELayerRTNMethod(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 4, TopK: 2, ExpertInter: 16}
	l := testLayer(cfg, 3)
	rep, res := collect(t, l, activations(t, 0, 256, 64, 1), activations(t, 256, 64, 64, 1), LayerOptions{Method: quant.RTN})
	if len(res) != 4 || rep.Shared != nil {
		t.Fatalf("%d results, shared %v", len(res), rep.Shared)
	}
	if rep.HeldOut.MSE != rep.HeldOut.RTNMSE || rep.HeldOut.Ratio != 1 {
		t.Errorf("RTN method: MSE %g vs RTN %g", rep.HeldOut.MSE, rep.HeldOut.RTNMSE)
	}
}

func TestQuantizeMoELayerErrors(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 4, TopK: 2, ExpertInter: 16}
	l := testLayer(cfg, 3)
	cal := activations(t, 0, 64, 64, 1)
	ctx := context.Background()
	if _, err := QuantizeMoELayer(ctx, l, Activations{X: cal.X[:100], Tokens: 64}, Activations{}, LayerOptions{}, nil); err == nil {
		t.Error("short activations accepted")
	}
	bad := Activations{X: append([]float32(nil), cal.X...), Tokens: 64}
	bad.X[70] = float32(math.NaN())
	if _, err := QuantizeMoELayer(ctx, l, bad, Activations{}, LayerOptions{}, nil); err == nil || !strings.Contains(err.Error(), "token 1 feature 6") {
		t.Errorf("NaN activation: %v", err)
	}
	broken := *l
	broken.Experts = ffn.ExpertList{l.Experts.(ffn.ExpertList)[0], l.Experts.(ffn.ExpertList)[1], {Gate: make([]float32, 5)}, l.Experts.(ffn.ExpertList)[3]}
	if _, err := QuantizeMoELayer(ctx, &broken, cal, Activations{}, LayerOptions{Workers: 2}, nil); err == nil || !strings.Contains(err.Error(), "expert 2: gate_proj") {
		t.Errorf("bad expert shape: %v", err)
	}
	if _, err := QuantizeMoELayer(ctx, l, cal, Activations{}, LayerOptions{Starved: "sometimes"}, nil); err == nil {
		t.Error("unknown policy accepted")
	}
	stop := errTest("stop")
	n := 0
	_, err := QuantizeMoELayer(ctx, l, cal, Activations{}, LayerOptions{Workers: 3}, func(*ExpertResult) error {
		n++
		return stop
	})
	if err != stop || n != 1 {
		t.Errorf("emit error: got %v after %d calls", err, n)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

type bfpFormat = bfp.Format

var bfpDefault = bfp.BFP4

func parseBFP(s string) (bfp.Format, error) { return bfp.ParseFormat(s) }

// TestExpertOrder re-derives one expert's quantization independently: gate
// and up with the Hessian of the expert's routed tokens, then down with the
// Hessian of silu(x·Gqᵀ)⊙(x·Uqᵀ) built from the quantized gate and up. The
// driver's matrices must be bit-identical, and using the original gate and
// up for the down Hessian must give a different down_proj (so the test can
// tell the orders apart).
func TestExpertOrder(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 4, TopK: 2, ExpertInter: 32, NormTopK: true}
	l := testLayer(cfg, 21)
	cal := activations(t, 0, 512, 64, 8)
	_, res := collect(t, l, cal, Activations{}, LayerOptions{})
	r, _ := ffn.Route(cal.X, cal.Tokens, l.Router, cfg)
	const e = 2
	toks, _ := r.ExpertTokens(e)
	var xe []float32
	for _, tk := range toks {
		xe = append(xe, cal.X[int(tk)*64:(int(tk)+1)*64]...)
	}
	n := len(toks)
	w, _ := l.Experts.Expert(e)
	g := gptq.NewBFPGrid(bfp.BFP4, bfp.DefaultAxis)
	opt := gptq.DefaultOptions()
	hgu := gptq.NewHessian(64)
	hgu.Add(xe, n)
	gq, err := gptq.Quantize(w.Gate, 32, 64, hgu.Matrix(), g, opt)
	if err != nil {
		t.Fatal(err)
	}
	uq, _ := gptq.Quantize(w.Up, 32, 64, hgu.Matrix(), g, opt)
	downWith := func(gate, up []float32) []float32 {
		a := make([]float32, n*32)
		for i := 0; i < n; i++ {
			for j := 0; j < 32; j++ {
				var sg, su float64
				for k := 0; k < 64; k++ {
					sg += float64(xe[i*64+k]) * float64(gate[j*64+k])
					su += float64(xe[i*64+k]) * float64(up[j*64+k])
				}
				a[i*32+j] = float32(sg / (1 + math.Exp(-sg)) * su)
			}
		}
		hd := gptq.NewHessian(32)
		hd.Add(a, n)
		dq, err := gptq.Quantize(w.Down, 64, 32, hd.Matrix(), g, opt)
		if err != nil {
			t.Fatal(err)
		}
		return dq.Q
	}
	got := res[e].Quantized
	if !reflect.DeepEqual(got.Gate, gq.Q) || !reflect.DeepEqual(got.Up, uq.Q) {
		t.Fatal("gate/up differ from GPTQ with the routed-token Hessian")
	}
	// The intermediate activations here are computed in float64, the
	// driver's in float32: allow a few flipped values.
	want, wrong := downWith(gq.Q, uq.Q), downWith(w.Gate, w.Up)
	diff := func(a, b []float32) int {
		n := 0
		for i := range a {
			if a[i] != b[i] {
				n++
			}
		}
		return n
	}
	dGood, dWrong := diff(got.Down, want), diff(got.Down, wrong)
	t.Logf("down_proj values differing: %d from the quantized-gate/up reference, %d from the original-gate/up one (of %d)", dGood, dWrong, len(want))
	if dGood*10 > dWrong || dGood > len(want)/50 {
		t.Errorf("down_proj does not follow the quantized gate/up: %d vs %d differing values", dGood, dWrong)
	}
}

func TestSkipShared(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 4, TopK: 2, ExpertInter: 16, SharedInter: 24, NormTopK: true}
	l := testLayer(cfg, 5)
	cal, held := activations(t, 0, 512, 64, 4), activations(t, 512, 64, 64, 4)
	rep, res := collect(t, l, cal, held, LayerOptions{SkipShared: true})
	if len(res) != 4 || rep.Shared != nil {
		t.Fatalf("%d results, shared stats %v: the shared expert must be left alone", len(res), rep.Shared)
	}
	ref, _ := l.Forward(held.X, held.Tokens)
	q, _ := quantizedLayer(l, res).Forward(held.X, held.Tokens)
	if mse := meanSqDiff(q, ref); mse != rep.HeldOut.MSE {
		t.Errorf("held-out MSE %g, Forward with quantized routed experts %g", rep.HeldOut.MSE, mse)
	}
}

func TestGridPerMatrix(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 4, TopK: 2, ExpertInter: 16, SharedInter: 16, NormTopK: true}
	l := testLayer(cfg, 9)
	cal, held := activations(t, 0, 512, 64, 4), activations(t, 512, 64, 64, 4)
	// b4 is the default grid, b8 on the other axis.
	b4, b8 := gptq.NewBFPGrid(bfp.BFP4, bfp.DefaultAxis), gptq.NewBFPGrid(bfp.BFP8, bfp.AxisInput)
	grids := make([]ExpertGrids, cfg.Experts)
	for e := range grids {
		grids[e] = ExpertGrids{Gate: b4, Up: b4, Down: b8}
	}
	shared := &ExpertGrids{Gate: b8, Up: b8, Down: b8}
	rep, res := collect(t, l, cal, held, LayerOptions{Grids: grids, SharedGrids: shared})
	base, baseRes := collect(t, l, cal, held, LayerOptions{})
	if rep.Format != "" || base.Format != "BFP4_b" {
		t.Errorf("report formats %q and %q", rep.Format, base.Format)
	}
	for _, st := range append(rep.Experts, *rep.Shared) {
		for _, m := range st.Matrices {
			want := "BFP4_b output-axis"
			if m.Name == "down_proj" || st.Expert == SharedExpert {
				want = "BFP8_b input-axis"
			}
			if m.Grid != want {
				t.Errorf("expert %d %s: grid %q, want %q", st.Expert, m.Name, m.Grid, want)
			}
		}
	}
	if !reflect.DeepEqual(res[0].Quantized.Gate, baseRes[0].Quantized.Gate) {
		t.Error("expert 0 gate_proj differs although its grid is the default")
	}
	if reflect.DeepEqual(res[0].Quantized.Down, baseRes[0].Quantized.Down) {
		t.Error("expert 0 down_proj identical on BFP8 and BFP4")
	}
	if !(rep.HeldOut.MSE < base.HeldOut.MSE) {
		t.Errorf("BFP8 down projections did not lower the held-out error: %g vs %g", rep.HeldOut.MSE, base.HeldOut.MSE)
	}
	missing := append([]ExpertGrids(nil), grids...)
	missing[2].Up = nil
	if _, err := QuantizeMoELayer(context.Background(), l, cal, held, LayerOptions{Grids: missing}, nil); err == nil || !strings.Contains(err.Error(), "expert 2 up_proj: no grid") {
		t.Errorf("missing grid: %v", err)
	}
	if _, err := QuantizeMoELayer(context.Background(), l, cal, held, LayerOptions{Grids: grids[:3]}, nil); err == nil || !strings.Contains(err.Error(), "grids for 3 experts") {
		t.Errorf("grids for too few experts: %v", err)
	}
	badGrid := append([]ExpertGrids(nil), grids...)
	badGrid[1].Down = gptq.NewBFPGrid(bfp.Format(99), bfp.AxisInput)
	if err := (LayerOptions{Grids: badGrid}).Validate(); err == nil {
		t.Error("an invalid grid passed Validate")
	}
}

func TestQuantizeMoELayerCancel(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 8, TopK: 2, ExpertInter: 16}
	l := testLayer(cfg, 3)
	cal := activations(t, 0, 256, 64, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	_, err := QuantizeMoELayer(ctx, l, cal, Activations{}, LayerOptions{Workers: 4}, func(*ExpertResult) error {
		n++
		if n == 2 {
			cancel()
		}
		return nil
	})
	if err != context.Canceled || n > 2+2*4 {
		t.Errorf("after cancelling: error %v, %d results emitted", err, n)
	}
}

// TestExpertSubset: a run over a subset of the routed experts (a worker of
// a split build) gives those experts the results and statistics of the
// whole run, bit for bit, and the starved ones among them; a held-out set
// and a subset out of order are refused.
func TestExpertSubset(t *testing.T) {
	l, cal, _ := starvedLayer(t)
	opt := LayerOptions{Starved: StarvedAllTokens, MinTokens: 11, SkipShared: true}
	wholeRep, whole := collect(t, l, cal, Activations{}, opt)
	sub := []int{1, 5, 6}
	opt.Experts = sub
	rep, res := collect(t, l, cal, Activations{}, opt)
	if len(res) != len(sub) || len(rep.Experts) != len(sub) || !reflect.DeepEqual(rep.Starved, []int{6}) {
		t.Fatalf("subset %v: %d results, %d expert stats, starved %v", sub, len(res), len(rep.Experts), rep.Starved)
	}
	for k, e := range sub {
		a, b := whole[e], res[k]
		if b.Expert != e {
			t.Fatalf("result %d is expert %d, want %d", k, b.Expert, e)
		}
		sa, _ := json.Marshal(wholeRep.Experts[e])
		sb, _ := json.Marshal(rep.Experts[k])
		if string(sa) != string(sb) {
			t.Errorf("expert %d: statistics differ from the whole run:\n%s\n%s", e, sa, sb)
		}
		for m, p := range [][2][]float32{{a.Quantized.Gate, b.Quantized.Gate}, {a.Quantized.Up, b.Quantized.Up}, {a.Quantized.Down, b.Quantized.Down}} {
			for j := range p[0] {
				if math.Float32bits(p[0][j]) != math.Float32bits(p[1][j]) {
					t.Fatalf("expert %d matrix %d value %d: %g in the whole run, %g in the subset", e, m, j, p[0][j], p[1][j])
				}
			}
		}
	}
	_, cal2, held := starvedLayer(t)
	if _, err := QuantizeMoELayer(context.Background(), l, cal2, held, opt, nil); err == nil || !strings.Contains(err.Error(), "held-out") {
		t.Errorf("subset with held-out tokens: %v", err)
	}
	opt.Experts = []int{5, 1}
	if _, err := QuantizeMoELayer(context.Background(), l, cal, Activations{}, opt, nil); err == nil || !strings.Contains(err.Error(), "ascending") {
		t.Errorf("subset out of order: %v", err)
	}
}

// TestRTNExponentRule: the layer's exponent rule reaches the driver's
// rounding: with ttmetal, each expert's matrices are gptq.RTNWith's with
// that rule (unweighted), and at least one differs from the max rule's.
func TestRTNExponentRule(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 4, TopK: 2, ExpertInter: 16}
	l := testLayer(cfg, 3)
	// Weights are U(−1/8, 1/8): a value just above 1/4 makes E_max−1 the
	// better exponent for its group.
	l.Experts.(ffn.ExpertList)[0].Gate[0] = 0.2505
	g := gptq.DefaultOptions()
	g.Exponent = gptq.ExpTTMetal
	_, res := collect(t, l, activations(t, 0, 256, 64, 1), activations(t, 256, 64, 64, 1), LayerOptions{Method: quant.RTN, GPTQ: &g})
	grid := gptq.NewBFPGrid(bfp.BFP4, bfp.DefaultAxis)
	changed := false
	for _, r := range res {
		w, err := l.Experts.Expert(r.Expert)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range [][2][]float32{{w.Gate, r.Quantized.Gate}, {w.Up, r.Quantized.Up}, {w.Down, r.Quantized.Down}} {
			rows, cols := cfg.ExpertInter, cfg.Hidden
			if i == 2 {
				rows, cols = cols, rows
			}
			want, err := gptq.RTNWith(m[0], rows, cols, grid, gptq.RTNOptions{Exponent: gptq.ExpTTMetal})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(want, m[1]) {
				t.Fatalf("expert %d matrix %d: not RTN with the ttmetal rule", r.Expert, i)
			}
			plain, _ := gptq.RTN(m[0], rows, cols, grid)
			changed = changed || !slices.Equal(plain, m[1])
		}
	}
	if !changed {
		t.Error("the ttmetal rule changed no expert matrix")
	}
}
