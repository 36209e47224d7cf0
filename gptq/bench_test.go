package gptq

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/benchenv"
	"github.com/ttquant/ttquant/internal/kernels"
)

func randActivations(tokens, cols int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, tokens*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	// A little correlation between neighbouring features.
	for t := 0; t < tokens; t++ {
		row := x[t*cols : (t+1)*cols]
		for j := 1; j < cols; j++ {
			row[j] += 0.5 * row[j-1]
		}
	}
	return x
}

// BenchmarkHessian accumulates 4096 tokens × 2048 features. GFLOP/s counts
// the multiply-adds of the symmetric product actually formed, n·d·(d+1).
func BenchmarkHessian(b *testing.B) {
	const tokens, cols = 4096, 2048
	x := randActivations(tokens, cols, 1)
	b.SetBytes(int64(len(x) * 4))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h := NewHessian(cols)
		if err := h.Add(x, tokens); err != nil {
			b.Fatal(err)
		}
		_ = h.Matrix()
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	// GFLOP/s counts the work of the triangle, n(n+1)·k; full-GFLOP/s
	// counts 2·n²·k, as a general XᵀX product (and PyTorch's x.T @ x) does.
	b.ReportMetric(float64(tokens)*cols*(cols+1)/sec/1e9, "GFLOP/s")
	b.ReportMetric(2*float64(tokens)*cols*cols/sec/1e9, "full-GFLOP/s")
	b.ReportMetric(sec, "s/hessian")
}

// BenchmarkHessianPooled is BenchmarkHessian on the allocation-free path
// for repeated Hessians: Finish builds H in the accumulator's storage and
// RecycleMatrix hands it to the next NewHessian (compare B/op and
// allocs/op with -benchmem).
func BenchmarkHessianPooled(b *testing.B) {
	const tokens, cols = 4096, 2048
	x := randActivations(tokens, cols, 1)
	b.SetBytes(int64(len(x) * 4))
	RecycleMatrix(NewHessian(cols).Finish()) // warm the pool
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h := NewHessian(cols)
		if err := h.Add(x, tokens); err != nil {
			b.Fatal(err)
		}
		RecycleMatrix(h.Finish())
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(tokens)*cols*(cols+1)/sec/1e9, "GFLOP/s")
	b.ReportMetric(sec, "s/hessian")
}

func benchProblem(b *testing.B, rows, cols int) ([]float32, []float64) {
	hs := NewHessian(cols)
	tokens := 2 * cols
	if err := hs.Add(randActivations(tokens, cols, 2), tokens); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(0.02 * rng.NormFloat64())
	}
	return w, hs.Matrix()
}

// solveFLOPs counts the floating-point operations of one Quantize call on
// a rows×cols (out×in) matrix with block size bs: the factorization of the
// cols×cols Hessian (Cholesky and triangular inverse, (2/3)·cols³), the
// lazy block products, the in-block rank-1 updates, and, with report, the
// two ΔᵀΔ products of the proxy losses (rows·cols·(cols+1) each).
func solveFLOPs(rows, cols, bs int, report bool) float64 {
	r, c := float64(rows), float64(cols)
	fl := 2 * c * c * c / 3
	fl += kernels.GPTQUpdateFLOPs(rows, cols, bs)
	for i1 := 0; i1 < cols; i1 += bs {
		nb := float64(min(bs, cols-i1))
		fl += r * nb * (nb - 1) // Σ 2·rows·(nb−1−i) over the block
	}
	if report {
		fl += 2 * r * c * (c + 1)
	}
	return fl
}

// BenchmarkGPTQ quantizes out×in matrices onto BFP4 (input axis) with block
// size 128 in float32 mode, from the Hessian (validation, damping and
// factorization included) to the result: "report" includes the proxy
// losses of GPTQ and RTN (the default), "noreport" sets NoProxyLoss, as the
// reference implementation computes no such loss. s/solve is the time per
// call, cpu-s/solve the process CPU time per call (all goroutines) and
// GFLOP/s counts the work of solveFLOPs per wall second.
func BenchmarkGPTQ(b *testing.B) {
	for _, shape := range [][2]int{{768, 2048}, {2048, 768}} {
		rows, cols := shape[0], shape[1]
		for _, report := range []bool{true, false} {
			name := "report"
			if !report {
				name = "noreport"
			}
			b.Run(fmt.Sprintf("%dx%d/%s", rows, cols, name), func(b *testing.B) {
				w, h := benchProblem(b, rows, cols)
				g := NewBFPGrid(bfp.BFP4, bfp.AxisInput)
				opt := DefaultOptions()
				opt.NoProxyLoss = !report
				b.ResetTimer()
				cpu0, cpuOK := benchenv.CPUTime()
				for i := 0; i < b.N; i++ {
					if _, err := Quantize(w, rows, cols, h, g, opt); err != nil {
						b.Fatal(err)
					}
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				if cpu1, ok := benchenv.CPUTime(); ok && cpuOK {
					// CPU time of all goroutines: on a machine shared with
					// other work it shows the cost when wall time cannot.
					b.ReportMetric((cpu1-cpu0).Seconds()/float64(b.N), "cpu-s/solve")
				}
				b.ReportMetric(sec, "s/solve")
				b.ReportMetric(solveFLOPs(rows, cols, opt.BlockSize, report)/sec/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkGPTQVariants times the same 768×2048 and 2048×768 BFP4 problems
// without the proxy-loss report and with sub-blocked in-block updates.
func BenchmarkGPTQVariants(b *testing.B) {
	for _, shape := range [][2]int{{768, 2048}, {2048, 768}} {
		rows, cols := shape[0], shape[1]
		for _, v := range []struct {
			name string
			opt  Options
		}{
			{"noloss", Options{BlockSize: 128, PercDamp: 0.01, NoProxyLoss: true}},
			{"noloss_sub16", Options{BlockSize: 128, SubBlock: 16, PercDamp: 0.01, NoProxyLoss: true}},
		} {
			b.Run(fmt.Sprintf("%dx%d/%s", rows, cols, v.name), func(b *testing.B) {
				w, h := benchProblem(b, rows, cols)
				g := NewBFPGrid(bfp.BFP4, bfp.AxisInput)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := Quantize(w, rows, cols, h, g, v.opt); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/matrix")
			})
		}
	}
}

// BenchmarkGPTQExponent times the 768×2048 and 2048×768 BFP4 solves of
// BenchmarkGPTQ (no proxy-loss report) on both axes with the default
// exponent rule (max) and with ExpSearch, interleaved: each iteration runs
// both solves, in alternating order, and times each, so both see the same
// machine load and search/max is the cost of the search. Reported beside
// the solve rates: the FMA peak measured in the same process just before
// (peak-GFLOP/s, and each rate's share of it), the load average, and the
// ratio of the process CPU time the two solves took.
func BenchmarkGPTQExponent(b *testing.B) {
	for _, shape := range [][2]int{{768, 2048}, {2048, 768}} {
		rows, cols := shape[0], shape[1]
		for _, axis := range []bfp.Axis{bfp.AxisInput, bfp.AxisOutput} {
			b.Run(fmt.Sprintf("%dx%d/%v", rows, cols, axis), func(b *testing.B) {
				w, h := benchProblem(b, rows, cols)
				g := NewBFPGrid(bfp.BFP4, axis)
				opts := [2]Options{DefaultOptions(), DefaultOptions()}
				opts[1].Exponent = ExpSearch
				for i := range opts {
					opts[i].NoProxyLoss = true
				}
				pk := kernels.MeasurePeak(500*time.Millisecond, 0)
				var spent, cpu [2]time.Duration
				cpuOK := true
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					for k := range 2 {
						r := (i + k) % 2
						c0, ok0 := benchenv.CPUTime()
						t0 := time.Now()
						if _, err := Quantize(w, rows, cols, h, g, opts[r]); err != nil {
							b.Fatal(err)
						}
						spent[r] += time.Since(t0)
						c1, ok1 := benchenv.CPUTime()
						cpu[r] += c1 - c0
						cpuOK = cpuOK && ok0 && ok1
					}
				}
				fl := solveFLOPs(rows, cols, DefaultOptions().BlockSize, false)
				for r, name := range []string{"max", "search"} {
					sec := spent[r].Seconds() / float64(b.N)
					b.ReportMetric(sec, name+"-s/solve")
					b.ReportMetric(fl/sec/1e9/pk.F32, name+"-peak-frac")
				}
				b.ReportMetric(fl/(spent[0].Seconds()/float64(b.N))/1e9, "max-GFLOP/s")
				b.ReportMetric(pk.F32, "peak-GFLOP/s")
				b.ReportMetric(spent[1].Seconds()/spent[0].Seconds(), "search/max")
				if cpuOK {
					// Process CPU time (all goroutines): on a shared machine
					// the cost when wall time is inflated by waiting.
					b.ReportMetric(cpu[1].Seconds()/cpu[0].Seconds(), "cpu-search/max")
				}
				b.ReportMetric(benchenv.LoadAvg(), "load1")
			})
		}
	}
}
