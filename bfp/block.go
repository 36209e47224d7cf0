package bfp

import (
	"math"
	"math/bits"
)

// SharedExponent returns the shared exponent byte of a group: the largest
// biased exponent field (bits 30..23) among the float32 values, ignoring
// signs. Zeros and subnormals contribute 0; an Inf or NaN makes it 255; an
// empty slice gives 0. Pack uses exactly this for every 16-value group;
// vals may hold fewer or more than GroupSize values.
func SharedExponent(vals []float32) uint8 {
	var m uint32
	for _, v := range vals {
		m = max(m, math.Float32bits(v)>>23&0xff)
	}
	return uint8(m)
}

// Encode returns the code of x in a group whose shared exponent byte is e:
// the sign bit above a MantissaBits-bit magnitude, in the low Bits() bits.
// This is the element rule of Pack: inputs with exponent field 0 (zeros,
// subnormals) give 0; the significand with its hidden bit is shifted right
// by e minus x's exponent, discarding the shifted-out bits, rounded half to
// even on that truncated value, and saturated at the largest magnitude; a
// zero magnitude never keeps its sign. Inf and NaN are treated like any
// value with exponent field 255.
//
// Pack never meets an element whose exponent exceeds e. Encode, used to
// quantise onto a fixed grid, saturates such an element to the largest
// magnitude of its sign.
//
// Encode panics on an invalid format.
func (f Format) Encode(x float32, e uint8) uint8 {
	return uint8(encodeBits(math.Float32bits(x), uint32(e), uint(f.MantissaBits())))
}

// encodeBits is the scalar element rule on raw bits, shared magnitude width w.
func encodeBits(b, e uint32, w uint) uint32 {
	ex := b >> 23 & 0xff
	if ex == 0 {
		return 0
	}
	maxq := uint32(1)<<w - 1
	var q uint32
	if ex > e {
		q = maxq
	} else {
		m := b&0x7fffff | 0x800000
		a := m >> (e - ex) // Go: a shift of 32 or more gives 0
		s := 24 - w
		q = (a + (uint32(1)<<(s-1) - 1) + (a >> s & 1)) >> s
		q = min(q, maxq)
		if q == 0 {
			return 0
		}
	}
	return b>>31<<w | q
}

// Decode returns the value tt-metal's host unpacker gives for code in a
// group with shared exponent byte e. For every code Pack can produce this is
// exactly (-1)^sign * magnitude * 2^(e-127-(W-1)). For the other codes it
// follows the unpacker bit for bit: a zero magnitude gives a zero carrying
// the code's sign; a magnitude whose normalising shift exceeds e gives +0; a
// shift equal to e gives a subnormal bit pattern (not the exact value); with
// e = 255 a magnitude with its top bit set gives Inf or NaN.
//
// Bits of code above Bits() are ignored. Decode panics on an invalid format.
func (f Format) Decode(code uint8, e uint8) float32 {
	return math.Float32frombits(decodeBits(uint32(code), uint32(e), uint(f.MantissaBits())))
}

func decodeBits(code, e uint32, w uint) uint32 {
	mag := code & (1<<w - 1)
	sign := code >> w & 1 << 31
	if mag == 0 {
		return sign
	}
	n := uint32(w) - uint32(bits.Len32(mag))
	if n > e {
		return 0
	}
	frac := mag << n & (1<<(w-1) - 1)
	return sign | (e-n)<<23 | frac<<(24-w)
}

// Nearest returns the value x becomes in a group with shared exponent byte
// e: by definition Decode(Encode(x, e), e). Elements whose exponent exceeds
// e saturate (see Encode). It is written to be cheap enough for the inner
// loops of quantisers.
func (f Format) Nearest(x float32, e uint8) float32 {
	b := math.Float32bits(x)
	ex, E := b>>23&0xff, uint32(e)
	var w, q uint32
	switch f {
	case BFP8:
		w, q = 7, enc8(b, E)&127
	case BFP4:
		w, q = 3, enc4(b, E)&7
	case BFP2:
		w, q = 1, enc2(b, E)&1
	default:
		panic("bfp: invalid format " + f.String())
	}
	if ex > E || E < w || E == 255 {
		return math.Float32frombits(decodeBits(encodeBits(b, E, uint(w)), E, uint(w)))
	}
	// The decoded value is exactly q * 2^(E-127-(w-1)), a normal float32.
	v := float32(q) * math.Float32frombits((E-(w-1))<<23)
	if q != 0 && b>>31 != 0 {
		v = -v
	}
	return v
}

// QuantizeGroup rounds the values of one group in place exactly as
// Pack then Unpack would, using their own shared exponent, and returns that
// exponent. vals normally holds GroupSize values (fewer behave as if padded
// with zeros).
func (f Format) QuantizeGroup(vals []float32) uint8 {
	e := SharedExponent(vals)
	w := uint(f.MantissaBits())
	for i, v := range vals {
		vals[i] = math.Float32frombits(decodeBits(encodeBits(math.Float32bits(v), uint32(e), w), uint32(e), w))
	}
	return e
}
