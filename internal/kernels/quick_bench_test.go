package kernels

import (
	"math/rand/v2"
	"testing"
)

func BenchmarkQuickSyrk(b *testing.B) {
	const rows, n = 4096, 2048
	x := make([]float32, rows*n)
	r := rand.New(rand.NewPCG(1, 1))
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	c := make([]float64, n*n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		SyrkLower64(n, rows, x, n, c, n)
	}
	b.ReportMetric(float64(rows)*n*(n+1)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func BenchmarkQuickSgemm(b *testing.B) {
	const m, n, k = 2048, 2048, 2048
	r := rand.New(rand.NewPCG(1, 1))
	mk := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	a, bb, c := mk(m*k), mk(k*n), mk(m*n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Sgemm(false, false, m, n, k, 1, a, k, bb, n, 1, c, n)
	}
	b.ReportMetric(2*float64(m)*n*k*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func BenchmarkQuickDgemm(b *testing.B) {
	const m, n, k = 1024, 1024, 1024
	r := rand.New(rand.NewPCG(1, 1))
	mk := func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = r.NormFloat64()
		}
		return x
	}
	a, bb, c := mk(m*k), mk(k*n), mk(m*n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Dgemm(false, true, m, n, k, 1, a, k, bb, k, 1, c, n)
	}
	b.ReportMetric(2*float64(m)*n*k*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
