package eval

import (
	"math/rand/v2"
	"testing"

	"github.com/ttquant/ttquant/internal/benchenv"
)

// BenchmarkScorer scores two candidates against a reference over the
// Qwen3.6 vocabulary (248,320), 16 positions per batch, and reports scored
// positions per second and per CPU-second of the process (steadier on a
// shared machine).
func BenchmarkScorer(b *testing.B) {
	const vocab, n, k = 248320, 16, 2
	r := rand.New(rand.NewPCG(9, 10))
	ref := randRow(r, n*vocab, 3)
	cands := make([][]float32, k)
	for i := range cands {
		cands[i] = make([]float32, len(ref))
		for j := range ref {
			cands[i][j] = ref[j] + float32(r.NormFloat64()*0.1)
		}
	}
	targets := make([]int32, n)
	for i := range targets {
		targets[i] = int32(r.IntN(vocab))
	}
	s, err := NewScorer(vocab, []string{"a", "b"}, ScorerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	c0 := benchenv.CPU()
	for range b.N {
		if err := s.Score(Batch{Ref: ref, Cands: cands, Targets: targets, Corpus: []string{"x"}}); err != nil {
			b.Fatal(err)
		}
	}
	cpu := benchenv.CPU() - c0
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "positions/s")
	if cpu > 0 {
		b.ReportMetric(float64(n*b.N)/cpu.Seconds(), "positions/cpu-s")
	}
}
