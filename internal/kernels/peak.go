package kernels

import (
	"sync"
	"time"
)

// Impl names the micro-kernels in use: "avx512f" when the product
// micro-kernels and the peak loop use AVX-512 (the vector helpers stay on
// AVX2), "avx2-fma" for the AVX2 assembly, "go" for the portable twins
// (other architectures, processors without AVX2/FMA, or the purego build
// tag). All three give the same bits. Any value but "go" implies AVX2 and
// FMA.
func Impl() string { return implName() }

// Peak is a measured fused-multiply-add throughput: what the processor
// sustains on independent register-only FMAs, the ceiling for every
// kernel of this package. Each FMA counts as 2 floating-point operations.
type Peak struct {
	Impl    string  `json:"impl"`       // micro-kernel implementation measured (see Impl)
	Workers int     `json:"workers"`    // goroutines run at the same time
	F32     float64 `json:"f32_gflops"` // float32 GFLOP/s, all workers together
	F64     float64 `json:"f64_gflops"` // float64 GFLOP/s, all workers together
}

// MeasurePeak runs the FMA throughput loop on workers goroutines at once
// (workers <= 0 means Workers()) for about d, half of it for float32 and
// half for float64, and keeps the best of eight slices of each half. With
// the assembly kernels the loop keeps twelve independent 256-bit FMA
// chains in flight per goroutine, enough to fill two FMA pipes of latency
// up to six cycles. With the portable twins it
// measures the scalar Go loop instead, which is only a reference point for
// that build, not the machine's peak.
func MeasurePeak(d time.Duration, workers int) Peak {
	if workers <= 0 {
		workers = Workers()
	}
	half := max(d/2, time.Millisecond)
	return Peak{
		Impl:    Impl(),
		Workers: workers,
		F32:     fmaRate(half, workers, fmaLoop32),
		F64:     fmaRate(half, workers, fmaLoop64),
	}
}

// FMAWork32 runs n iterations of MeasurePeak's float32 loop on the calling
// goroutine and returns the floating-point operations it performed. Timed
// against the CPU time it used, it gives the float32 peak per CPU second,
// which a machine shared with other jobs still shows (MeasurePeak's
// per-wall-second rates then fall with the share of the cores the
// process gets).
func FMAWork32(n int) float64 { return fmaLoop32(n) }

// fmaRate runs loop on workers goroutines for about d and returns GFLOP/s.
func fmaRate(d time.Duration, workers int, loop func(int) float64) float64 {
	// Calibrate a chunk of about 100 µs so that the clock is read rarely.
	chunk := 1000
	for {
		t0 := time.Now()
		loop(chunk)
		if time.Since(t0) > 100*time.Microsecond || chunk > 1<<28 {
			break
		}
		chunk *= 2
	}
	// The best of several slices: on a shared machine the peak is what the
	// cores deliver when they are not taken by something else, which is
	// also how the kernels' best runs are compared with it.
	const slices = 8
	best := 0.0
	for s := 0; s < slices; s++ {
		flops := make([]float64, workers)
		var wg sync.WaitGroup
		start := time.Now()
		deadline := start.Add(d / slices)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for time.Now().Before(deadline) {
					flops[w] += loop(chunk)
				}
			}(w)
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		var total float64
		for _, f := range flops {
			total += f
		}
		best = max(best, total/el/1e9)
	}
	return best
}
