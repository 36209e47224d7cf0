package calib

import (
	"context"
	"fmt"

	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/benchenv"
	"github.com/ttquant/ttquant/internal/model"
	"testing"
	"time"
)

// BenchmarkMoEExperts35B quantizes the routed experts of a reduced MoE
// layer of the Qwen3.6-35B-A3B expert shape (hidden 2048, width 512,
// top-8) with as many calibration tokens per expert as the full layer
// (16,384 tokens over 256 experts: 512 routed tokens per expert on
// average), so that the seconds per expert it reports are those of the
// full layer without its minutes of run time. The shared expert is left
// out (it is one dense job per layer, not per expert); held-out tokens are
// scaled the same way (512 per 256 experts). workers is
// LayerOptions.Workers, the number of experts in flight. Profile with
//
//	go test ./calib -run '^$' -bench 'MoEExperts35B/experts=16/workers=2' -benchtime 1x -cpuprofile cpu.out
func BenchmarkMoEExperts35B(b *testing.B) {
	for _, c := range []struct {
		experts, workers int
		noLoss           bool
	}{{16, 1, false}, {16, 2, false}, {32, 2, false}, {16, 2, true}} {
		experts := c.experts
		name := fmt.Sprintf("experts=%d/workers=%d", experts, c.workers)
		if c.noLoss {
			name += "/no-proxy-loss"
		}
		b.Run(name, func(b *testing.B) {
			cfg := model.MoEConfig{Hidden: 2048, Experts: experts, TopK: 8, ExpertInter: 512, NormTopK: true}
			tokens := 16384 * experts / 256
			held := 512 * experts / 256
			l := synthMoELayer(cfg)
			gen, err := NewSynth(SynthConfig{Hidden: cfg.Hidden, Seed: 5})
			if err != nil {
				b.Fatal(err)
			}
			x := make([]float32, (tokens+held)*cfg.Hidden)
			gen.Rows(x, 0, tokens+held)
			cal := Activations{X: x[:tokens*cfg.Hidden], Tokens: tokens}
			ho := Activations{X: x[tokens*cfg.Hidden:], Tokens: held}
			opt := LayerOptions{Workers: c.workers, MinTokens: 82} // 0.5% of 16,384, as in the full layer
			if c.noLoss {
				g := gptq.DefaultOptions()
				g.NoProxyLoss = true
				opt.GPTQ = &g
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				cpu0, ok0 := benchenv.CPUTime()
				rep, err := QuantizeMoELayer(context.Background(), l, cal, ho, opt, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(time.Since(start).Seconds()/float64(experts), "s/expert")
				if cpu1, ok := benchenv.CPUTime(); ok && ok0 {
					// All goroutines' CPU time: the cost per expert, which
					// wall time on a shared machine does not show.
					b.ReportMetric((cpu1-cpu0).Seconds()/float64(experts), "cpu-s/expert")
				}
				if rep.HeldOut != nil {
					b.ReportMetric(rep.HeldOut.Ratio, "gptq/rtn-mse")
				}
				b.ReportMetric(float64(len(rep.Starved)), "starved")
			}
		})
	}
}
