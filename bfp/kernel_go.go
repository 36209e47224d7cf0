package bfp

import "math"

// Pure-Go group kernels. They are the reference the assembly kernels are
// tested against, and the implementation under the purego tag and on other
// architectures.

// packGroupsGo packs n groups; group i is src[i*stride:][:16], its exponent
// goes to exp[i] and its codes to mant[i*gb:].
func packGroupsGo(f Format, src []float32, stride, n int, exp, mant []byte) {
	switch f {
	case BFP8:
		for i := range n {
			g := (*[16]float32)(src[i*stride:])
			e := groupExp(g)
			exp[i] = uint8(e)
			m := (*[16]byte)(mant[i*16:])
			for k := range 16 {
				m[k] = uint8(encodeFast(math.Float32bits(g[k]), e, 7))
			}
		}
	case BFP4:
		for i := range n {
			g := (*[16]float32)(src[i*stride:])
			e := groupExp(g)
			exp[i] = uint8(e)
			m := (*[8]byte)(mant[i*8:])
			for k := range 8 {
				lo := encodeFast(math.Float32bits(g[2*k]), e, 3)
				hi := encodeFast(math.Float32bits(g[2*k+1]), e, 3)
				m[k] = uint8(lo | hi<<4)
			}
		}
	case BFP2:
		for i := range n {
			g := (*[16]float32)(src[i*stride:])
			e := groupExp(g)
			exp[i] = uint8(e)
			m := (*[4]byte)(mant[i*4:])
			for k := range 4 {
				var b uint32
				for j := range 4 {
					b |= encodeFast(math.Float32bits(g[4*k+j]), e, 1) << (2 * j)
				}
				m[k] = uint8(b)
			}
		}
	default:
		panic("bfp: invalid format " + f.String())
	}
}

func groupExp(g *[16]float32) uint32 {
	var m uint32
	for _, v := range g {
		m = max(m, math.Float32bits(v)&0x7f800000)
	}
	return m >> 23
}

// encodeFast is encodeBits for an element whose exponent field does not
// exceed e (always true inside Pack), written without data-dependent
// branches.
func encodeFast(b, e uint32, w uint) uint32 {
	ex := b >> 23 & 0xff
	nz := (ex + 0xff) >> 8 // 1 unless ex == 0
	m := (b&0x7fffff | 0x800000) & -nz
	a := m >> (e - ex)
	s := 24 - w
	q := (a + (uint32(1)<<(s-1) - 1) + (a >> s & 1)) >> s
	maxq := uint32(1)<<w - 1
	q = min(q, maxq)
	return q | (b>>31&((q+maxq)>>w))<<w
}

// signedMag8/4/2 map a code to its signed magnitude as a float32 (the
// sign-only code gives -0).
var signedMag8, signedMag4, signedMag2 = magTable(7), magTable(3), magTable(1)

func magTable(w uint) []float32 {
	t := make([]float32, 1<<(w+1))
	for c := range t {
		v := float32(c & (1<<w - 1))
		if c>>w&1 == 1 {
			v = -v
			if v == 0 {
				v = float32(math.Copysign(0, -1))
			}
		}
		t[c] = v
	}
	return t
}

// unpackGroupsGo decodes n groups; group i's codes are at mant[i*gb:], its
// exponent at exp[i], its values go to dst[i*stride:][:16].
func unpackGroupsGo(f Format, mant, exp []byte, n int, dst []float32, stride int) {
	w := uint(f.MantissaBits())
	for i := range n {
		e := uint32(exp[i])
		d := (*[16]float32)(dst[i*stride:])
		if e < uint32(w) || e == 255 {
			unpackGroupSlow(f, mant, i, e, d)
			continue
		}
		// Value = signed magnitude * 2^(e-127-(w-1)), exact for these e.
		scale := math.Float32frombits((e - uint32(w-1)) << 23)
		switch f {
		case BFP8:
			m := (*[16]byte)(mant[i*16:])
			for k := range 16 {
				d[k] = signedMag8[m[k]] * scale
			}
		case BFP4:
			m := (*[8]byte)(mant[i*8:])
			for k := range 8 {
				d[2*k] = signedMag4[m[k]&15] * scale
				d[2*k+1] = signedMag4[m[k]>>4] * scale
			}
		case BFP2:
			m := (*[4]byte)(mant[i*4:])
			for k := range 4 {
				b := m[k]
				d[4*k] = signedMag2[b&3] * scale
				d[4*k+1] = signedMag2[b>>2&3] * scale
				d[4*k+2] = signedMag2[b>>4&3] * scale
				d[4*k+3] = signedMag2[b>>6] * scale
			}
		}
	}
}

// unpackGroupSlow decodes group i element by element with the full rule
// (exponents where the result may be subnormal, flushed, Inf or NaN).
func unpackGroupSlow(f Format, mant []byte, i int, e uint32, d *[16]float32) {
	w := uint(f.MantissaBits())
	bitsPer := w + 1
	gb := 16 * int(bitsPer) / 8
	m := mant[i*gb:][:gb]
	for k := range 16 {
		bit := uint(k) * bitsPer
		code := uint32(m[bit/8]) >> (bit % 8) & (1<<bitsPer - 1)
		d[k] = math.Float32frombits(decodeBits(code, e, w))
	}
}
