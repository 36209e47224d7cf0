package emulator

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/ttquant/ttquant/safetensors"
)

// peakHeap samples the live heap until stop is called and returns the
// largest value seen, in bytes.
func peakHeap() (stop func() uint64) {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak uint64
	var mu sync.Mutex
	done := make(chan struct{})
	finished := make(chan struct{})
	sample := func() {
		metrics.Read(s)
		mu.Lock()
		peak = max(peak, s[0].Value.Uint64())
		mu.Unlock()
	}
	go func() {
		defer func() { finished <- struct{}{} }()
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	return func() uint64 {
		done <- struct{}{}
		<-finished
		sample()
		return peak
	}
}

// BenchmarkCompareLogits streams two BF16 logits files of a realistic
// vocabulary (248,320, Qwen3.6) from disk and reports tokens/s and the peak
// live heap.
func BenchmarkCompareLogits(b *testing.B) {
	const tokens, vocab = 256, 248320
	dir := b.TempDir()
	r := rand.New(rand.NewPCG(1, 1))
	row := make([]byte, 2*vocab)
	write := func(name string, noise float64) string {
		data := make([]byte, 0, 2*tokens*vocab)
		for t := 0; t < tokens; t++ {
			for i := 0; i < vocab; i++ {
				v := float32(r.NormFloat64()*2 + noise*r.NormFloat64())
				binary.LittleEndian.PutUint16(row[2*i:], uint16(math.Float32bits(v)>>16))
			}
			data = append(data, row...)
		}
		p := filepath.Join(dir, name)
		writeLogitsFile(b, p, "logits", "BF16", []int64{tokens, vocab}, data)
		return p
	}
	refPath, candPath := write("ref.safetensors", 0), write("cand.safetensors", 0.1)
	targets := make([]int64, tokens)
	for i := range targets {
		targets[i] = int64(r.IntN(vocab))
	}
	open := func(p string) *SafetensorsLogits {
		f, err := safetensors.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		l, err := OpenLogits(f, "")
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	runtime.GC()
	stop := peakHeap()
	b.ResetTimer()
	for range b.N {
		if _, err := CompareLogits(context.Background(), open(refPath), open(candPath), targets, nil, CompareOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	peak := stop()
	b.ReportMetric(float64(tokens*b.N)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
}

// BenchmarkMatMul emulates a BF16 × BFP8-decoded 32×4096 by 4096×512
// product at HiFi2 with FP32 Dst and reports emulated multiply-accumulates
// per second (MMAC/s).
func BenchmarkMatMul(b *testing.B) {
	const tokens, in, out = 32, 4096, 512
	r := rand.New(rand.NewPCG(2, 2))
	x := randBF16(r, tokens*in, 1)
	w := randBF16(r, out*in, 0.05)
	b.ResetTimer()
	for range b.N {
		if _, err := MatMul(context.Background(), x, tokens, in, w, out, Config{Fidelity: HiFi2}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(tokens*in*out)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MMAC/s")
}
