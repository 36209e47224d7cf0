package kernels

import (
	"fmt"
	"math"
)

// Block floating point rounding, the element rule of a BFP packer applied
// to whole vectors: with w magnitude bits and a shared exponent byte E, an
// element x with exponent field ex has its significand (hidden bit
// included) shifted right by E−ex, truncating (zeros and subnormals give
// 0); the result is rounded half to even to w bits and saturated at 2^w−1
// (also when ex > E); the rounded value is that magnitude times
// 2^(E−127−(w−1)) with x's sign, or +0 for a zero magnitude.
//
// The vector rule covers exponents w ≤ E ≤ 254, where that value is a
// normal float32 or zero. Other exponents (groups of zeros and values near
// the float32 underflow, or Inf/NaN) are left to the caller: the functions
// report them and do not define what they wrote there.

// BFPMaxMagBits is the largest number of magnitude bits the rounding
// functions accept.
const BFPMaxMagBits = 23

// BFPFastExp reports whether the vector rule covers exponent e with w
// magnitude bits.
func BFPFastExp(e uint8, w uint) bool { return uint(e) >= w && e != 255 }

// BFPRound32 sets q[i] to x[i] rounded onto the grid of exponent exps[i]
// with w magnitude bits (1 ≤ w ≤ BFPMaxMagBits), for i < len(x). It
// returns false when some exps[i] is outside the vector rule (see
// BFPFastExp); q[i] is then unspecified for those i and the caller
// rounds them itself. Assembly and pure-Go builds give the same bits.
func BFPRound32(x, q []float32, exps []uint8, w uint) bool {
	checkBFP("BFPRound32", len(x), len(q), w)
	if len(exps) < len(x) {
		panic(fmt.Sprintf("kernels: BFPRound32: %d exponents for %d values", len(exps), len(x)))
	}
	return bfpRound32(x, q[:len(x)], exps[:len(x)], uint32(w))
}

// BFPRoundGroups32 rounds x, taken as consecutive groups of 16 values
// (len(x) a multiple of 16), each group onto its own shared exponent: the
// largest exponent field among its values. It returns false when some
// group's exponent is outside the vector rule; that group's q is then
// unspecified and the caller rounds it itself.
func BFPRoundGroups32(x, q []float32, w uint) bool {
	checkBFP("BFPRoundGroups32", len(x), len(q), w)
	if len(x)%16 != 0 {
		panic(fmt.Sprintf("kernels: BFPRoundGroups32: %d values, not a multiple of 16", len(x)))
	}
	return bfpRoundGroups32(x, q[:len(x)], uint32(w))
}

func checkBFP(name string, nx, nq int, w uint) {
	if w < 1 || w > BFPMaxMagBits {
		panic(fmt.Sprintf("kernels: %s: %d magnitude bits, want 1 to %d", name, w, BFPMaxMagBits))
	}
	if nq < nx {
		panic(fmt.Sprintf("kernels: %s: q has %d elements, x %d", name, nq, nx))
	}
}

// bfpRoundOne is the element rule for b = the bits of x and a shared
// exponent E with w ≤ E ≤ 254: branch-free, as the vector forms.
func bfpRoundOne(b, E, w uint32) uint32 {
	s := 24 - w
	half := uint32(1)<<(s-1) - 1
	maxq := uint32(1)<<w - 1
	ex := b >> 23 & 0xff
	// ex == 0 (zeros, subnormals) and ex > E (E−ex wraps around) give a
	// shift of at least 32, hence 0; ex > E then saturates m.
	a := (b | 0x800000) & 0xffffff >> ((E - ex) | (ex-1)>>31<<5)
	m := min((a+half+(a>>s&1))>>s, maxq) | maxq*((E-ex)>>31)
	scale := (E - (w - 1)) << 23
	p := float32(m) * math.Float32frombits(scale)
	// (m+maxq)>>w is 1 exactly when m ≥ 1: a zero magnitude gives +0.
	return math.Float32bits(p) | (b>>31&((m+maxq)>>w))<<31
}

func bfpRound32Go(x, q []float32, exps []uint8, w uint32) bool {
	q = q[:len(x)]
	exps = exps[:len(x)]
	ok := true
	for i, v := range x {
		E := uint32(exps[i])
		if E < w || E == 255 {
			ok = false
			continue
		}
		q[i] = math.Float32frombits(bfpRoundOne(math.Float32bits(v), E, w))
	}
	return ok
}

func bfpRoundGroups32Go(x, q []float32, w uint32) bool {
	q = q[:len(x)]
	ok := true
	for g := 0; g+16 <= len(x); g += 16 {
		xs, qs := x[g:g+16], q[g:g+16]
		var E uint32
		for _, v := range xs {
			E = max(E, math.Float32bits(v)>>23&0xff)
		}
		if E < w || E == 255 {
			ok = false
			continue
		}
		for i, v := range xs {
			qs[i] = math.Float32frombits(bfpRoundOne(math.Float32bits(v), E, w))
		}
	}
	return ok
}

// MaxExponents32 sets exp[i] to the larger of exp[i] and the exponent
// field of x[i], for i < len(x): the shared exponent of a group built up
// one column at a time.
func MaxExponents32(x []float32, exp []uint8) {
	if len(exp) < len(x) {
		panic(fmt.Sprintf("kernels: MaxExponents32: %d exponents for %d values", len(exp), len(x)))
	}
	maxExponents32(x, exp[:len(x)])
}

func maxExponents32Go(x []float32, exp []uint8) {
	exp = exp[:len(x)]
	for i, v := range x {
		exp[i] = max(exp[i], uint8(math.Float32bits(v)>>23&0xff))
	}
}

// GroupMaxExponents32 sets exps[g] to the largest exponent field among
// x[16g : min(16g+16, len(x))], for every group g of x: the shared
// exponent of each BFP group (bfp.SharedExponent).
func GroupMaxExponents32(x []float32, exps []uint8) {
	if ng := (len(x) + 15) / 16; len(exps) < ng {
		panic(fmt.Sprintf("kernels: GroupMaxExponents32: %d exponents for %d groups", len(exps), ng))
	}
	groupMaxExponents32(x, exps)
}

func groupMaxExponents32Go(x []float32, exps []uint8) {
	for g := 0; g*16 < len(x); g++ {
		var m uint32
		for _, v := range x[g*16 : min(g*16+16, len(x))] {
			m = max(m, math.Float32bits(v)>>23&0xff)
		}
		exps[g] = uint8(m)
	}
}

// QuantErr32 is GPTQ's per-column error step in float32: for i < len(x),
// with δ = x[i] − q[i], it sets e[i] = δ/d and adds float64(δ·δ/d2)/2 to
// acc[i] (every float32 operation rounded, none fused).
func QuantErr32(x, q, e []float32, acc []float64, d, d2 float32) {
	if len(q) < len(x) || len(e) < len(x) || len(acc) < len(x) {
		panic(fmt.Sprintf("kernels: QuantErr32: %d values, q %d, e %d, acc %d", len(x), len(q), len(e), len(acc)))
	}
	quantErr32(x, q[:len(x)], e[:len(x)], acc[:len(x)], d, d2)
}

func quantErr32Go(x, q, e []float32, acc []float64, d, d2 float32) {
	q, e, acc = q[:len(x)], e[:len(x)], acc[:len(x)]
	for i, v := range x {
		diff := v - q[i]
		acc[i] += float64(diff*diff/d2) / 2
		e[i] = diff / d
	}
}

// BFPMaxCands is the largest number of candidate exponents BFPErrAcc32
// tries at once.
const BFPMaxCands = 3

// BFPErrAcc32 adds to acc the squared rounding errors of candidate shared
// exponents, weighted by wt: acc[k] belongs to the candidate k steps below
// the exponent given (len(acc) from 1 to BFPMaxCands). Value i of x
// belongs to group g = i/per (per ≥ 1; per = 1: each value its own
// group); with e = exps[g]−k, when exps[g] ≥ k and BFPFastExp(e, w), q is
// x[i] rounded onto e as BFPRound32 rounds it, d = float64(x[i]) −
// float64(q), and acc[k][g] += (wt·d)·d, each product rounded and none
// fused. A group's values are added in their order. Entries whose
// candidate the vector rule does not cover are left as they are.
// Assembly and pure-Go builds give the same bits.
func BFPErrAcc32(x []float32, exps []uint8, per int, w uint, wt float64, acc [][]float64) {
	checkBFP("BFPErrAcc32", len(x), len(x), w)
	if per < 1 || len(acc) < 1 || len(acc) > BFPMaxCands {
		panic(fmt.Sprintf("kernels: BFPErrAcc32: %d values per group, %d candidates", per, len(acc)))
	}
	ng := (len(x) + per - 1) / per
	if len(exps) < ng {
		panic(fmt.Sprintf("kernels: BFPErrAcc32: %d exponents for %d groups", len(exps), ng))
	}
	for k, a := range acc {
		if len(a) < ng {
			panic(fmt.Sprintf("kernels: BFPErrAcc32: candidate %d has %d sums for %d groups", k, len(a), ng))
		}
	}
	bfpErrAcc32(x, exps[:ng], per, uint32(w), wt, acc)
}

func bfpErrAcc32Go(x []float32, exps []uint8, per int, w uint32, wt float64, acc [][]float64) {
	for k, a := range acc {
		for i, v := range x {
			g := i / per
			// exps[g] < k wraps around to far above 254.
			e := uint32(exps[g]) - uint32(k)
			if e < w || e > 254 {
				continue
			}
			q := math.Float32frombits(bfpRoundOne(math.Float32bits(v), e, w))
			d := float64(v) - float64(q)
			a[g] += float64(wt * d * d)
		}
	}
}
