package eval

import "math"

// expTable[j] = 2^(j/256).
var expTable = func() (t [256]float64) {
	for j := range t {
		t[j] = math.Exp2(float64(j) / 256)
	}
	return t
}()

// expNonPos returns e^x for x ≤ 0 (−Inf included) with a relative error of
// a few 1e-16: x = (256k' + j)·ln2/256 + r with |r| ≤ ln2/512, e^x =
// 2^k'·2^(j/256)·e^r, the middle factor from a table and e^r from a degree-5
// polynomial. Its short dependency chain makes it about twice as fast as
// math.Exp, which dominates the cost of the quality metrics at large
// vocabularies. Arguments below −700 and NaN go to math.Exp.
func expNonPos(x float64) float64 {
	if !(x >= -700) {
		return math.Exp(x)
	}
	const (
		invL  = 256 / math.Ln2
		lHi   = 0.0027076061737716373  // ln2/256 cut to 33 significant bits: k·lHi is exact
		lLo   = 2.9064910585985925e-13 // ln2/256 − lHi
		shift = 0x1.8p52
	)
	kf := x*invL + shift
	// The low mantissa bits of kf hold 2^51 + round(x·invL).
	k := int64(math.Float64bits(kf)&(1<<52-1)) - 1<<51
	kf -= shift
	r := (x - kf*lHi) - kf*lLo
	p := 1 + r*(1+r*(0.5+r*(1.0/6+r*(1.0/24+r*(1.0/120)))))
	j := k & 255
	e := (k - j) >> 8 // may be negative
	scale := math.Float64frombits(uint64(e+1023) << 52)
	return expTable[j] * p * scale
}
