package calib

// GPTQ of routed experts at the Qwen3.6-35B-A3B shape with the routed-row
// density of a 128 × 2,048-token calibration (262,144 tokens, top-8 of 256
// experts: 8,192 rows per expert on average), for the projections of
// docs/projections.md. A full layer takes tens of minutes, so the
// benchmarks run a layer of E experts (top-8, hidden 2048, width 512) over
// rows·E/8 tokens: every expert sees on average the rows it would see in the
// full layer, and the per-expert figures carry over to 256 experts. Only
// -bench runs them.
//
//	go test ./calib -run '^$' -bench Shape35B -benchtime 1x -timeout 2h

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/benchenv"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// bf16Experts generates BF16-representable expert weights on demand,
// deterministically from the expert index (uniform, scaled by 1/√fan-in).
type bf16Experts struct {
	hidden, inter int
	seed          uint64
}

func (s bf16Experts) Expert(e int) (*ffn.ExpertWeights, error) {
	r := splitmix{State: s.seed + uint64(e+2)*0x9e3779b97f4a7c15}
	mat := func(rows, cols int) []float32 {
		w := make([]float32, rows*cols)
		sc := float32(1 / math.Sqrt(float64(cols)))
		for i := range w {
			v := (2*r.Unit() - 1) * sc
			b := math.Float32bits(v)
			b += 0x7fff + (b>>16)&1 // round to nearest even BF16
			w[i] = math.Float32frombits(b &^ 0xffff)
		}
		return w
	}
	return &ffn.ExpertWeights{Gate: mat(s.inter, s.hidden), Up: mat(s.inter, s.hidden), Down: mat(s.hidden, s.inter)}, nil
}

// shape35BLayer is a MoE block of the 35B expert shape with e experts.
func shape35BLayer(experts int, shared bool) *ffn.MoE {
	cfg := model.MoEConfig{Hidden: 2048, Experts: experts, TopK: 8, ExpertInter: 512, NormTopK: true}
	if shared {
		cfg.SharedInter = 512
	}
	l := &ffn.MoE{Config: cfg, Experts: bf16Experts{hidden: 2048, inter: 512, seed: 11}}
	l.Router = synthRouter(experts, cfg.Hidden, 3)
	for i := range l.Router {
		l.Router[i] *= 4
	}
	if shared {
		l.Shared, _ = bf16Experts{hidden: 2048, inter: 512, seed: 12}.Expert(SharedExpert)
		l.SharedGate = synthRouter(1, cfg.Hidden, 4)
	}
	return l
}

// shape35BActivations returns calibration and held-out rows.
func shape35BActivations(tb testing.TB, tokens, held int) (Activations, Activations) {
	tb.Helper()
	gen, err := NewSynth(SynthConfig{Hidden: 2048, Seed: 5})
	if err != nil {
		tb.Fatal(err)
	}
	x := make([]float32, (tokens+held)*2048)
	gen.Rows(x, 0, tokens+held)
	return Activations{X: x[:tokens*2048], Tokens: tokens}, Activations{X: x[tokens*2048:], Tokens: held}
}

// expertFlops counts the arithmetic of one routed expert with rows routed
// rows (2 per multiply-add): the gate/up Hessian (lower triangle), the
// SwiGLU intermediate of the quantized gate/up (the down input), the down
// Hessian, the two inverse factors (2n³/3) and GPTQ's column updates
// (rows·cols² per matrix).
func expertFlops(rows float64) float64 {
	const H, I = 2048.0, 512.0
	return rows*H*(H+1) + 2*rows*H*2*I + rows*I*(I+1) + 2*H*H*H/3 + 2*I*I*I/3 + 2*I*H*H + H*I*I
}

// BenchmarkShape35BGPTQ quantizes TTQUANT_BENCH_EXPERTS (default 16)
// routed experts of the 35B shape to BFP4 with GPTQ at 4,096 and 8,192
// routed rows per expert on average (the shared expert left out; it is
// projected from the same per-row cost), with 128 held-out rows per expert
// (2 of 128 sequences held out), one or two experts in flight. Reports
// seconds and CPU-seconds per expert, routed rows per second and GFLOP/s
// of the counted work (expertFlops).
func BenchmarkShape35BGPTQ(b *testing.B) {
	experts := benchenv.PositiveEnv(b, "TTQUANT_BENCH_EXPERTS", 16)
	for _, rows := range []int{8192, 4096} {
		for _, workers := range []int{2, 1} {
			b.Run(fmt.Sprintf("rows=%d/experts=%d/workers=%d", rows, experts, workers), func(b *testing.B) {
				tokens := rows * experts / 8
				cal, held := shape35BActivations(b, tokens, 128*experts/8)
				l := shape35BLayer(experts, false)
				opt := LayerOptions{Workers: workers, SkipShared: true}
				var cpu time.Duration
				var got float64
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c0, _ := benchenv.CPUTime()
					run := NewLayerRun(context.Background(), l, cal, held, opt)
					for range run.Results() {
					}
					rep, err := run.Report()
					if err != nil {
						b.Fatal(err)
					}
					c1, _ := benchenv.CPUTime()
					cpu += c1 - c0
					got = 0
					for _, e := range rep.Experts {
						got += float64(e.Tokens)
					}
				}
				b.StopTimer()
				N, E := float64(b.N), float64(experts)
				wall := b.Elapsed().Seconds() / N
				meanRows := got / E
				fl := expertFlops(meanRows) * E
				b.ReportMetric(wall/E, "s/expert")
				b.ReportMetric(cpu.Seconds()/N/E, "cpu-s/expert")
				b.ReportMetric(meanRows, "rows/expert")
				b.ReportMetric(got/wall, "rows/s")
				b.ReportMetric(fl/wall/1e9, "GFLOP/s")
				b.ReportMetric(fl/(cpu.Seconds()/N)/1e9, "GFLOP/cpu-s")
				b.ReportMetric(benchenv.LoadAvg(), "load1")
			})
		}
	}
}

// BenchmarkShape35BGPTQPeak quantizes a 16-expert 35B-shaped block with
// its shared expert over TTQUANT_BENCH_TOKENS (default 16,384) calibration
// tokens, two experts in flight, and reports the process's peak resident
// set (VmHWM: run it alone in its process), the peak of the Go runtime's
// mapped memory sampled every 10 ms, and the activations' size. The part
// that grows with the tokens (activations, routing, the shared expert's
// all-token work) extrapolates linearly from two runs; the part per
// expert in flight does not depend on the number of experts
// (TestMemoryIndependentOfExperts).
func BenchmarkShape35BGPTQPeak(b *testing.B) {
	tokens := benchenv.PositiveEnv(b, "TTQUANT_BENCH_TOKENS", 16384)
	const experts = 16
	cal, held := shape35BActivations(b, tokens, 256)
	l := shape35BLayer(experts, true)
	runtime.GC()
	baseRSS := benchenv.StatusKiB("VmRSS")
	goMem := benchenv.StartGoMemory(10 * time.Millisecond)
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c0, _ := benchenv.CPUTime()
		if _, err := QuantizeMoELayer(context.Background(), l, cal, held, LayerOptions{Workers: 2}, nil); err != nil {
			b.Fatal(err)
		}
		c1, _ := benchenv.CPUTime()
		cpu += c1 - c0
	}
	b.StopTimer()
	goPeak := goMem.Stop()
	const mib = 1 << 20
	b.ReportMetric(float64(len(cal.X)*4)/mib, "activations-MiB")
	b.ReportMetric(float64(goMem.Base)/mib, "go-before-MiB")
	b.ReportMetric(float64(goPeak)/mib, "go-peak-MiB")
	b.ReportMetric(baseRSS/1024, "rss-before-MiB")
	b.ReportMetric(benchenv.StatusKiB("VmHWM")/1024, "rss-peak-MiB")
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s")
	b.ReportMetric(benchenv.LoadAvg(), "load1")
}

// TestShape35BExperts checks the benchmarks' expert source: shapes, values
// on the BF16 grid, determinism, and distinct experts.
func TestShape35BExperts(t *testing.T) {
	s := bf16Experts{hidden: 64, inter: 16, seed: 11}
	a, _ := s.Expert(3)
	c, _ := s.Expert(3)
	d, _ := s.Expert(4)
	if len(a.Gate) != 16*64 || len(a.Down) != 64*16 {
		t.Fatalf("shapes %d, %d", len(a.Gate), len(a.Down))
	}
	same := true
	for i, v := range a.Up {
		if math.Float32bits(v)&0xffff != 0 {
			t.Fatalf("up[%d] = %v is not BF16-representable", i, v)
		}
		if v != c.Up[i] {
			t.Fatal("expert 3 differs between calls")
		}
		same = same && v == d.Up[i]
	}
	if same {
		t.Fatal("experts 3 and 4 are equal")
	}
	if err := shape35BLayer(16, true).Check(); err != nil {
		t.Fatal(err)
	}
}
