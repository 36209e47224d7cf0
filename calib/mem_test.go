package calib

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// synthExperts generates expert weights on demand, deterministically from
// the expert index, so that a layer of any size needs no stored weights.
type synthExperts struct {
	hidden, inter int
	seed          uint64
}

func (s synthExperts) Expert(e int) (*ffn.ExpertWeights, error) {
	rng := splitmix{State: s.seed + uint64(e)*0x9e3779b97f4a7c15}
	mat := func(rows, cols int) []float32 {
		w := make([]float32, rows*cols)
		sc := 1 / sqrtApprox(float32(cols))
		for i := range w {
			w[i] = (2*rng.Unit() - 1) * sc
		}
		return w
	}
	return &ffn.ExpertWeights{Gate: mat(s.inter, s.hidden), Up: mat(s.inter, s.hidden), Down: mat(s.hidden, s.inter)}, nil
}

// synthMoELayer builds a layer of the given shape with generated weights.
func synthMoELayer(cfg model.MoEConfig) *ffn.MoE {
	l := &ffn.MoE{Config: cfg, Experts: synthExperts{hidden: cfg.Hidden, inter: cfg.ExpertInter, seed: 77}}
	l.Router = synthRouter(cfg.Experts, cfg.Hidden, 3)
	for i := range l.Router {
		l.Router[i] *= 4
	}
	if cfg.SharedInter > 0 {
		l.Shared, _ = synthExperts{hidden: cfg.Hidden, inter: cfg.SharedInter, seed: 99}.Expert(0)
		l.SharedGate = synthRouter(1, cfg.Hidden, 4)
	}
	return l
}

// peakHeap runs f while sampling runtime.MemStats.HeapInuse every
// interval and returns the largest value seen (bytes).
func peakHeap(interval time.Duration, f func() error) (uint64, error) {
	var peak atomic.Uint64
	sample := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > peak.Load() {
			peak.Store(ms.HeapInuse)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	err := f()
	close(stop)
	wg.Wait()
	sample()
	return peak.Load(), err
}

// layerPeak quantizes a generated layer and returns the peak heap in use.
func layerPeak(tb testing.TB, cfg model.MoEConfig, tokens, heldOut, workers int, interval time.Duration) (uint64, *LayerReport) {
	tb.Helper()
	l := synthMoELayer(cfg)
	gen, err := NewSynth(SynthConfig{Hidden: cfg.Hidden, Seed: 5})
	if err != nil {
		tb.Fatal(err)
	}
	x := make([]float32, (tokens+heldOut)*cfg.Hidden)
	gen.Rows(x, 0, tokens+heldOut)
	cal := Activations{X: x[:tokens*cfg.Hidden], Tokens: tokens}
	held := Activations{X: x[tokens*cfg.Hidden:], Tokens: heldOut}
	runtime.GC()
	var rep *LayerReport
	peak, err := peakHeap(interval, func() error {
		var err error
		rep, err = QuantizeMoELayer(context.Background(), l, cal, held, LayerOptions{Workers: workers}, func(r *ExpertResult) error {
			return nil // a checkpoint writer would pack and write the expert here
		})
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return peak, rep
}

// liveHeap forces a collection and returns the bytes of heap objects it
// found live (runtime/metrics' /gc/heap/live:bytes). Unlike sampled
// HeapInuse it does not depend on when the collector happened to run, so it
// measures what the program retains, not how much garbage a loaded machine
// let accumulate.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// layerLivePeak quantizes a generated layer and returns the largest live
// heap seen at the points where each expert's result is delivered (the
// moments a streaming writer would hold the most).
func layerLivePeak(tb testing.TB, cfg model.MoEConfig, tokens, heldOut, workers int) uint64 {
	tb.Helper()
	l := synthMoELayer(cfg)
	gen, err := NewSynth(SynthConfig{Hidden: cfg.Hidden, Seed: 5})
	if err != nil {
		tb.Fatal(err)
	}
	x := make([]float32, (tokens+heldOut)*cfg.Hidden)
	gen.Rows(x, 0, tokens+heldOut)
	cal := Activations{X: x[:tokens*cfg.Hidden], Tokens: tokens}
	held := Activations{X: x[tokens*cfg.Hidden:], Tokens: heldOut}
	var mu sync.Mutex
	var peak uint64
	_, err = QuantizeMoELayer(context.Background(), l, cal, held, LayerOptions{Workers: workers}, func(r *ExpertResult) error {
		// A checkpoint writer would pack and write the expert here.
		mu.Lock()
		defer mu.Unlock()
		peak = max(peak, liveHeap())
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return peak
}

// TestMemoryIndependentOfExperts quantizes the same tokens through layers of
// 16 and of 96 experts (same expert shape) and checks that the heap retained
// while results are delivered does not grow with the number of experts:
// results are streamed, experts are read on demand, and only a bounded
// window of experts is in flight. The figure is the live heap after a forced
// collection at every delivery, so machine load cannot change it beyond
// which experts happen to be in flight.
func TestMemoryIndependentOfExperts(t *testing.T) {
	var peaks []uint64
	for _, experts := range []int{16, 96} {
		cfg := model.MoEConfig{Hidden: 128, Experts: experts, TopK: 4, ExpertInter: 64, SharedInter: 64, NormTopK: true}
		p := layerLivePeak(t, cfg, 1024, 64, 2)
		t.Logf("%d experts: peak live heap %.1f MiB", experts, float64(p)/(1<<20))
		peaks = append(peaks, p)
	}
	// 96 experts' quantized matrices alone would be 96×3×64×128×4 B =
	// 9 MiB if they were retained.
	if peaks[1] > peaks[0]+peaks[0]/4+2<<20 {
		t.Errorf("peak live heap grew from %.1f MiB (16 experts) to %.1f MiB (96 experts)", float64(peaks[0])/(1<<20), float64(peaks[1])/(1<<20))
	}
}

// BenchmarkMoELayer35B quantizes one synthetic MoE layer of the real
// Qwen3.6-35B-A3B shape (hidden 2048, 256 experts of width 512, top-8, a
// shared expert of width 512, 16,384 calibration tokens) with GPTQ BFP4 and
// reports the peak heap in use. The 32-expert variant processes the same
// tokens: its peak should be the same, since memory does not depend on the
// number of experts. Slow (minutes): run with
//
//	go test ./calib -run '^$' -bench MoELayer35B -benchtime 1x -timeout 2h
func BenchmarkMoELayer35B(b *testing.B) {
	for _, experts := range []int{32, 256} {
		b.Run(fmt.Sprintf("experts=%d", experts), func(b *testing.B) {
			cfg := model.MoEConfig{Hidden: 2048, Experts: experts, TopK: 8, ExpertInter: 512, SharedInter: 512, NormTopK: true}
			for i := 0; i < b.N; i++ {
				start := time.Now()
				p, rep := layerPeak(b, cfg, 16384, 512, 2, 20*time.Millisecond)
				b.ReportMetric(float64(p)/(1<<20), "peak-heap-MiB")
				b.ReportMetric(time.Since(start).Seconds()/float64(experts), "s/expert")
				if rep.HeldOut != nil {
					b.ReportMetric(rep.HeldOut.Ratio, "gptq/rtn-mse")
				}
				if p >= 4<<30 {
					b.Errorf("peak heap %.0f MiB, limit 4 GiB", float64(p)/(1<<20))
				}
			}
		})
	}
}
