package emulator

import (
	"math/rand/v2"
	"testing"
)

// randSrc draws source datums biased toward the special cases: exponent 0
// and 255, small exponents (products that underflow), equal exponents, and
// full TF32 mantissas.
func randSrc(r *rand.Rand) Src {
	var e uint32
	switch r.IntN(8) {
	case 0:
		e = 0
	case 1:
		e = 255 - uint32(r.IntN(3))
	case 2:
		e = uint32(r.IntN(8))
	default:
		e = 110 + uint32(r.IntN(30))
	}
	return Src(uint32(r.IntN(2))<<18 | e<<10 | uint32(r.IntN(1024)))
}

func TestPreparedStepMatchesMVMULStep(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	var a, b [Lanes]Src
	var pa, pb [Lanes]uint32
	for n := 0; n < 100000; n++ {
		for i := range a {
			a[i], b[i] = randSrc(r), randSrc(r)
			pa[i], pb[i] = prepA(a[i]), prepB(b[i])
		}
		dst := r.Uint32()
		if r.IntN(4) == 0 {
			dst = 0xbf800001 // the "−1 unit" case with a = b = 1
			a = [Lanes]Src{SrcFromBF16(0x3f80)}
			b = [Lanes]Src{SrcFromBF16(0x3f80)}
			for i := range a {
				pa[i], pb[i] = prepA(a[i]), prepB(b[i])
			}
		}
		phase := r.IntN(4)
		dfmt := DstFormat(r.IntN(2))
		arch := Arch(r.IntN(2))
		want := MVMULStep(dst, &a, &b, phase, dfmt, arch)
		if got := preparedStep(dst, pa[:], pb[:], phase, dfmt, arch); got != want {
			t.Fatalf("case %d: dst %08x phase %d %v %v: prepared %08x, MVMULStep %08x\na %05x\nb %05x", n, dst, phase, dfmt, arch, got, want, a, b)
		}
	}
}

func benchOperands() ([64][Lanes]Src, [64][Lanes]Src, [64][Lanes]uint32, [64][Lanes]uint32) {
	r := rand.New(rand.NewPCG(43, 44))
	var a, b [64][Lanes]Src
	var pa, pb [64][Lanes]uint32
	for j := range a {
		for i := 0; i < Lanes; i++ {
			a[j][i] = SrcFromBF16(randBF16(r, 1, 0.05)[0])
			b[j][i] = SrcFromBF16(randBF16(r, 1, 1)[0])
			pa[j][i], pb[j][i] = prepA(a[j][i]), prepB(b[j][i])
		}
	}
	return a, b, pa, pb
}

// BenchmarkSteps compares the reference step with the prepared-operand step
// (single goroutine); the metric is million steps per second.
func BenchmarkSteps(b *testing.B) {
	a, bb, pa, pb := benchOperands()
	b.Run("MVMULStep", func(b *testing.B) {
		var d uint32
		for n := range b.N {
			d = MVMULStep(d, &a[n%64], &bb[n%64], n&3, DstFP32, Blackhole)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Msteps/s")
	})
	b.Run("prepared", func(b *testing.B) {
		var d uint32
		for n := range b.N {
			d = preparedStep(d, pa[n%64][:], pb[n%64][:], n&3, DstFP32, Blackhole)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Msteps/s")
	})
}
