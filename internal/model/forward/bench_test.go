package forward

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/benchenv"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// cfg35B is the Qwen3.6-35B-A3B text geometry.
func cfg35B() *model.Config {
	c := &model.Config{Arch: model.ArchQwen35MoE, ModelType: "qwen3_5_moe_text", Prefix: "model.language_model.",
		Hidden: 2048, Layers: 40, Vocab: 248320, Eps: 1e-6,
		Heads: 16, KVHeads: 2, HeadDim: 256, RopeTheta: 1e7, RotaryDim: 64,
		LinKeyHeads: 16, LinValueHeads: 32, LinKeyDim: 128, LinValueDim: 128, ConvKernel: 4,
		Experts: 256, TopK: 8, ExpertInter: 512, SharedInter: 512, NormTopK: true, MTPLayers: 1}
	c.Kinds = make([]model.LayerKind, c.Layers)
	for i := range c.Kinds {
		c.Kinds[i] = model.LinearAttention
		if (i+1)%4 == 0 {
			c.Kinds[i] = model.FullAttention
		}
	}
	return c
}

func synth(seed uint64, n int, scale float32) []float32 {
	r := rand.New(rand.NewPCG(seed, 3))
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * scale
	}
	return v
}

// synthLayer builds a 35B-shaped layer with synthetic weights. The routed
// experts all share one set of matrices (an expert is read from the source
// when it runs in a real model, so this is also the real footprint); the
// router is random, so tokens spread over all experts.
func synthLayer(cfg *model.Config, i int) *Layer {
	H := cfg.Hidden
	s := 1 / float32(math.Sqrt(float64(H)))
	l := &Layer{cfg: cfg, Index: i, Kind: cfg.Kind(i),
		InputNorm: synth(1, H, 0.1), PostNorm: synth(2, H, 0.1)}
	if l.Kind == model.FullAttention {
		nh, nkv, hd := cfg.Heads, cfg.KVHeads, cfg.HeadDim
		l.Attn = &AttentionWeights{In: synth(3, (2*nh*hd+2*nkv*hd)*H, s), O: synth(4, H*nh*hd, s/2),
			QNorm: synth(5, hd, 0.1), KNorm: synth(6, hd, 0.1)}
	} else {
		cd, vd, nv := cfg.ConvDim(), cfg.ValueDim(), cfg.LinValueHeads
		l.GDN = &DeltaNetWeights{In: synth(7, (cd+vd+2*nv)*H, s), Conv: synth(8, cd*cfg.ConvKernel, 0.5),
			DTBias: synth(9, nv, 1), ALog: synth(10, nv, 1), Norm: synth(11, cfg.LinValueDim, 1), Out: synth(12, H*vd, s/2)}
	}
	I, S := cfg.ExpertInter, cfg.SharedInter
	e := &ffn.ExpertWeights{Gate: synth(13, I*H, s), Up: synth(14, I*H, s), Down: synth(15, H*I, s)}
	e.StackGateUp() // as LoadLayer and the expert reader hold them
	list := make(ffn.ExpertList, cfg.Experts)
	for k := range list {
		list[k] = e
	}
	l.MoE = &ffn.MoE{Config: model.MoEConfig{Hidden: H, Experts: cfg.Experts, TopK: cfg.TopK,
		ExpertInter: I, SharedInter: S, NormTopK: true},
		Router: synth(16, cfg.Experts*H, s*4), Experts: list,
		Shared:     &ffn.ExpertWeights{Gate: synth(17, S*H, s), Up: synth(18, S*H, s), Down: synth(19, H*S, s)},
		SharedGate: synth(20, H, s)}
	l.MoE.Shared.StackGateUp()
	return l
}

// Linear-work FLOPs per token of each 35B part (2 per multiply-add).
func moeFlops(c *model.Config) float64 {
	H := float64(c.Hidden)
	return 2 * H * (float64(c.Experts) + 3*float64(c.TopK*c.ExpertInter) + 3*float64(c.SharedInter) + 1)
}
func gdnFlops(c *model.Config) float64 {
	H := float64(c.Hidden)
	return 2 * H * float64(c.ConvDim()+2*c.ValueDim()+2*c.LinValueHeads)
}
func attnFlops(c *model.Config) float64 {
	H := float64(c.Hidden)
	return 2 * H * float64(2*c.Heads*c.HeadDim+2*c.KVHeads*c.HeadDim+c.Heads*c.HeadDim)
}

// sgemmRates measures kernels.Sgemm on a 2048³ product (the shape of the
// projections): GFLOP per wall second and per CPU second, best of three.
var sgemmRates = sync.OnceValues(func() (wall, cpu float64) {
	const n = 2048
	a, b, c := synth(1, n*n, 1), synth(2, n*n, 1), make([]float32, n*n)
	for i := 0; i < 3; i++ {
		t, c0 := time.Now(), benchenv.CPU().Seconds()
		kernels.Sgemm(false, true, n, n, n, 1, a, n, b, n, 0, c, n)
		wall = max(wall, 2*n*n*n/time.Since(t).Seconds()/1e9)
		cpu = max(cpu, 2*n*n*n/(benchenv.CPU().Seconds()-c0)/1e9)
	}
	return wall, cpu
})

// cpuTimer measures the CPU seconds a benchmark's loop uses.
type cpuTimer struct{ start, total float64 }

func (c *cpuTimer) begin() { c.start = benchenv.CPU().Seconds() }
func (c *cpuTimer) end()   { c.total += benchenv.CPU().Seconds() - c.start }

// report gives tokens/s and the linear work's GFLOP/s per wall second, and
// per CPU second beside the SGEMM rate per CPU second: on a shared machine
// the per-CPU-second fraction is the meaningful one.
func report(b *testing.B, ct *cpuTimer, tokens int, linFlopsPerToken float64) {
	sec := b.Elapsed().Seconds() / float64(b.N)
	flops := linFlopsPerToken * float64(tokens)
	_, scpu := sgemmRates()
	b.ReportMetric(float64(tokens)/sec, "tokens/s")
	b.ReportMetric(flops/sec/1e9, "GFLOP/s")
	if ct.total > 0 {
		g := flops * float64(b.N) / ct.total / 1e9
		b.ReportMetric(g, "GFLOP/cpu-s")
		b.ReportMetric(scpu, "sgemm-GFLOP/cpu-s")
		b.ReportMetric(g/scpu, "sgemm-frac")
	}
}

const benchSeq = 2048

func benchInput(c *model.Config) []float32 { return synth(99, benchSeq*c.Hidden, 1) }

// BenchmarkMoELayer35B: the 35B MoE block (256 experts of width 512, top-8,
// shared expert) on one 2,048-token sequence.
func BenchmarkMoELayer35B(b *testing.B) {
	c := cfg35B()
	l := synthLayer(c, 0)
	x := benchInput(c)
	sgemmRates()
	var ct cpuTimer
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ct.begin()
		if _, err := l.moe(x, benchSeq, nil); err != nil {
			b.Fatal(err)
		}
		ct.end()
	}
	report(b, &ct, benchSeq, moeFlops(c))
}

func noEmit(Site, []float32, int) error { return nil }

// BenchmarkDeltaNetLayer35B: the 35B Gated DeltaNet mixer (projections,
// convolution, chunked delta rule, gated norm, out_proj) on a 2,048-token
// prefill. GFLOP/s counts the projections only.
func BenchmarkDeltaNetLayer35B(b *testing.B) {
	c := cfg35B()
	l := synthLayer(c, 0)
	x := benchInput(c)
	sgemmRates()
	var ct cpuTimer
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ct.begin()
		if _, err := l.deltaNet(&Batch{Lens: []int{benchSeq}, X: x}, x, noEmit); err != nil {
			b.Fatal(err)
		}
		ct.end()
	}
	report(b, &ct, benchSeq, gdnFlops(c))
}

// BenchmarkAttentionLayer35B: the 35B gated attention mixer on a 2,048-token
// prefill (blockwise causal attention). GFLOP/s counts the projections
// only.
func BenchmarkAttentionLayer35B(b *testing.B) {
	c := cfg35B()
	l := synthLayer(c, 3)
	x := benchInput(c)
	sgemmRates()
	var ct cpuTimer
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ct.begin()
		if _, err := l.attention(&Batch{Lens: []int{benchSeq}, X: x}, x, noEmit); err != nil {
			b.Fatal(err)
		}
		ct.end()
	}
	report(b, &ct, benchSeq, attnFlops(c))
}

// BenchmarkCalibration35B times one 2,048-token sequence through a Gated
// DeltaNet layer, an attention layer (both with their MoE blocks) and
// projects the 35B calibration forward: 262,144 tokens through 30 Gated
// DeltaNet + 10 attention layers + the MTP layer (attention + MoE).
func BenchmarkCalibration35B(b *testing.B) {
	c := cfg35B()
	gdn, att := synthLayer(c, 0), synthLayer(c, 3)
	x := benchInput(c)
	_, scpu := sgemmRates()
	var tg, ta time.Duration
	var cg, ca float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t, c0 := time.Now(), benchenv.CPU().Seconds()
		if err := gdn.Forward(&Batch{Lens: []int{benchSeq}, X: append([]float32(nil), x...)}, nil); err != nil {
			b.Fatal(err)
		}
		tg += time.Since(t)
		cg += benchenv.CPU().Seconds() - c0
		t, c0 = time.Now(), benchenv.CPU().Seconds()
		if err := att.Forward(&Batch{Lens: []int{benchSeq}, X: append([]float32(nil), x...)}, nil); err != nil {
			b.Fatal(err)
		}
		ta += time.Since(t)
		ca += benchenv.CPU().Seconds() - c0
	}
	n := float64(b.N)
	seqs := 262144.0 / benchSeq
	perSeq := (30*tg.Seconds() + 11*ta.Seconds()) / n
	perSeqCPU := (30*cg + 11*ca) / n
	b.ReportMetric(perSeq*seqs/3600, "projected-hours")
	b.ReportMetric(perSeqCPU*seqs/3600, "projected-cpu-hours")
	flops := (30*(gdnFlops(c)+moeFlops(c)) + 11*(attnFlops(c)+moeFlops(c))) * benchSeq
	b.ReportMetric(flops/perSeq/1e9, "GFLOP/s")
	if perSeqCPU > 0 {
		b.ReportMetric(flops/perSeqCPU/1e9, "GFLOP/cpu-s")
		b.ReportMetric(flops/perSeqCPU/1e9/scpu, "sgemm-frac")
	}
}

// BenchmarkLayerAtATimePeak35B runs 16 sequences × 2,048 tokens through one
// 35B Gated DeltaNet + MoE layer (as a calibration pass does, layer by
// layer) and reports the peak of the Go runtime's total memory, sampled
// every 5 ms. The residual stream of the batch is 256 MiB.
func BenchmarkLayerAtATimePeak35B(b *testing.B) {
	c := cfg35B()
	l := synthLayer(c, 0)
	const seqs = 16
	lens := make([]int, seqs)
	for i := range lens {
		lens[i] = benchSeq
	}
	x := synth(5, seqs*benchSeq*c.Hidden, 1)
	runtime.GC()
	goMem := benchenv.StartGoMemory(5 * time.Millisecond)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := l.Forward(&Batch{Lens: lens, X: x}, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	goPeak := goMem.Stop()
	b.ReportMetric(float64(goPeak)/(1<<20), "peak-MiB")
	b.ReportMetric(float64(goMem.Base)/(1<<20), "before-MiB")
	b.ReportMetric(float64(seqs*benchSeq)/(b.Elapsed().Seconds()/float64(b.N)), "tokens/s")
}
