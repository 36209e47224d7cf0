package gptq

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAxpySub32MatchesGo: the float32 row update (assembly where the CPU
// has it) gives the same bits as the Go loop axpySub, for lengths around
// the vector widths, values of mixed magnitudes, zeros of both signs,
// subnormals and products that overflow.
func TestAxpySub32MatchesGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -1e-40, 3e38, -3e38, 1, -1}
	for n := 0; n <= 70; n++ {
		for trial := 0; trial < 20; trial++ {
			x := make([]float32, n)
			y := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(40)-20)))
				y[i] = float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(40)-20)))
				if rng.IntN(8) == 0 {
					x[i] = special[rng.IntN(len(special))]
				}
				if rng.IntN(8) == 0 {
					y[i] = special[rng.IntN(len(special))]
				}
			}
			a := float32(rng.NormFloat64())
			switch trial {
			case 0:
				a = 0
			case 1:
				a = float32(math.Copysign(0, -1))
			case 2:
				a = 1e30
			}
			want := append([]float32(nil), y...)
			axpySub(a, x, want)
			got := append([]float32(nil), y...)
			axpySub32(a, x, got)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("n=%d a=%g: y[%d] = %#08x, Go loop gives %#08x (x=%g, y=%g)", n, a, i, math.Float32bits(got[i]), math.Float32bits(want[i]), x[i], y[i])
				}
			}
		}
	}
}
