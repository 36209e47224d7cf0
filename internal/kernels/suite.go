package kernels

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// BenchResult is the measurement of one headline kernel.
type BenchResult struct {
	Name      string  `json:"name"`
	Shape     string  `json:"shape"`
	Precision string  `json:"precision"` // "float32" or "float64": the peak it is compared with
	FLOPs     float64 `json:"flops"`     // floating-point operations per run (see Note)
	Runs      int     `json:"runs"`
	Best      float64 `json:"best_seconds"`
	Median    float64 `json:"median_seconds"`
	GFLOPS    float64 `json:"gflops"`        // FLOPs / Best
	PeakFrac  float64 `json:"peak_fraction"` // GFLOPS / measured peak of the same precision
	Note      string  `json:"note,omitempty"`
}

// BenchReport is what RunBench measured.
type BenchReport struct {
	Impl    string        `json:"impl"`
	Workers int           `json:"workers"`
	Peak    Peak          `json:"peak"`
	Results []BenchResult `json:"results"`
}

// Result returns the result with the given name.
func (r *BenchReport) Result(name string) (BenchResult, bool) {
	for _, x := range r.Results {
		if x.Name == name {
			return x, true
		}
	}
	return BenchResult{}, false
}

// BenchOptions configures RunBench.
type BenchOptions struct {
	// Duration is the total time to spend (about); 0 means one minute.
	Duration time.Duration
	// Small replaces the production shapes by ones 8 times smaller in
	// each dimension (for tests and quick checks).
	Small bool
	// Progress, when set, receives one line per finished measurement.
	Progress func(string)
}

type benchCase struct {
	name, shape, prec, note string
	flops                   float64
	setup                   func() func() error // returns the timed run
}

// Headline shapes: the Hessian of 4096 tokens × 2048 features, the GPTQ
// solves of a 768×2048 and a 2048×768 weight (out×in) with block size 128,
// a routed-expert matmul of 4096 tokens, and a float64 GEMM.
//
// It is long by design: a table, one entry per headline shape.
func benchCases(small bool) []benchCase {
	d := 1
	if small {
		d = 8
	}
	rng := rand.New(rand.NewPCG(1, 2))
	f32 := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	f64 := func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = rng.NormFloat64()
		}
		return x
	}
	var cs []benchCase

	{
		k, n := 4096/d, 2048/d
		cs = append(cs, benchCase{
			name: "hessian", shape: fmt.Sprintf("XᵀX, X %d×%d", k, n), prec: "float32",
			flops: float64(k) * float64(n) * float64(n+1),
			note: fmt.Sprintf("counts the lower triangle, k·n·(n+1); a full product counts 2·k·n², %.3g× more",
				2*float64(n)/float64(n+1)),
			setup: func() func() error {
				x := f32(k * n)
				c := make([]float64, n*n)
				return func() error { SyrkLower64(n, k, x, n, c, n); return nil }
			},
		})
	}
	for _, sh := range [][2]int{{768, 2048}, {2048, 768}} {
		rows, cols, bs := sh[0]/d, sh[1]/d, 128/d
		var fl float64
		for i1 := 0; i1 < cols; i1 += bs {
			i2 := min(i1+bs, cols)
			fl += 2 * float64(rows) * float64(i2-i1) * float64(cols-i2)
		}
		cs = append(cs, benchCase{
			name: fmt.Sprintf("gptq-update-%dx%d", rows, cols), shape: fmt.Sprintf("W[:, i2:] −= E·U[i1:i2, i2:], W %d×%d, block %d", rows, cols, bs),
			prec: "float32", flops: fl, note: "all lazy block updates of one GPTQ solve",
			setup: func() func() error {
				w := f32(rows * cols)
				u := f32(cols * cols)
				e := f32(rows * bs)
				return func() error {
					for i1 := 0; i1 < cols; i1 += bs {
						i2 := min(i1+bs, cols)
						Sgemm(false, false, rows, cols-i2, i2-i1, -1, e, bs, u[i1*cols+i2:], cols, 1, w[i2:], cols)
					}
					return nil
				}
			},
		})
	}
	for _, n0 := range []int{2048, 768} {
		n := n0 / d
		cs = append(cs, benchCase{
			name: fmt.Sprintf("inverse-factor-%d", n), shape: fmt.Sprintf("U with UᵀU = H⁻¹, H %d×%d", n, n),
			prec: "float64", flops: 2 * float64(n) * float64(n) * float64(n) / 3,
			note: "Cholesky n³/3 plus triangular inverse n³/3",
			setup: func() func() error {
				x := f64(n * n)
				h := make([]float64, n*n)
				// H = XᵀX/n + I: well conditioned, positive definite.
				Dgemm(true, false, n, n, n, 1/float64(n), x, n, x, n, 0, h, n)
				for i := 0; i < n; i++ {
					h[i*n+i]++
				}
				u := make([]float64, n*n)
				return func() error { return CholInvUpper(n, h, n, u, n) }
			},
		})
	}
	{
		m, n, k := 4096/d, 768/d, 2048/d
		cs = append(cs, benchCase{
			name: "sgemm", shape: fmt.Sprintf("C %d×%d += A %d×%d · B %d×%d", m, n, m, k, k, n), prec: "float32",
			flops: 2 * float64(m) * float64(n) * float64(k), note: "a routed-expert projection of a token batch",
			setup: func() func() error {
				a, b, c := f32(m*k), f32(k*n), make([]float32, m*n)
				return func() error { Sgemm(false, false, m, n, k, 1, a, k, b, n, 1, c, n); return nil }
			},
		})
	}
	{
		n := 1024 / d
		cs = append(cs, benchCase{
			name: "dgemm", shape: fmt.Sprintf("C %d×%d += A·Bᵀ, k %d", n, n, n), prec: "float64",
			flops: 2 * float64(n) * float64(n) * float64(n),
			setup: func() func() error {
				a, b, c := f64(n*n), f64(n*n), make([]float64, n*n)
				return func() error { Dgemm(false, true, n, n, n, 1, a, n, b, n, 1, c, n); return nil }
			},
		})
	}
	return cs
}

// RunBench measures the FMA peak and the headline kernels, spending about
// opt.Duration in total (at least one timed run per kernel after a
// warm-up run). The peak is sampled at the start and again before every
// kernel; the best sample is the denominator of every PeakFrac, and each
// kernel's rate is that of its best run. It stops early with ctx's error
// when ctx is cancelled.
func RunBench(ctx context.Context, opt BenchOptions) (*BenchReport, error) {
	total := opt.Duration
	if total <= 0 {
		total = time.Minute
	}
	progress := opt.Progress
	if progress == nil {
		progress = func(string) {}
	}
	cases := benchCases(opt.Small)
	peakTime := max(total/20, 200*time.Millisecond)
	share := (total - peakTime) / time.Duration(len(cases))
	rep := &BenchReport{Impl: Impl(), Workers: Workers()}
	rep.Peak = MeasurePeak(peakTime, 0)
	progress(fmt.Sprintf("peak: %.1f GFLOP/s float32, %.1f GFLOP/s float64 (%d workers, %s)",
		rep.Peak.F32, rep.Peak.F64, rep.Peak.Workers, rep.Peak.Impl))
	for _, c := range cases {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		// Sample the peak again between cases: on a shared machine the
		// best peak seen during the whole run is the fairest denominator.
		p := MeasurePeak(max(share/20, 20*time.Millisecond), 0)
		rep.Peak.F32 = max(rep.Peak.F32, p.F32)
		rep.Peak.F64 = max(rep.Peak.F64, p.F64)
		run := c.setup()
		if err := run(); err != nil { // warm-up
			return rep, fmt.Errorf("%s: %w", c.name, err)
		}
		var times []float64
		start := time.Now()
		for len(times) == 0 || time.Since(start) < share {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			t0 := time.Now()
			if err := run(); err != nil {
				return rep, fmt.Errorf("%s: %w", c.name, err)
			}
			times = append(times, time.Since(t0).Seconds())
		}
		slices.Sort(times)
		r := BenchResult{Name: c.name, Shape: c.shape, Precision: c.prec, FLOPs: c.flops,
			Runs: len(times), Best: times[0], Median: times[len(times)/2], Note: c.note}
		r.GFLOPS = c.flops / r.Best / 1e9
		rep.Results = append(rep.Results, r)
		progress(fmt.Sprintf("%s: %.1f GFLOP/s, best %.4fs over %d runs", r.Name, r.GFLOPS, r.Best, r.Runs))
	}
	for i := range rep.Results {
		r := &rep.Results[i]
		peak := rep.Peak.F32
		if r.Precision == "float64" {
			peak = rep.Peak.F64
		}
		if peak > 0 {
			r.PeakFrac = r.GFLOPS / peak
		}
	}
	progress(fmt.Sprintf("best peak seen: %.1f GFLOP/s float32, %.1f GFLOP/s float64", rep.Peak.F32, rep.Peak.F64))
	return rep, nil
}
