package emulator

import "math"

// Src is one 19-bit datum of the Matrix Unit's source registers (SrcA, SrcB):
// bit 18 is the sign, bits 17..10 the exponent (bias 127) and bits 9..0 a
// 10-bit mantissa, the layout of TF32. Bits above 18 are always zero.
//
// The Matrix Unit reads a datum whose exponent field is 0 as zero, whatever
// its sign and mantissa (denormals are flushed on read), and reads exponent
// 255 as an ordinary number 2^128·1.m: there is no Inf or NaN in Src.
type Src uint32

// SrcFromBF16 places a BF16 bit pattern in a source register. The conversion
// is a bit copy: the three low mantissa bits are zero.
func SrcFromBF16(h uint16) Src { return Src(h) << 3 }

// SrcFromFP32TF32 places an IEEE float32 bit pattern in a source register in
// TF32 format, truncating (not rounding) the 13 low mantissa bits.
func SrcFromFP32TF32(x uint32) Src { return Src(x >> 13) }

// SrcFromFP32BF16 places an IEEE float32 bit pattern in a source register in
// BF16 format: a denormal input is flushed to zero, then the 16 low bits are
// truncated.
func SrcFromFP32BF16(x uint32) Src {
	if x&0x7f800000 == 0 {
		x &= 0x80000000
	}
	return SrcFromBF16(uint16(x >> 16))
}

// Sign returns the sign bit (0 or 1).
func (s Src) Sign() uint32 { return uint32(s>>18) & 1 }

// Exp returns the 8-bit exponent field.
func (s Src) Exp() uint32 { return uint32(s>>10) & 0xff }

// Man returns the 10-bit mantissa field.
func (s Src) Man() uint32 { return uint32(s) & 0x3ff }

// Float64 returns the value the Matrix Unit reads from the datum, as a
// float64 (exponent 255 is a finite 2^128-scale number, which float32 cannot
// hold). Exponent 0 reads as +0.
func (s Src) Float64() float64 {
	e := s.Exp()
	if e == 0 {
		return 0
	}
	v := float64(1024+s.Man()) / 1024
	v = math.Ldexp(v, int(e)-127)
	if s.Sign() != 0 {
		v = -v
	}
	return v
}

// UnpackBFP8 returns the BF16 bit pattern the unpacker writes into a source
// register for a BFP8_b datum (bit 7 sign, bits 6..0 magnitude) in a block
// with shared exponent exp. It reproduces the device's quirks: the result's
// exponent is (exp − leading zeros of the magnitude) modulo 256, so a small
// shared exponent wraps to a huge value; at most 6 fraction bits survive; and
// the sign-only datum 0x80 becomes 0xFF80, which the Matrix Unit reads as
// −2^128.
func UnpackBFP8(datum, exp uint8) uint16 {
	sign := uint16(datum>>7) << 15
	mag := uint32(datum & 0x7f)
	if mag == 0 {
		if sign != 0 {
			return 0xff80
		}
		return 0
	}
	lz := uint32(0)
	for mag&0x40 == 0 {
		mag <<= 1
		lz++
	}
	e := (uint32(exp) - lz) & 0xff
	return sign | uint16(e<<7) | uint16((mag&0x3f)<<1)
}

// UnpackBFP4 returns the BF16 bit pattern the unpacker writes for a BFP4_b
// datum (bit 3 sign, bits 2..0 magnitude): the nibble is moved to the top of
// an 8-bit datum and decoded as BFP8_b (see UnpackBFP8), so the quirks of that
// path apply, including nibble 0x8 becoming 0xFF80.
func UnpackBFP4(nibble, exp uint8) uint16 {
	return UnpackBFP8((nibble&0xf)<<4, exp)
}
