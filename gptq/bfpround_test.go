package gptq

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

// roundingMantissas returns 23-bit mantissas around every rounding
// boundary: for each bit position, the powers of two and their neighbours
// (ties, just below and just above a tie for every shift), plus the
// extremes and a few random patterns.
func roundingMantissas(rng *rand.Rand) []uint32 {
	ms := []uint32{0, 1, 0x7fffff, 0x400000, 0x3fffff, 0x600000, 0x200000, 0x100000}
	for t := 0; t < 23; t++ {
		p := uint32(1) << t
		for _, v := range []uint32{p, p - 1, p + 1, 3 * p, 3*p - 1, 3*p + 1, 5 * p, 7 * p} {
			ms = append(ms, v&0x7fffff)
		}
	}
	for range 8 {
		ms = append(ms, rng.Uint32()&0x7fffff)
	}
	return ms
}

// TestBFPRounderMatchesNearest checks the solver's column rounding (and
// the grouped rounding of RTN) against bfpNearest (bfp.Format.Nearest with the subnormal flush) bit for bit, for
// every format, every shared exponent, every exponent field of x, both
// signs and the mantissas around every rounding boundary.
func TestBFPRounderMatchesNearest(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	ms := roundingMantissas(rng)
	for _, f := range []bfp.Format{bfp.BFP8, bfp.BFP4, bfp.BFP2} {
		rd := newBFPRounder(f)
		x := make([]float32, 0, 2*256*len(ms))
		for sign := uint32(0); sign < 2; sign++ {
			for ex := uint32(0); ex < 256; ex++ {
				for _, m := range ms {
					x = append(x, math.Float32frombits(sign<<31|ex<<23|m))
				}
			}
		}
		q := make([]float32, len(x))
		exps := make([]uint8, len(x))
		bad := 0
		// Groups of 16 on their own shared exponents (RTN), a short group
		// at the end: the groups of subnormals, zeros and Inf/NaN take the
		// scalar path.
		xg := x[:len(x)-5]
		bfpRoundGroups(rd, xg, q)
		for g := 0; g < len(xg); g += bfp.GroupSize {
			grp := xg[g:min(g+bfp.GroupSize, len(xg))]
			e := bfp.SharedExponent(grp)
			for i, v := range grp {
				if want := bfpNearest(f, v, e); math.Float32bits(q[g+i]) != math.Float32bits(want) {
					if bad++; bad < 10 {
						t.Errorf("%v group e=%d x=%#08x: grouped rounding gives %#08x, Nearest %#08x", f, e, math.Float32bits(v), math.Float32bits(q[g+i]), math.Float32bits(want))
					}
				}
			}
		}
		for e := 0; e < 256; e++ {
			bfpRoundConst(rd, x, q, uint8(e))
			for i, v := range x {
				if want := bfpNearest(f, v, uint8(e)); math.Float32bits(q[i]) != math.Float32bits(want) {
					if bad++; bad < 10 {
						t.Errorf("%v e=%d x=%#08x: const rounding gives %#08x, Nearest %#08x", f, e, math.Float32bits(v), math.Float32bits(q[i]), math.Float32bits(want))
					}
				}
			}
			// The same values with per-element exponents (e and its
			// neighbours, so that every lane sees several exponents).
			for i := range exps {
				exps[i] = uint8(e + i%3)
			}
			bfpRoundVec(rd, x, q, exps)
			for i, v := range x {
				if want := bfpNearest(f, v, exps[i]); math.Float32bits(q[i]) != math.Float32bits(want) {
					if bad++; bad < 10 {
						t.Errorf("%v e=%d x=%#08x: vector rounding gives %#08x, Nearest %#08x", f, exps[i], math.Float32bits(v), math.Float32bits(q[i]), math.Float32bits(want))
					}
				}
			}
		}
	}
}

// FuzzBFPRounder compares the column rounding with bfpNearest on arbitrary
// bit patterns and exponents, in float32 and (through the float64 solver
// type) float64.
func FuzzBFPRounder(f *testing.F) {
	f.Add(uint32(0x3f800000), uint8(127), uint8(0))
	f.Add(uint32(0xbf7fffff), uint8(126), uint8(1))
	f.Add(uint32(0x00400000), uint8(3), uint8(2))
	f.Add(uint32(0x7f800000), uint8(255), uint8(1))
	f.Add(uint32(0x40100000), uint8(129), uint8(1))
	f.Fuzz(func(t *testing.T, bits uint32, e uint8, fi uint8) {
		fm := []bfp.Format{bfp.BFP8, bfp.BFP4, bfp.BFP2}[int(fi)%3]
		rd := newBFPRounder(fm)
		x := math.Float32frombits(bits)
		want := bfpNearest(fm, x, e)
		q32 := []float32{0}
		bfpRoundVec(rd, []float32{x}, q32, []uint8{e})
		q64 := []float64{0}
		bfpRoundConst(rd, []float64{float64(x)}, q64, e)
		// float64 carries a NaN's payload with its quiet bit set, so the
		// float64 lane is compared for numbers only (the solver never sees
		// NaN).
		f64ok := x != x || math.Float32bits(float32(q64[0])) == math.Float32bits(want)
		if math.Float32bits(q32[0]) != math.Float32bits(want) || !f64ok {
			t.Fatalf("%v x=%#08x e=%d: got %#08x / %#08x, Nearest %#08x", fm, bits, e, math.Float32bits(q32[0]), math.Float32bits(float32(q64[0])), math.Float32bits(want))
		}
	})
}
