package kernels

import (
	"sync"
	"testing"
	"time"
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

// BenchmarkPeak reports the FMA throughput loop itself.
func BenchmarkPeak(b *testing.B) {
	for i := 0; i < b.N; i++ {
		p := MeasurePeak(200*time.Millisecond, 0)
		b.ReportMetric(p.F32, "f32-GFLOP/s")
		b.ReportMetric(p.F64, "f64-GFLOP/s")
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
