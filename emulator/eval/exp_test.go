package eval

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestExpNonPos(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	worst := 0.0
	check := func(x float64) {
		t.Helper()
		got, want := expNonPos(x), math.Exp(x)
		if want == 0 || math.IsNaN(want) {
			if got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
				t.Fatalf("exp(%g) = %g, want %g", x, got, want)
			}
			return
		}
		rel := math.Abs(got-want) / want
		worst = max(worst, rel)
		if rel > 1e-15 {
			t.Fatalf("exp(%g) = %.17g, math.Exp %.17g (relative error %.3g)", x, got, want, rel)
		}
	}
	for i := 0; i < 300000; i++ {
		check(-r.Float64() * 40)
		check(-r.ExpFloat64() * 60)
		check(-r.Float64() * 1e-3)
	}
	for _, x := range []float64{0, math.Copysign(0, -1), -1e-300, -math.Ln2 / 512, -math.Ln2, -699.99, -700, -700.5, -745, -746, -1000, math.Inf(-1), math.NaN()} {
		check(x)
	}
	t.Logf("worst relative error against math.Exp: %.3g", worst)
}

func benchExp(b *testing.B, f func(float64) float64) {
	x := make([]float64, 4096)
	for i := range x {
		x[i] = -float64(i) / 100
	}
	s := 0.0
	for range b.N {
		for _, v := range x {
			s += f(v)
		}
	}
	if s == 0 {
		b.Fatal("zero sum")
	}
	b.ReportMetric(float64(b.N*len(x))/b.Elapsed().Seconds()/1e6, "Mexp/s")
}

func BenchmarkExp(b *testing.B) {
	b.Run("expNonPos", func(b *testing.B) { benchExp(b, expNonPos) })
	b.Run("math.Exp", func(b *testing.B) { benchExp(b, math.Exp) })
}
