package bfp

import "math"

// Pure-Go row kernels (see packRowFunc and unpackRowFunc). They are the
// implementation under the purego tag and on other architectures, and the
// reference the assembly kernels are tested against.

func packRowGo(f Format, src []float32, nt, fc int, exp, mant []byte, tb, se, sm int) {
	for t := range nt {
		for c := range fc {
			g := (*[16]float32)(src[16*(t*fc+c):])
			o := t * tb
			exp[o+c*se] = packGroupGo(f, g, mant[o+c*sm:])
		}
	}
}

// packGroupGo encodes one group into m and returns its shared exponent.
func packGroupGo(f Format, g *[16]float32, m []byte) uint8 {
	var b [16]uint32
	var e uint32
	for k, v := range g {
		b[k] = math.Float32bits(v)
		e = max(e, b[k]&0x7f800000)
	}
	e >>= 23
	switch f {
	case BFP8:
		m := (*[16]byte)(m)
		for k := range 16 {
			m[k] = uint8(enc8(b[k], e))
		}
	case BFP4:
		m := (*[8]byte)(m)
		for k := range 8 {
			m[k] = uint8(enc4(b[2*k], e) | enc4(b[2*k+1], e)<<4)
		}
	case BFP2:
		m := (*[4]byte)(m)
		for k := range 4 {
			m[k] = uint8(enc2(b[4*k], e) | enc2(b[4*k+1], e)<<2 |
				enc2(b[4*k+2], e)<<4 | enc2(b[4*k+3], e)<<6)
		}
	default:
		panic("bfp: invalid format " + f.String())
	}
	return uint8(e)
}

// encodeFast is encodeBits for an element whose exponent field does not
// exceed e (always true inside Pack), written without data-dependent
// branches. enc8, enc4 and enc2 are the same with w fixed, small enough to
// be inlined.
func encodeFast(b, e uint32, w uint) uint32 {
	ex := b >> 23 & 0xff
	// Zeros and subnormals (ex == 0) get a shift of at least 32, hence 0.
	d := (e - ex) | (ex-1)>>31<<5
	a := (b | 0x800000) & 0xffffff >> d
	s := 24 - w
	maxq := uint32(1)<<w - 1
	q := min((a+(uint32(1)<<(s-1)-1)+(a>>s&1))>>s, maxq)
	return q | (b>>31&((q+maxq)>>w))<<w
}

func enc8(b, e uint32) uint32 {
	ex := b >> 23 & 0xff
	a := (b | 0x800000) & 0xffffff >> ((e - ex) | (ex-1)>>31<<5)
	q := min((a+0xffff+(a>>17&1))>>17, 127)
	return q | (b>>31&((q+127)>>7))<<7
}

func enc4(b, e uint32) uint32 {
	ex := b >> 23 & 0xff
	a := (b | 0x800000) & 0xffffff >> ((e - ex) | (ex-1)>>31<<5)
	q := min((a+0xfffff+(a>>21&1))>>21, 7)
	return q | (b>>31&((q+7)>>3))<<3
}

func enc2(b, e uint32) uint32 {
	ex := b >> 23 & 0xff
	a := (b | 0x800000) & 0xffffff >> ((e - ex) | (ex-1)>>31<<5)
	q := min((a+0x3fffff+(a>>23&1))>>23, 1)
	return q | (b>>31&q)<<1
}

// signedMag8/4/2 map a code to its signed magnitude as a float32 (the
// sign-only code gives -0).
var (
	signedMag8 = magTable[[256]float32](7)
	signedMag4 = magTable[[16]float32](3)
	signedMag2 = magTable[[4]float32](1)
)

func magTable[A [256]float32 | [16]float32 | [4]float32](w uint) A {
	var t A
	for c := range len(t) {
		v := math.Float32frombits(uint32(c) >> w << 31) // ±0
		if q := c & (1<<w - 1); q != 0 {
			v = float32(q)
			if c>>w != 0 {
				v = -v
			}
		}
		t[c] = v
	}
	return t
}

func unpackRowGo(f Format, exp, mant []byte, nt, fc, tb, se, sm int, dst []float32, _ bool) {
	switch f {
	case BFP8:
		for t := range nt {
			for c := range fc {
				o := t * tb
				m := (*[16]byte)(mant[o+c*sm:])
				d := (*[16]float32)(dst[16*(t*fc+c):])
				e := uint32(exp[o+c*se])
				if e < 7 || e == 255 {
					unpackGroupSlow(f, m[:], e, d)
					continue
				}
				scale := math.Float32frombits((e - 6) << 23)
				for k := range 16 {
					d[k] = signedMag8[m[k]] * scale
				}
			}
		}
	case BFP4:
		for t := range nt {
			for c := range fc {
				o := t * tb
				m := (*[8]byte)(mant[o+c*sm:])
				d := (*[16]float32)(dst[16*(t*fc+c):])
				e := uint32(exp[o+c*se])
				if e < 3 || e == 255 {
					unpackGroupSlow(f, m[:], e, d)
					continue
				}
				scale := math.Float32frombits((e - 2) << 23)
				for k := range 8 {
					d[2*k] = signedMag4[m[k]&15] * scale
					d[2*k+1] = signedMag4[m[k]>>4] * scale
				}
			}
		}
	case BFP2:
		for t := range nt {
			for c := range fc {
				o := t * tb
				m := (*[4]byte)(mant[o+c*sm:])
				d := (*[16]float32)(dst[16*(t*fc+c):])
				e := uint32(exp[o+c*se])
				if e < 1 || e == 255 {
					unpackGroupSlow(f, m[:], e, d)
					continue
				}
				scale := math.Float32frombits(e << 23)
				for k := range 4 {
					b := m[k]
					d[4*k] = signedMag2[b&3] * scale
					d[4*k+1] = signedMag2[b>>2&3] * scale
					d[4*k+2] = signedMag2[b>>4&3] * scale
					d[4*k+3] = signedMag2[b>>6] * scale
				}
			}
		}
	default:
		panic("bfp: invalid format " + f.String())
	}
}

// unpackGroupSlow decodes a group element by element with the full rule
// (exponents where a result may be subnormal, flushed, Inf or NaN). Both the
// pure-Go and the SIMD kernels leave such groups (E < W or E = 255) to it.
func unpackGroupSlow(f Format, m []byte, e uint32, d *[16]float32) {
	w := uint(f.MantissaBits())
	bitsPer := w + 1
	for k := range 16 {
		bit := uint(k) * bitsPer
		code := uint32(m[bit/8]) >> (bit % 8) & (1<<bitsPer - 1)
		d[k] = math.Float32frombits(decodeBits(code, e, w))
	}
}
