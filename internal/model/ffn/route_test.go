package ffn

import (
	"math"
	"sort"
	"testing"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/rng"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/safetensors"
)

// refRoute is a deliberately plain re-statement of the Qwen3 MoE router:
// logits by float64 dot products rounded to float32, float32 softmax, a full
// stable sort of the experts by probability, the first k taken, optional
// renormalisation. It returns per token the chosen experts and weights.
func refRoute(x []float32, tokens int, router []float32, cfg model.MoEConfig) ([][]int, [][]float32) {
	h := cfg.Hidden
	choice := make([][]int, tokens)
	weight := make([][]float32, tokens)
	for t := 0; t < tokens; t++ {
		logits := make([]float32, cfg.Experts)
		for e := range logits {
			var s float64
			for i := 0; i < h; i++ {
				s += float64(x[t*h+i]) * float64(router[e*h+i])
			}
			logits[e] = float32(s)
		}
		max := logits[0]
		for _, l := range logits[1:] {
			if l > max {
				max = l
			}
		}
		probs := make([]float32, cfg.Experts)
		var sum float32
		for e, l := range logits {
			probs[e] = float32(math.Exp(float64(l - max)))
			sum += probs[e]
		}
		for e := range probs {
			probs[e] /= sum
		}
		order := make([]int, cfg.Experts)
		for e := range order {
			order[e] = e
		}
		sort.SliceStable(order, func(a, b int) bool { return probs[order[a]] > probs[order[b]] })
		top := order[:cfg.TopK]
		w := make([]float32, cfg.TopK)
		var tot float32
		for j, e := range top {
			w[j] = probs[e]
			tot += probs[e]
		}
		if cfg.NormTopK {
			for j := range w {
				w[j] = w[j] / tot
			}
		}
		choice[t] = top
		weight[t] = w
	}
	return choice, weight
}

// compareRouting checks that Route and refRoute agree exactly: per token the
// same experts in the same order with bit-identical weights, and per expert
// the same token set.
func compareRouting(t *testing.T, x []float32, tokens int, router []float32, cfg model.MoEConfig) *Routing {
	t.Helper()
	r, err := Route(x, tokens, router, cfg)
	if err != nil {
		t.Fatal(err)
	}
	choice, weight := refRoute(x, tokens, router, cfg)
	perExpert := make([][]int32, cfg.Experts)
	perExpertW := make([][]float32, cfg.Experts)
	for tk := 0; tk < tokens; tk++ {
		for j := 0; j < cfg.TopK; j++ {
			got, want := int(r.Choice[tk*cfg.TopK+j]), choice[tk][j]
			if got != want {
				t.Fatalf("token %d rank %d: expert %d, reference %d", tk, j, got, want)
			}
			gw, ww := r.Weight[tk*cfg.TopK+j], weight[tk][j]
			if math.Float32bits(gw) != math.Float32bits(ww) {
				t.Fatalf("token %d expert %d: weight %g, reference %g", tk, want, gw, ww)
			}
			perExpert[want] = append(perExpert[want], int32(tk))
			perExpertW[want] = append(perExpertW[want], ww)
		}
	}
	for e := 0; e < cfg.Experts; e++ {
		toks, ws := r.ExpertTokens(e)
		if len(toks) != len(perExpert[e]) {
			t.Fatalf("expert %d: %d tokens, reference %d", e, len(toks), len(perExpert[e]))
		}
		for i := range toks {
			if toks[i] != perExpert[e][i] || math.Float32bits(ws[i]) != math.Float32bits(perExpertW[e][i]) {
				t.Fatalf("expert %d entry %d: token %d weight %g, reference token %d weight %g",
					e, i, toks[i], ws[i], perExpert[e][i], perExpertW[e][i])
			}
		}
		if r.Counts()[e] != len(toks) {
			t.Fatalf("expert %d: Counts %d, ExpertTokens %d", e, r.Counts()[e], len(toks))
		}
	}
	return r
}

// synthRouter is a router matrix of uniform values in ±1/16.
func synthRouter(experts, hidden int, seed uint64) []float32 {
	r := rng.SplitMix64{State: seed}
	w := make([]float32, experts*hidden)
	for i := range w {
		w[i] = r.Signed() / 16
	}
	return w
}

// synthX is tokens rows of activations uniform in ±2, with a few channels
// ten times larger, as real hidden states have.
func synthX(_ testing.TB, tokens, hidden int, seed uint64) []float32 {
	r := rng.SplitMix64{State: seed ^ 0x5eed}
	x := make([]float32, tokens*hidden)
	for i := range x {
		x[i] = 2 * r.Signed()
		if i%hidden%37 == 0 {
			x[i] *= 10
		}
	}
	return x
}

func TestRouteMatchesReference(t *testing.T) {
	for _, norm := range []bool{false, true} {
		cfg := model.MoEConfig{Hidden: 64, Experts: 16, TopK: 4, ExpertInter: 8, NormTopK: norm}
		x := synthX(t, 300, cfg.Hidden, 11)
		router := synthRouter(cfg.Experts, cfg.Hidden, 5)
		r := compareRouting(t, x, 300, router, cfg)
		var sum float64
		for j := 0; j < cfg.TopK; j++ {
			sum += float64(r.Weight[j])
		}
		if norm && math.Abs(sum-1) > 1e-6 {
			t.Errorf("norm_topk_prob on: token 0 weights sum to %g", sum)
		}
		if !norm && sum > 1-1e-3 {
			t.Errorf("norm_topk_prob off: token 0 weights sum to %g, expected well below 1", sum)
		}
	}
}

func TestRouteTies(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 32, Experts: 8, TopK: 3, ExpertInter: 8, NormTopK: true}
	router := synthRouter(cfg.Experts, cfg.Hidden, 9)
	x := synthX(t, 200, cfg.Hidden, 3)
	// Give the two experts most often ranked first a twin: an identical
	// router row at another index, so their probabilities tie exactly.
	r0, err := Route(x, 200, router, cfg)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, cfg.Experts)
	for tk := 0; tk < 200; tk++ {
		counts[r0.Choice[tk*3]]++
	}
	order := []int{0, 1, 2, 3, 4, 5, 6, 7}
	sort.SliceStable(order, func(a, b int) bool { return counts[order[a]] > counts[order[b]] })
	a, b := order[0], order[1]
	ta, tb := order[7], order[6] // rarely chosen slots become the twins
	copy(router[ta*32:(ta+1)*32], router[a*32:(a+1)*32])
	copy(router[tb*32:(tb+1)*32], router[b*32:(b+1)*32])
	pairs := [][2]int32{{int32(min(a, ta)), int32(max(a, ta))}, {int32(min(b, tb)), int32(max(b, tb))}}

	r := compareRouting(t, x, 200, router, cfg)
	both, cut := 0, 0
	for tk := 0; tk < 200; tk++ {
		ch := r.Choice[tk*3 : tk*3+3]
		pos := func(e int32) int {
			for j, f := range ch {
				if f == e {
					return j
				}
			}
			return -1
		}
		for _, p := range pairs {
			lo, hi := pos(p[0]), pos(p[1])
			switch {
			case hi >= 0 && lo < 0:
				t.Fatalf("token %d: expert %d chosen over its tied twin %d (choice %v)", tk, p[1], p[0], ch)
			case hi >= 0 && lo > hi:
				t.Fatalf("token %d: tied experts ranked %d before %d", tk, p[1], p[0])
			case hi >= 0:
				both++
				if r.Weight[tk*3+lo] != r.Weight[tk*3+hi] {
					t.Fatalf("token %d: tied experts got weights %g and %g", tk, r.Weight[tk*3+lo], r.Weight[tk*3+hi])
				}
			case lo == 2:
				cut++ // the tie straddled the top-k boundary
			}
		}
	}
	if both == 0 {
		t.Fatal("no token chose both members of a tied pair; the test exercises nothing")
	}
	t.Logf("tied pairs chosen together %d times, split by the top-k cut %d times", both, cut)

	// All-zero router: every probability is 1/8, so the lowest indices win
	// with equal weights.
	zero := make([]float32, cfg.Experts*cfg.Hidden)
	r = compareRouting(t, x[:5*cfg.Hidden], 5, zero, cfg)
	for tk := 0; tk < 5; tk++ {
		for j := 0; j < 3; j++ {
			if r.Choice[tk*3+j] != int32(j) {
				t.Fatalf("zero router token %d: choice %v", tk, r.Choice[tk*3:tk*3+3])
			}
			if math.Abs(float64(r.Weight[tk*3+j])-1.0/3) > 1e-7 {
				t.Fatalf("zero router token %d: weight %g", tk, r.Weight[tk*3+j])
			}
		}
	}
}

func TestRouteErrors(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 4, Experts: 3, TopK: 2, ExpertInter: 2}
	if _, err := Route(make([]float32, 7), 2, make([]float32, 12), cfg); err == nil {
		t.Error("short activations accepted")
	}
	if _, err := Route(make([]float32, 8), 2, make([]float32, 11), cfg); err == nil {
		t.Error("short router accepted")
	}
	cfg.TopK = 4
	if _, err := Route(make([]float32, 8), 2, make([]float32, 12), cfg); err == nil {
		t.Error("top-k above expert count accepted")
	}
}

// BenchmarkRoute35B routes tokens through a router of the Qwen3.6-35B-A3B
// shape (256 experts, hidden 2048, top-8).
func BenchmarkRoute35B(b *testing.B) {
	cfg := model.MoEConfig{Hidden: 2048, Experts: 256, TopK: 8, ExpertInter: 512, NormTopK: true}
	const tokens = 2048
	x := synthX(b, tokens, cfg.Hidden, 1)
	router := synthRouter(cfg.Experts, cfg.Hidden, 2)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Route(x, tokens, router, cfg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(tokens*b.N)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(2*float64(tokens*cfg.Experts*cfg.Hidden*b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// TestTinyRoutersMatchReference routes activations through every router of
// the tiny test model (trained-like weights, not random ones), with
// renormalisation on (the model's setting) and off.
func TestTinyRoutersMatchReference(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny(), testmodel.Default); err != nil {
		t.Fatal(err)
	}
	cfg, err := model.ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	x := synthX(t, 1024, cfg.Hidden, 7)
	for layer := 0; layer < cfg.NumLayers(); layer++ {
		name := cfg.LayerPrefix(layer) + "mlp.gate.weight"
		f, _, ok := m.Lookup(name)
		if !ok {
			t.Fatalf("no tensor %s", name)
		}
		router, err := f.Float32s(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, norm := range []bool{true, false} {
			c := cfg.MoE()
			c.NormTopK = norm
			compareRouting(t, x, 1024, router, c)
		}
	}
}
