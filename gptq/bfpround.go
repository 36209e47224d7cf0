package gptq

import (
	"math"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/kernels"
)

// bfpRounder rounds values onto a BFP grid of a given shared exponent with
// the packer's element rule, giving exactly bfpNearest (bfp.Format.Nearest,
// results with a zero exponent field flushed to +0) but with the format's
// constants resolved once, so that the solver can round a whole column in
// one tight loop. Exponents for which the fast rule does not apply (below
// the mantissa width, or 255) fall back to bfpNearest; they only occur for
// values near the float32 underflow or for Inf/NaN.
//
// The rule for a shared exponent E with w magnitude bits, for x with
// exponent field ex: the significand with its hidden bit is shifted right
// by E−ex (truncating; zeros and subnormals give 0), rounded half to even
// to w bits, and saturated at 2^w−1 (also when ex > E); the value is that
// magnitude times 2^(E−127−(w−1)), with x's sign, and +0 for a zero
// magnitude. TestBFPRounderMatchesNearest checks it against bfpNearest for
// every exponent pair and the mantissas around every rounding boundary.
type bfpRounder struct {
	f     bfp.Format
	w     uint32 // magnitude bits
	s     uint32 // 24 − w: bits below the kept magnitude
	half  uint32 // 2^(s−1) − 1
	maxq  uint32
	scale [256]float32 // 2^(E−127−(w−1)) for the exponents of the fast rule
}

func newBFPRounder(f bfp.Format) *bfpRounder {
	w := uint32(f.MantissaBits())
	rd := &bfpRounder{f: f, w: w, s: 24 - w, half: 1<<(23-w) - 1, maxq: 1<<w - 1}
	for e := w; e < 255; e++ {
		rd.scale[e] = math.Float32frombits((e - (w - 1)) << 23)
	}
	return rd
}

// fast reports whether exponent e uses the fast rule.
func (rd *bfpRounder) fast(e uint8) bool { return uint32(e) >= rd.w && e != 255 }

// bfpRoundVec sets q[i] to x[i] rounded onto exponent exps[i].
func bfpRoundVec[T float](rd *bfpRounder, x, q []T, exps []uint8) {
	q = q[:len(x)]
	exps = exps[:len(x)]
	if x32, ok := any(x).([]float32); ok {
		// The same rule on whole vectors (internal/kernels); the
		// exponents it does not cover come back to bfpNearest.
		q32 := any(q).([]float32)
		if !kernels.BFPRound32(x32, q32, exps, uint(rd.w)) {
			for i, e := range exps {
				if !rd.fast(e) {
					q32[i] = bfpNearest(rd.f, x32[i], e)
				}
			}
		}
		return
	}
	s, half, maxq, w := rd.s, rd.half, rd.maxq, rd.w
	for i, v := range x {
		e := exps[i]
		if rd.fast(e) {
			// The rule of bfpRoundConst.
			b, E := math.Float32bits(float32(v)), uint32(e)
			ex := b >> 23 & 0xff
			a := (b | 0x800000) & 0xffffff >> ((E - ex) | (ex-1)>>31<<5)
			m := min((a+half+(a>>s&1))>>s, maxq) | maxq*((E-ex)>>31)
			q[i] = T(math.Float32frombits(math.Float32bits(float32(m)*rd.scale[e]) | (b>>31&((m+maxq)>>w))<<31))
		} else {
			q[i] = T(bfpNearest(rd.f, float32(v), e))
		}
	}
}

// bfpRoundConst sets q[i] to x[i] rounded onto the exponent e.
func bfpRoundConst[T float](rd *bfpRounder, x, q []T, e uint8) {
	q = q[:len(x)]
	if !rd.fast(e) {
		for i, v := range x {
			q[i] = T(bfpNearest(rd.f, float32(v), e))
		}
		return
	}
	s, half, maxq, w, E, scale := rd.s, rd.half, rd.maxq, rd.w, uint32(e), rd.scale[e]
	// Branch-free: the signs and magnitudes of error-updated weights are
	// unpredictable. Zeros and subnormals (ex == 0) get a shift of at
	// least 32, hence 0; ex > E makes E−ex wrap around, also a shift of at
	// least 32, and saturates m; (m+maxq)>>w is 1 when m ≥ 1, so a zero
	// magnitude gives +0.
	for i, v := range x {
		b := math.Float32bits(float32(v))
		ex := b >> 23 & 0xff
		a := (b | 0x800000) & 0xffffff >> ((E - ex) | (ex-1)>>31<<5)
		m := min((a+half+(a>>s&1))>>s, maxq) | maxq*((E-ex)>>31)
		q[i] = T(math.Float32frombits(math.Float32bits(float32(m)*scale) | (b>>31&((m+maxq)>>w))<<31))
	}
}

// bfpRoundGroups rounds x in consecutive groups of bfp.GroupSize values
// (the last one possibly shorter), each onto its own shared exponent
// (bfp.SharedExponent of the group): RTN along the groups of x.
func bfpRoundGroups[T float](rd *bfpRounder, x, q []T) {
	q = q[:len(x)]
	n := 0
	if x32, ok := any(x).([]float32); ok {
		q32 := any(q).([]float32)
		n = len(x32) &^ (bfp.GroupSize - 1)
		if !kernels.BFPRoundGroups32(x32[:n], q32[:n], uint(rd.w)) {
			// Groups whose exponent the vector rule does not cover.
			for g := 0; g < n; g += bfp.GroupSize {
				if e := bfp.SharedExponent(x32[g : g+bfp.GroupSize]); !rd.fast(e) {
					bfpRoundConst(rd, x32[g:g+bfp.GroupSize], q32[g:g+bfp.GroupSize], e)
				}
			}
		}
	}
	var buf [bfp.GroupSize]float32
	for g := n; g < len(x); g += bfp.GroupSize {
		xs := x[g:min(g+bfp.GroupSize, len(x))]
		b := buf[:len(xs)]
		for i, v := range xs {
			b[i] = float32(v)
		}
		bfpRoundConst(rd, xs, q[g:g+len(xs)], bfp.SharedExponent(b))
	}
}
