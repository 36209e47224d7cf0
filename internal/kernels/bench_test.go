package kernels

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/benchenv"
)

var (
	peakOnce sync.Once
	peak     Peak
)

// measuredPeak measures the FMA peak once per test binary, with the
// default number of workers.
func measuredPeak() Peak {
	peakOnce.Do(func() { peak = MeasurePeak(500*time.Millisecond, 0) })
	return peak
}

// benchHeadline runs one of the headline cases of RunBench and reports
// GFLOP/s and the fraction of the FMA peak measured in this process.
func benchHeadline(b *testing.B, name string, small bool) {
	for _, c := range benchCases(small) {
		if c.name != name {
			continue
		}
		pk := measuredPeak()
		run := c.setup()
		if err := run(); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := run(); err != nil {
				b.Fatal(err)
			}
		}
		g := c.flops * float64(b.N) / b.Elapsed().Seconds() / 1e9
		b.ReportMetric(g, "GFLOP/s")
		p := pk.F32
		if c.prec == "float64" {
			p = pk.F64
		}
		b.ReportMetric(g/p, "peak-frac")
		b.ReportMetric(p, "peak-GFLOP/s")
		return
	}
	b.Fatalf("no headline case %q", name)
}

// BenchmarkPeak reports the FMA throughput loop itself, and the float32
// FMA work done per CPU-second of the process: on a shared machine that
// rate, against the idle machine's per-core peak, tells how much slower a
// CPU-second is at the moment (cache and memory contention), which CPU
// times measured at the same moment need to be read with.
func BenchmarkPeak(b *testing.B) {
	for i := 0; i < b.N; i++ {
		p := MeasurePeak(200*time.Millisecond, 0)
		b.ReportMetric(p.F32, "f32-GFLOP/s")
		b.ReportMetric(p.F64, "f64-GFLOP/s")
	}
	// A fixed amount of float32 FMA work on one goroutine.
	c0, ok0 := benchenv.CPUTime()
	var fl float64
	for fl < 20e9 {
		fl += fmaLoop32(1 << 20)
	}
	if c1, ok := benchenv.CPUTime(); ok && ok0 && c1 > c0 {
		b.ReportMetric(fl/(c1-c0).Seconds()/1e9, "f32-GFLOP/cpu-s")
	}
}

// BenchmarkHessian4096x2048 is the acceptance case: H += XᵀX for 4096
// tokens × 2048 features, counting the lower triangle (k·n·(n+1) flops).
func BenchmarkHessian4096x2048(b *testing.B)   { benchHeadline(b, "hessian", false) }
func BenchmarkGPTQUpdate768x2048(b *testing.B) { benchHeadline(b, "gptq-update-768x2048", false) }
func BenchmarkGPTQUpdate2048x768(b *testing.B) { benchHeadline(b, "gptq-update-2048x768", false) }
func BenchmarkInverseFactor2048(b *testing.B)  { benchHeadline(b, "inverse-factor-2048", false) }
func BenchmarkInverseFactor768(b *testing.B)   { benchHeadline(b, "inverse-factor-768", false) }
func BenchmarkSgemm4096x768x2048(b *testing.B) { benchHeadline(b, "sgemm", false) }
func BenchmarkDgemm1024(b *testing.B)          { benchHeadline(b, "dgemm", false) }

// BenchmarkInverseFactor32 times GPTQ's float32 inverse factor
// (Cholesky plus triangular inverse, 2n³/3 flops) at the sizes compared
// with LAPACK's spotrf+strtri, with 1 and 2 workers: "rev" is
// CholInvUpperRev32, what GPTQ runs (the reversed copy of H is made by
// its damping pass; here it is refreshed outside the timed region, as a
// LAPACK harness copies its input outside), "full" is CholInvUpper32
// including its reordering pass. cpu-s is the process CPU time per call
// (timed region only).
func BenchmarkInverseFactor32(b *testing.B) {
	for _, n := range []int{512, 1024, 2048} {
		r := rand.New(rand.NewPCG(uint64(n), 7))
		h := to32(randSPDFast(r, n))
		rev := make([]float32, n*n)
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				rev[i*n+j] = h[(n-1-i)*n+n-1-j]
			}
		}
		for _, form := range []string{"rev", "full"} {
			for _, w := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/n=%d/workers=%d", form, n, w), func(b *testing.B) {
					u := make([]float32, n*n)
					work := make([]float32, n*n)
					prev := SetWorkers(w)
					defer SetWorkers(prev)
					var cpu time.Duration
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						b.StopTimer()
						copy(work, rev)
						b.StartTimer()
						c0, _ := benchenv.CPUTime()
						var err error
						if form == "rev" {
							err = CholInvUpperRev32(n, work, n, u, n)
						} else {
							err = CholInvUpper32(n, h, n, u, n)
						}
						c1, _ := benchenv.CPUTime()
						cpu += c1 - c0
						if err != nil {
							b.Fatal(err)
						}
					}
					sec := b.Elapsed().Seconds() / float64(b.N)
					if cpu > 0 {
						b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
					}
					b.ReportMetric(2*float64(n)*float64(n)*float64(n)/3/sec/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// randSPDFast returns XᵀX/n + I for a random n×n X (float64, via Dgemm).
func randSPDFast(r *rand.Rand, n int) []float64 {
	x := make([]float64, n*n)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	h := make([]float64, n*n)
	Dgemm(true, false, n, n, n, 1/float64(n), x, n, x, n, 0, h, n)
	for i := 0; i < n; i++ {
		h[i*n+i]++
	}
	return h
}

var (
	peakMu      sync.Mutex
	peakWorkers = map[int]Peak{}
)

// peakFor measures the FMA peak of w goroutines once per test binary.
func peakFor(w int) Peak {
	peakMu.Lock()
	defer peakMu.Unlock()
	p, ok := peakWorkers[w]
	if !ok {
		p = MeasurePeak(500*time.Millisecond, w)
		peakWorkers[w] = p
	}
	return p
}

// reportRate reports GFLOP/s for flops per iteration, the fraction of the
// float32 FMA peak of w goroutines, and that peak.
func reportRate(b *testing.B, flops float64, w int) {
	g := flops * float64(b.N) / b.Elapsed().Seconds() / 1e9
	p := peakFor(w).F32
	b.ReportMetric(g, "GFLOP/s")
	b.ReportMetric(g/p, "peak-frac")
	b.ReportMetric(p, "peak-GFLOP/s")
}

// microKernel32 is one float32 micro-kernel for BenchmarkMicroKernel32:
// a tile of mr×nr from packed operands (microKernels32 lists them).
type microKernel32 struct {
	name   string
	mr, nr int
	run    func(kc int, a, b, c []float32, ldc int)
}

// BenchmarkMicroKernel32 runs the dispatched float32 micro-kernel alone
// on one goroutine, its packed operands (256 inner indices) and the tile
// of C in L1: the kernel's own ceiling, against the one-goroutine peak.
func BenchmarkMicroKernel32(b *testing.B) {
	for _, v := range microKernels32() {
		b.Run(v.name, func(b *testing.B) {
			const kc = blockK
			r := rand.New(rand.NewPCG(3, 4))
			a := make([]float32, kc*v.mr)
			bb := make([]float32, kc*v.nr)
			for i := range a {
				a[i] = float32(r.NormFloat64())
			}
			for i := range bb {
				bb[i] = float32(r.NormFloat64())
			}
			c := make([]float32, v.mr*v.nr)
			peakFor(1)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				v.run(kc, a, bb, c, v.nr)
			}
			reportRate(b, 2*kc*float64(v.mr*v.nr), 1)
		})
	}
}

// BenchmarkSgemmWorkers is the SGEMM headline case (C 4096×768 += A
// 4096×2048 · B 2048×768) on 1 and 2 workers, each against the peak of
// as many goroutines.
func BenchmarkSgemmWorkers(b *testing.B) {
	const m, n, k = 4096, 768, 2048
	r := rand.New(rand.NewPCG(5, 6))
	a, bb, c := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
	for i := range a {
		a[i] = float32(r.NormFloat64())
	}
	for i := range bb {
		bb[i] = float32(r.NormFloat64())
	}
	for _, w := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			peakFor(w)
			prev := SetWorkers(w)
			defer SetWorkers(prev)
			Sgemm(false, false, m, n, k, 1, a, k, bb, n, 1, c, n)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				Sgemm(false, false, m, n, k, 1, a, k, bb, n, 1, c, n)
			}
			reportRate(b, 2*float64(m)*float64(n)*float64(k), w)
		})
	}
}

// BenchmarkHessianWorkers is the Hessian headline case (H += XᵀX, X
// 4096×2048, the lower triangle counted) on 1 and 2 workers.
func BenchmarkHessianWorkers(b *testing.B) {
	const k, n = 4096, 2048
	r := rand.New(rand.NewPCG(7, 8))
	x := make([]float32, k*n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	h := make([]float64, n*n)
	for _, w := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			peakFor(w)
			prev := SetWorkers(w)
			defer SetWorkers(prev)
			SyrkLower64(n, k, x, n, h, n)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				SyrkLower64(n, k, x, n, h, n)
			}
			reportRate(b, float64(k)*float64(n)*float64(n+1), w)
		})
	}
}

// BenchmarkSgemmShortA is the shape of the LM head and of a routed
// expert's products with few tokens: C (m×n) = A (m×2048) · Bᵀ with B
// n×2048 stored row-major (a weight matrix [out, in]), B far larger than
// the last-level cache. "sgemm" packs B inside every call, "packed" uses
// B packed once beforehand (PackB32, SgemmPacked). Besides GFLOP/s and
// the fraction of the peak of as many goroutines, it reports the process
// CPU seconds per call and the load average.
func BenchmarkSgemmShortA(b *testing.B) {
	const n, k = 32640, 2048 // eight column panels, 267 MB of B
	r := rand.New(rand.NewPCG(9, 10))
	bb := make([]float32, n*k)
	for i := range bb {
		bb[i] = float32(r.NormFloat64())
	}
	var pb *PackedB32
	for _, m := range []int{64, 512} {
		a, c := make([]float32, m*k), make([]float32, m*n)
		for i := range a {
			a[i] = float32(r.NormFloat64())
		}
		for _, form := range []string{"sgemm", "packed"} {
			b.Run(fmt.Sprintf("m=%d/%s", m, form), func(b *testing.B) {
				w := Workers()
				peakFor(w)
				if form == "packed" && pb == nil {
					pb = PackB32(true, k, n, bb, k)
				}
				run := func() {
					if form == "packed" {
						SgemmPacked(false, m, 1, a, k, pb, 0, c, n)
					} else {
						Sgemm(false, true, m, n, k, 1, a, k, bb, k, 0, c, n)
					}
				}
				run()
				var cpu float64
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c0 := benchenv.CPU().Seconds()
					run()
					cpu += benchenv.CPU().Seconds() - c0
				}
				reportRate(b, 2*float64(m)*float64(n)*float64(k), w)
				b.ReportMetric(cpu/float64(b.N), "cpu-s")
				b.ReportMetric(benchenv.LoadAvg(), "load1")
			})
		}
	}
}

// BenchmarkPackB32 packs a routed expert's gate_proj (512 × 2048,
// row-major [out, in], the transposed operand of its product) on one
// goroutine, as every expert's products do at every layer step.
func BenchmarkPackB32(b *testing.B) {
	const n, k = 512, 2048
	r := rand.New(rand.NewPCG(11, 12))
	w := randMat32(r, n*k)
	prev := SetWorkers(1)
	defer SetWorkers(prev)
	p := PackB32(true, k, n, w, k)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.Repack(true, k, n, w, k)
	}
	b.ReportMetric(float64(n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gvalues/s")
	b.ReportMetric(benchenv.LoadAvg(), "load1")
}
