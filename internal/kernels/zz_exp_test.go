package kernels

import (
	"syscall"
	"testing"
)

func cpuTime() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func BenchmarkExpParts(b *testing.B) {
	n := 2048
	g := splitmix(1)
	x := g.f64(n * n)
	h := make([]float64, n*n)
	Dgemm(true, false, n, n, n, 1/float64(n), x, n, x, n, 0, h, n)
	for i := 0; i < n; i++ {
		h[i*n+i]++
	}
	fl := float64(n) * float64(n) * float64(n) / 3
	b.Run("potrf", func(b *testing.B) {
		var t float64
		for i := 0; i < b.N; i++ {
			a := append([]float64(nil), h...)
			t0 := cpuTime()
			potrf(n, a, n)
			t += cpuTime() - t0
		}
		b.ReportMetric(fl*float64(b.N)/t/1e9, "cpuGFLOP/s")
	})
	l := append([]float64(nil), h...)
	potrf(n, l, n)
	b.Run("trtri", func(b *testing.B) {
		var t float64
		for i := 0; i < b.N; i++ {
			a := append([]float64(nil), l...)
			t0 := cpuTime()
			trtri(n, a, n)
			t += cpuTime() - t0
		}
		b.ReportMetric(fl*float64(b.N)/t/1e9, "cpuGFLOP/s")
	})
	b.Run("unblocked96x21", func(b *testing.B) {
		var t float64
		for i := 0; i < b.N; i++ {
			a := append([]float64(nil), h...)
			t0 := cpuTime()
			for j := 0; j < n; j += 96 {
				potrfUnblocked(min(96, n-j), a[j*n+j:], n, 0)
				trtriUnblocked(min(96, n-j), a[j*n+j:], n, 0)
				trtriUnblocked(min(96, n-j), a[j*n+j:], n, 0)
			}
			t += cpuTime() - t0
		}
		b.ReportMetric(t/float64(b.N)*1000, "cpu-ms")
	})
	b.Run("dgemm-peak", func(b *testing.B) {
		c := make([]float64, 1024*1024)
		var t float64
		for i := 0; i < b.N; i++ {
			t0 := cpuTime()
			Dgemm(false, true, 1024, 1024, 1024, 1, h, n, h, n, 1, c, 1024)
			t += cpuTime() - t0
		}
		b.ReportMetric(2*1024*1024*1024*float64(b.N)/t/1e9, "cpuGFLOP/s")
	})
	b.Run("fma-peak", func(b *testing.B) {
		var t, f float64
		for i := 0; i < b.N; i++ {
			t0 := cpuTime()
			f += fmaLoop64(1000000)
			t += cpuTime() - t0
		}
		b.ReportMetric(f/t/1e9, "cpuGFLOP/s")
	})
}
