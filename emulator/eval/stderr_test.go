package eval

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestStandardErrorsMatchBootstrap: on random logits in windows whose
// candidate noise differs from window to window (so positions within a
// window are correlated), the standard errors of ΔPPL, top-1 and mean KL
// agree with a bootstrap over windows (resampling whole windows with
// replacement) within 15%.
func TestStandardErrorsMatchBootstrap(t *testing.T) {
	const vocab, windows, positions, resamples = 64, 80, 48, 4000
	r := rand.New(rand.NewPCG(7, 11))
	all, err := NewScorer(vocab, []string{"cand"}, ScorerOptions{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Per window: tokens, agreements, KL sum, PPL tokens, NLL difference sum.
	type win struct{ n, agree, kl, pn, d float64 }
	var ws []win
	for w := 0; w < windows; w++ {
		noise := 0.2 + 1.5*r.Float64()
		ref := make([]float32, positions*vocab)
		cand := make([]float32, positions*vocab)
		for i := range ref {
			ref[i] = float32(2 * r.NormFloat64())
			cand[i] = ref[i] + float32(noise*r.NormFloat64())
		}
		targets := make([]int32, positions)
		for i := range targets {
			targets[i] = int32(r.IntN(vocab))
		}
		b := Batch{Ref: ref, Cands: [][]float32{cand}, Targets: targets, Corpus: []string{"x"}}
		one, err := NewScorer(vocab, []string{"cand"}, ScorerOptions{Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := one.Score(b); err != nil {
			t.Fatal(err)
		}
		if err := all.Score(b); err != nil {
			t.Fatal(err)
		}
		all.Accumulator().EndWindow()
		row := one.Accumulator().Rows(0)[1]
		n := float64(row.Tokens)
		ws = append(ws, win{n, row.Top1 * n, row.MeanKL * n, float64(row.PPLTokens), float64(row.PPLTokens) * (math.Log(row.CandPPL) - math.Log(row.RefPPL))})
	}
	got := all.Accumulator().Rows(0)[1]
	if got.Windows != windows {
		t.Fatalf("%d windows, want %d", got.Windows, windows)
	}
	stat := func(sample []win) (delta, top1, kl float64) {
		var s win
		for _, w := range sample {
			s.n, s.agree, s.kl, s.pn, s.d = s.n+w.n, s.agree+w.agree, s.kl+w.kl, s.pn+w.pn, s.d+w.d
		}
		return 100 * (math.Exp(s.d/s.pn) - 1), s.agree / s.n, s.kl / s.n
	}
	var sums, sqs [3]float64
	sample := make([]win, windows)
	for b := 0; b < resamples; b++ {
		for i := range sample {
			sample[i] = ws[r.IntN(windows)]
		}
		d, t1, kl := stat(sample)
		for k, v := range []float64{d, t1, kl} {
			sums[k] += v
			sqs[k] += v * v
		}
	}
	for k, c := range []struct {
		name string
		se   float64
	}{{"ΔPPL", got.DeltaPPLSE}, {"top-1", got.Top1SE}, {"mean KL", got.MeanKLSE}} {
		m := sums[k] / resamples
		boot := math.Sqrt(sqs[k]/resamples - m*m)
		t.Logf("%s: standard error %.5g, bootstrap over windows %.5g", c.name, c.se, boot)
		if !(math.Abs(c.se-boot) <= 0.15*boot) {
			t.Errorf("%s: standard error %g, bootstrap %g", c.name, c.se, boot)
		}
	}
}
