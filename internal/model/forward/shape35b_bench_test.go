package forward

// Benchmarks at the Qwen3.6-35B-A3B shape for the wall-time projections of
// docs/projections.md. Every figure comes from one decoder layer of each
// kind (and the LM head) built in memory with the real tensor names and
// shapes of internal/testmodel's 35B replica and BF16-representable random
// values; nothing is written to disk. They are benchmarks only: the one
// test in this file checks the weight source on a tiny slice and runs in
// milliseconds.
//
//	go test ./internal/model/forward -run '^$' -bench Shape35B -benchtime 1x -timeout 2h
//
// Metrics: tokens/s (wall), GFLOP/s (wall, of the linear work plus the
// causal attention products; the delta-rule recurrence is not counted),
// cpu-s (process CPU seconds per operation: on a machine shared with other
// jobs the CPU seconds are the steadier figure) and cpu-ms/token.

import (
	"fmt"
	"github.com/ttquant/ttquant/internal/model"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/benchenv"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/testmodel"
)

// shape35BSource is a WeightSource with the 35B replica's names and shapes.
// Per-layer tensors carry testmodel.Values; the fused routed-expert tensors
// repeat a pool of distinct expert bodies (so that a layer's 256 experts
// cost one pool in memory while every expert read still copies its 3 × 1M
// values, as a checkpoint read decodes them); the embedding and LM head
// are generated once on first read. Values are BF16-representable.
type shape35BSource struct {
	cfg   testmodel.Config
	specs map[string]testmodel.TensorSpec

	mu    sync.Mutex
	cache map[string][]float32
	pool  map[string][][]float32 // fused expert tensor → expert bodies
}

// shape35BPool is the number of distinct routed-expert bodies.
const shape35BPool = 8

func newShape35BSource(tb testing.TB, cfg testmodel.Config) *shape35BSource {
	tb.Helper()
	specs, err := testmodel.Specs(cfg, testmodel.ExpertsFused, false)
	if err != nil {
		tb.Fatal(err)
	}
	s := &shape35BSource{cfg: cfg, specs: map[string]testmodel.TensorSpec{},
		cache: map[string][]float32{}, pool: map[string][][]float32{}}
	for _, sp := range specs {
		s.specs[sp.Name] = sp
	}
	return s
}

func (s *shape35BSource) Shape(name string) ([]int64, bool) {
	sp, ok := s.specs[name]
	if !ok {
		return nil, false
	}
	return sp.Shape, true
}

// bf16Fill fills v with BF16-rounded uniform values in [-scale, scale),
// in parallel, deterministically from seed.
func bf16Fill(v []float32, seed uint64, scale float32) {
	const chunk = 1 << 20
	n := (len(v) + chunk - 1) / chunk
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c := int(next.Add(1) - 1)
				if c >= n {
					return
				}
				r := rand.New(rand.NewPCG(seed, uint64(c)))
				for i := c * chunk; i < min(len(v), (c+1)*chunk); i++ {
					x := (2*r.Float32() - 1) * scale
					v[i] = math.Float32frombits(uint32(testmodel.BF16(x)) << 16)
				}
			}
		}()
	}
	wg.Wait()
}

func isFusedExpert(name string) bool {
	return strings.HasSuffix(name, "mlp.experts.gate_up_proj") || strings.HasSuffix(name, "mlp.experts.down_proj")
}

func (s *shape35BSource) Read(name string, dst []float32, start int64) error {
	sp, ok := s.specs[name]
	if !ok {
		return &WeightError{Tensor: name, Problem: "missing"}
	}
	if start < 0 || start+int64(len(dst)) > sp.NumElements() {
		return &WeightError{Tensor: name, Problem: "read outside the tensor"}
	}
	if isFusedExpert(name) {
		body := sp.NumElements() / sp.Shape[0]
		s.mu.Lock()
		p := s.pool[name]
		if p == nil {
			fan := sp.Shape[len(sp.Shape)-1]
			for k := 0; k < shape35BPool; k++ {
				b := make([]float32, body)
				bf16Fill(b, uint64(len(name))*1000+uint64(k), testmodel.MatrixScale(fan))
				p = append(p, b)
			}
			s.pool[name] = p
		}
		s.mu.Unlock()
		for len(dst) > 0 {
			e, off := start/body, start%body
			n := copy(dst, p[e%shape35BPool][off:])
			dst, start = dst[n:], start+int64(n)
		}
		return nil
	}
	s.mu.Lock()
	v := s.cache[name]
	if v == nil {
		if sp.Shape[0] == int64(s.cfg.Vocab) { // embedding, LM head
			v = make([]float32, sp.NumElements())
			bf16Fill(v, 4242, 1.0/32)
		} else {
			var err error
			if v, err = testmodel.Values(s.cfg, testmodel.ExpertsFused, name); err != nil {
				s.mu.Unlock()
				return err
			}
		}
		s.cache[name] = v
	}
	s.mu.Unlock()
	copy(dst, v[start:])
	return nil
}

// shape35BConfig returns the forward Config parsed from the replica's
// config.json.
func shape35BConfig(tb testing.TB, tc testmodel.Config) *model.Config {
	tb.Helper()
	js, err := tc.ConfigJSON(false)
	if err != nil {
		tb.Fatal(err)
	}
	cfg, err := model.ParseConfig(js, "config.json")
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// Per-token FLOPs (2 per multiply-add) of the 35B parts.
func shape35BFlops(c *model.Config, kind model.LayerKind, window int) (mixer, moe float64) {
	H := float64(c.Hidden)
	moe = 2 * H * (float64(c.Experts) + 3*float64(c.TopK*c.ExpertInter) + 3*float64(c.SharedInter) + 1)
	if kind == model.FullAttention {
		nh, nkv, hd := float64(c.Heads), float64(c.KVHeads), float64(c.HeadDim)
		// q (with gate), k, v, o projections, then QKᵀ and PV over the
		// causal context: (window+1)/2 keys on average.
		mixer = 2*H*(2*nh*hd+2*nkv*hd+nh*hd) + 2*2*nh*hd*float64(window+1)/2
	} else {
		mixer = 2 * H * float64(c.ConvDim()+2*c.ValueDim()+2*c.LinValueHeads)
	}
	return mixer, moe
}

// refRates35B measures, once per test binary, the rates the 35B figures
// are read against: kernels.Sgemm per CPU second on a 2048³ product
// (sgemmRates) and the float32 FMA peak per CPU second (a CPU second holds
// at most that much work), best of three runs of 10 GFLOP.
var refRates35B = sync.OnceValues(func() (sgemmCPU, peak1 float64) {
	_, sgemmCPU = sgemmRates()
	for i := 0; i < 3; i++ {
		c0 := benchenv.CPU().Seconds()
		var fl float64
		for fl < 10e9 {
			fl += kernels.FMAWork32(1 << 20)
		}
		peak1 = max(peak1, fl/(benchenv.CPU().Seconds()-c0)/1e9)
	}
	return sgemmCPU, peak1
})

// reportRefs reports GFLOP per CPU second g (named prefix+"GFLOP/cpu-s"
// elsewhere) as fractions of the SGEMM rate and of the one-core peak.
func reportRefs(b *testing.B, prefix string, g float64) {
	sg, pk := refRates35B()
	b.ReportMetric(g/sg, prefix+"sgemm-frac")
	b.ReportMetric(g/pk, prefix+"peak-frac")
}

// BenchmarkShape35BLayer runs Layer.Forward of a 35B Gated DeltaNet layer
// and of a 35B full-attention layer (each with its MoE block) over
// TTQUANT_BENCH_SEQS (default 1) sequences of TTQUANT_BENCH_SEQLEN (default
// 2,048) tokens, fresh state per sequence, as a calibration or evaluation
// pass does. The hook at SiteMLPIn splits each run into the token mixer
// and the MoE block (the hook also sees the routed experts' inputs, as a
// calibration pass would: gathering them costs < 1% of the block).
func BenchmarkShape35BLayer(b *testing.B) {
	tc := testmodel.Qwen36_35B()
	cfg := shape35BConfig(b, tc)
	src := newShape35BSource(b, tc)
	seqs := benchenv.PositiveEnv(b, "TTQUANT_BENCH_SEQS", 1)
	seqLen := benchenv.PositiveEnv(b, "TTQUANT_BENCH_SEQLEN", 2048)
	refRates35B()
	for _, li := range []int{0, 3} { // layer 0: Gated DeltaNet, layer 3: full attention
		kind := cfg.Kind(li)
		name := "linear"
		if kind == model.FullAttention {
			name = "full"
		}
		b.Run(fmt.Sprintf("kind=%s/tokens=%dx%d", name, seqs, seqLen), func(b *testing.B) {
			l, err := LoadLayer(src, cfg, li)
			if err != nil {
				b.Fatal(err)
			}
			lens := make([]int, seqs)
			for i := range lens {
				lens[i] = seqLen
			}
			n := seqs * seqLen
			x0 := make([]float32, n*cfg.Hidden)
			bf16Fill(x0, 99, 1)
			x := make([]float32, len(x0))
			var wMix, wMoE time.Duration
			var cMix, cMoE float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				copy(x, x0)
				b.StartTimer()
				t0, c0 := time.Now(), benchenv.CPU().Seconds()
				var tm time.Time
				var cm float64
				hook := func(a *Activations) error {
					if a.Site == SiteMLPIn {
						tm, cm = time.Now(), benchenv.CPU().Seconds()
					}
					return nil
				}
				if err := l.Forward(&Batch{Lens: lens, X: x}, hook); err != nil {
					b.Fatal(err)
				}
				t1, c1 := time.Now(), benchenv.CPU().Seconds()
				wMix += tm.Sub(t0)
				wMoE += t1.Sub(tm)
				cMix += cm - c0
				cMoE += c1 - cm
			}
			b.StopTimer()
			N := float64(b.N)
			fMix, fMoE := shape35BFlops(cfg, kind, seqLen)
			tok := float64(n)
			wall := b.Elapsed().Seconds() / N
			b.ReportMetric(tok/wall, "tokens/s")
			b.ReportMetric((fMix+fMoE)*tok/wall/1e9, "GFLOP/s")
			b.ReportMetric((cMix+cMoE)/N, "cpu-s")
			b.ReportMetric((cMix+cMoE)/N/tok*1e3, "cpu-ms/token")
			b.ReportMetric(tok/(wMix.Seconds()/N), "mixer-tokens/s")
			b.ReportMetric(cMix/N/tok*1e3, "mixer-cpu-ms/token")
			b.ReportMetric(fMix*tok/(cMix/N)/1e9, "mixer-GFLOP/cpu-s")
			b.ReportMetric(tok/(wMoE.Seconds()/N), "moe-tokens/s")
			b.ReportMetric(cMoE/N/tok*1e3, "moe-cpu-ms/token")
			b.ReportMetric(fMoE*tok/(cMoE/N)/1e9, "moe-GFLOP/cpu-s")
			reportRefs(b, "", (fMix+fMoE)*tok/((cMix+cMoE)/N)/1e9)
			reportRefs(b, "mixer-", fMix*tok/(cMix/N)/1e9)
			reportRefs(b, "moe-", fMoE*tok/(cMoE/N)/1e9)
			sg, pk := refRates35B()
			b.ReportMetric(sg, "sgemm-GFLOP/cpu-s")
			b.ReportMetric(pk, "peak-GFLOP/cpu-s")
			b.ReportMetric(benchenv.LoadAvg(), "load1")
		})
	}
}

// BenchmarkShape35BLMHead computes the logits of TTQUANT_BENCH_ROWS
// (default 512) final-normed rows over the 248,320-token vocabulary with
// Model.Logits, as evaluation does for every scored position.
func BenchmarkShape35BLMHead(b *testing.B) {
	tc := testmodel.Qwen36_35B()
	cfg := shape35BConfig(b, tc)
	m, err := New(cfg, newShape35BSource(b, tc))
	if err != nil {
		b.Fatal(err)
	}
	rows := benchenv.PositiveEnv(b, "TTQUANT_BENCH_ROWS", 512)
	sg, pk := refRates35B()
	hf := make([]float32, rows*cfg.Hidden)
	bf16Fill(hf, 7, 1)
	if err := m.Logits(hf[:cfg.Hidden], func(int, int, []float32) error { return nil }); err != nil {
		b.Fatal(err) // reads the LM head before timing
	}
	var cpu float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c0 := benchenv.CPU().Seconds()
		if err := m.Logits(hf, func(int, int, []float32) error { return nil }); err != nil {
			b.Fatal(err)
		}
		cpu += benchenv.CPU().Seconds() - c0
	}
	b.StopTimer()
	N := float64(b.N)
	wall := b.Elapsed().Seconds() / N
	fl := 2 * float64(cfg.Hidden) * float64(cfg.Vocab) * float64(rows)
	b.ReportMetric(float64(rows)/wall, "tokens/s")
	b.ReportMetric(fl/wall/1e9, "GFLOP/s")
	b.ReportMetric(cpu/N, "cpu-s")
	b.ReportMetric(cpu/N/float64(rows)*1e3, "cpu-ms/token")
	b.ReportMetric(fl/(cpu/N)/1e9, "GFLOP/cpu-s")
	reportRefs(b, "", fl/(cpu/N)/1e9)
	b.ReportMetric(sg, "sgemm-GFLOP/cpu-s")
	b.ReportMetric(pk, "peak-GFLOP/cpu-s")
	b.ReportMetric(benchenv.LoadAvg(), "load1")
}

// BenchmarkShape35BLayerPeak measures the memory of one sequential-GPTQ
// layer step's forward part over TTQUANT_BENCH_SEQS (default 8) sequences
// of 2,048 tokens through a 35B Gated DeltaNet + MoE layer: the residual
// stream is held, the MoE block's input (the site GPTQ of the experts
// needs) is copied out as the hook sees it, and the layer runs. It reports
// the process's peak resident set (VmHWM; run this benchmark alone in its
// process, since the figure never decreases) and the peak of the Go
// runtime's mapped memory sampled every 5 ms, both before and during the
// step.
func BenchmarkShape35BLayerPeak(b *testing.B) {
	tc := testmodel.Qwen36_35B()
	cfg := shape35BConfig(b, tc)
	src := newShape35BSource(b, tc)
	seqs := benchenv.PositiveEnv(b, "TTQUANT_BENCH_SEQS", 8)
	const seqLen = 2048
	l, err := LoadLayer(src, cfg, 0)
	if err != nil {
		b.Fatal(err)
	}
	// Read the expert pool before the baseline.
	if _, err := l.MoE.Experts.Expert(0); err != nil {
		b.Fatal(err)
	}
	lens := make([]int, seqs)
	for i := range lens {
		lens[i] = seqLen
	}
	n := seqs * seqLen
	x := make([]float32, n*cfg.Hidden)
	bf16Fill(x, 5, 1)
	var site []float32
	runtime.GC()
	baseRSS := benchenv.StatusKiB("VmRSS")
	goMem := benchenv.StartGoMemory(5 * time.Millisecond)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		hook := func(a *Activations) error {
			if a.Site == SiteMLPIn {
				site = append(site[:0], a.X...)
			}
			return nil
		}
		if err := l.Forward(&Batch{Lens: lens, X: x}, hook); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	goPeak := goMem.Stop()
	runtime.KeepAlive(site)
	const mib = 1 << 20
	b.ReportMetric(float64(n*cfg.Hidden*4)/mib, "stream-MiB")
	b.ReportMetric(float64(goMem.Base)/mib, "go-before-MiB")
	b.ReportMetric(float64(goPeak)/mib, "go-peak-MiB")
	b.ReportMetric(float64(baseRSS)/1024, "rss-before-MiB")
	b.ReportMetric(float64(benchenv.StatusKiB("VmHWM"))/1024, "rss-peak-MiB")
	b.ReportMetric(float64(n)/(b.Elapsed().Seconds()/float64(b.N)), "tokens/s")
	b.ReportMetric(benchenv.LoadAvg(), "load1")
}

// TestShape35BSource checks the benchmarks' weight source on small reads:
// shapes are the replica's, expert reads repeat the pool with period
// shape35BPool, every value is BF16-representable, and a 35B layer's
// weights pass LoadLayer's checks without reading the routed experts.
func TestShape35BSource(t *testing.T) {
	tc := testmodel.Qwen36_35B()
	cfg := shape35BConfig(t, tc)
	src := newShape35BSource(t, tc)
	name := "model.language_model.layers.0.mlp.experts.down_proj"
	sh, ok := src.Shape(name)
	if !ok || len(sh) != 3 || sh[0] != 256 || sh[1] != 2048 || sh[2] != 512 {
		t.Fatalf("shape of %s: %v, %v", name, sh, ok)
	}
	body := int64(2048 * 512)
	a, c := make([]float32, 1000), make([]float32, 1000)
	if err := src.Read(name, a, 3*body+17); err != nil {
		t.Fatal(err)
	}
	if err := src.Read(name, c, (3+shape35BPool)*body+17); err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if a[i] != c[i] {
			t.Fatalf("expert 3 and %d differ at %d", 3+shape35BPool, i)
		}
		if math.Float32bits(a[i])&0xffff != 0 {
			t.Fatalf("value %v is not BF16-representable", a[i])
		}
	}
	if err := src.Read(name, a, 256*body-10); err == nil {
		t.Fatal("read past the end accepted")
	}
	if err := CheckLayer(src, cfg, 3); err != nil {
		t.Fatal(err)
	}
}
