package gptq

import (
	"math/rand/v2"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

// BenchmarkRTN rounds a 512×2048 expert matrix onto BFP4 along the input
// axis; ns/elem is the time per weight.
func BenchmarkRTN(b *testing.B) {
	const rows, cols = 512, 2048
	rng := rand.New(rand.NewPCG(3, 4))
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(0.02 * rng.NormFloat64())
	}
	g := NewBFPGrid(bfp.BFP4, bfp.AxisInput)
	q := make([]float32, len(w))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rtnTo(q, g, w, rows, cols)
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)/float64(len(w))*1e9, "ns/elem")
}
