package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Conversions between tensor bytes and float32/float64.
//
// Decoding is exact for F32, F16, BF16 and the FP8 types to float32 and for
// every supported type to float64. F64 to float32 rounds to nearest even, as
// do integers of magnitude above 2^24 (2^53 for float64). NaN payloads of
// F16, BF16 and F32 are preserved; FP8 NaNs become quiet NaNs of the same
// sign. BOOL decodes to 0 or 1 (any non-zero byte is 1).
//
// FP8 follows the OCP 8-bit floating point specification: F8_E4M3 (the "fn"
// variant: no infinities, S.1111.111 is NaN, largest finite 448) and F8_E5M2
// (IEEE-like: exponent 31 is infinity when the mantissa is 0, NaN
// otherwise). The FNUZ variants have biases 8 and 16, no negative zero and
// no infinities; their only NaN is 0x80. F8_E8M0 is 2^(e-127) with 0xFF NaN.
// The sub-byte types (F4, F6_*) and C64 are not converted.

// supportsDecode reports whether dt can be decoded to floats.
func supportsDecode(dt DType) bool {
	switch dt {
	case F4, F6_E2M3, F6_E3M2, C64:
		return false
	}
	return dt.Valid()
}

var (
	lutE4M3, lutE5M2, lutE4M3FNUZ, lutE5M2FNUZ, lutE8M0 [256]float32
)

func init() {
	for i := 0; i < 256; i++ {
		b := uint8(i)
		lutE4M3[i] = decodeMinifloat(b, 4, 3, 7, e4m3fn)
		lutE5M2[i] = decodeMinifloat(b, 5, 2, 15, ieee)
		lutE4M3FNUZ[i] = decodeMinifloat(b, 4, 3, 8, fnuz)
		lutE5M2FNUZ[i] = decodeMinifloat(b, 5, 2, 16, fnuz)
		if b == 0xff {
			lutE8M0[i] = float32(math.NaN())
		} else {
			lutE8M0[i] = float32(math.Ldexp(1, int(b)-127))
		}
	}
}

type nanRule int

const (
	ieee   nanRule = iota // max exponent: mantissa 0 is Inf, else NaN
	e4m3fn                // only all-ones exponent and mantissa is NaN; no Inf
	fnuz                  // only 0x80 is NaN; no Inf, no -0
)

// decodeMinifloat decodes a sign/exponent/mantissa byte exactly.
func decodeMinifloat(b uint8, ebits, mbits uint, bias int, rule nanRule) float32 {
	sign := b >> 7
	e := int(b>>mbits) & (1<<ebits - 1)
	m := int(b) & (1<<mbits - 1)
	emax := 1<<ebits - 1
	neg := func(v float64) float32 {
		if sign == 1 {
			v = -v
		}
		return float32(v)
	}
	switch rule {
	case ieee:
		if e == emax {
			if m == 0 {
				return neg(math.Inf(1))
			}
			return neg(math.NaN())
		}
	case e4m3fn:
		if e == emax && m == 1<<mbits-1 {
			return neg(math.NaN())
		}
	case fnuz:
		if b == 0x80 {
			return float32(math.NaN())
		}
	}
	if e == 0 {
		return neg(math.Ldexp(float64(m), 1-bias-int(mbits)))
	}
	return neg(math.Ldexp(float64(m|1<<mbits), e-bias-int(mbits)))
}

// BF16ToFloat32 returns the value of a bfloat16 bit pattern.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 rounds f to the nearest bfloat16 (ties to even). NaNs stay
// NaN (quietened, sign kept).
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// F16ToFloat32 returns the value of an IEEE binary16 bit pattern.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h & 0x3ff)
	switch {
	case e == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	case e != 0:
		return math.Float32frombits(sign | (e+112)<<23 | m<<13)
	case m == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: m * 2^-24, exact in float32.
	v := float32(m) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// Float32ToF16 rounds f to the nearest IEEE binary16 (ties to even);
// values beyond the largest finite half become infinities. NaNs stay NaN.
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man == 0 {
			return sign | 0x7c00
		}
		return sign | 0x7e00 | uint16(man>>13)
	}
	e := exp - 112 // half exponent field
	if e >= 31 {
		return sign | 0x7c00
	}
	if e >= 1 {
		v := uint32(e)<<10 | man>>13
		rem := man & 0x1fff
		if rem > 0x1000 || (rem == 0x1000 && v&1 == 1) {
			v++ // may carry into the exponent, up to infinity (0x7c00)
		}
		return sign | uint16(v)
	}
	if exp == 0 {
		return sign // float32 subnormals are far below half's range
	}
	m := man | 0x800000
	shift := uint(126 - exp)
	if shift > 24 {
		return sign
	}
	v := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && v&1 == 1) {
		v++
	}
	return sign | uint16(v)
}

func checkDecode(nDst, nSrc int, dt DType) error {
	if !supportsDecode(dt) {
		return fmt.Errorf("safetensors: %w: cannot convert %s to floating point", ErrUnsupportedDType, dt)
	}
	if nSrc != nDst*(dt.Bits()/8) {
		return fmt.Errorf("safetensors: %d bytes of %s do not hold %d elements", nSrc, dt, nDst)
	}
	return nil
}

// DecodeFloat32s converts the little-endian elements of dtype dt in src to
// float32 in dst; len(src) must be len(dst) times the element size.
func DecodeFloat32s(dst []float32, src []byte, dt DType) error {
	if err := checkDecode(len(dst), len(src), dt); err != nil {
		return err
	}
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case BF16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(src[2*i])<<16 | uint32(src[2*i+1])<<24)
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	case F8_E4M3:
		decodeLUT(dst, src, &lutE4M3)
	case F8_E5M2:
		decodeLUT(dst, src, &lutE5M2)
	case F8_E4M3FNUZ:
		decodeLUT(dst, src, &lutE4M3FNUZ)
	case F8_E5M2FNUZ:
		decodeLUT(dst, src, &lutE5M2FNUZ)
	case F8_E8M0:
		decodeLUT(dst, src, &lutE8M0)
	case U64:
		for i := range dst {
			dst[i] = float32(binary.LittleEndian.Uint64(src[8*i:]))
		}
	default:
		for i := range dst {
			dst[i] = float32(intAt(src, i, dt))
		}
	}
	return nil
}

func decodeLUT(dst []float32, src []byte, lut *[256]float32) {
	src = src[:len(dst)]
	for i, b := range src {
		dst[i] = lut[b]
	}
}

// intAt returns element i of an integer (or BOOL) tensor as int64; U64
// values above MaxInt64 wrap and are handled by the callers.
func intAt(src []byte, i int, dt DType) int64 {
	switch dt {
	case BOOL:
		if src[i] != 0 {
			return 1
		}
		return 0
	case U8:
		return int64(src[i])
	case I8:
		return int64(int8(src[i]))
	case I16:
		return int64(int16(binary.LittleEndian.Uint16(src[2*i:])))
	case U16:
		return int64(binary.LittleEndian.Uint16(src[2*i:]))
	case I32:
		return int64(int32(binary.LittleEndian.Uint32(src[4*i:])))
	case U32:
		return int64(binary.LittleEndian.Uint32(src[4*i:]))
	case I64, U64:
		return int64(binary.LittleEndian.Uint64(src[8*i:]))
	}
	panic("safetensors: intAt on " + dt.String())
}

// DecodeFloat64s converts the elements of dtype dt in src to float64 in
// dst; len(src) must be len(dst) times the element size.
func DecodeFloat64s(dst []float64, src []byte, dt DType) error {
	if err := checkDecode(len(dst), len(src), dt); err != nil {
		return err
	}
	switch dt {
	case F64:
		for i := range dst {
			dst[i] = math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:]))
		}
	case U64:
		for i := range dst {
			dst[i] = float64(binary.LittleEndian.Uint64(src[8*i:]))
		}
	case F32, BF16, F16, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0:
		const chunk = 4096
		var tmp [chunk]float32
		w := dt.Bits() / 8
		for i := 0; i < len(dst); i += chunk {
			n := min(chunk, len(dst)-i)
			if err := DecodeFloat32s(tmp[:n], src[i*w:(i+n)*w], dt); err != nil {
				return err
			}
			for k := 0; k < n; k++ {
				dst[i+k] = float64(tmp[k])
			}
		}
	default:
		for i := range dst {
			dst[i] = float64(intAt(src, i, dt))
		}
	}
	return nil
}

// EncodeFloat32s converts src to little-endian elements of dtype dt (F32,
// F64, F16 or BF16, rounding to nearest even) in dst, which must hold
// exactly len(src) elements.
func EncodeFloat32s(dst []byte, src []float32, dt DType) error {
	switch dt {
	case F32, F64, F16, BF16:
	default:
		return fmt.Errorf("safetensors: %w: cannot encode float32 as %s", ErrUnsupportedDType, dt)
	}
	if len(dst) != len(src)*(dt.Bits()/8) {
		return fmt.Errorf("safetensors: %d bytes of %s cannot hold %d elements", len(dst), dt, len(src))
	}
	switch dt {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F64:
		for i, v := range src {
			binary.LittleEndian.PutUint64(dst[8*i:], math.Float64bits(float64(v)))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], Float32ToF16(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], Float32ToBF16(v))
		}
	}
	return nil
}

// AppendFloat32s appends the encoding of src as dtype dt (see
// EncodeFloat32s) to dst and returns the extended slice.
func AppendFloat32s(dst []byte, src []float32, dt DType) ([]byte, error) {
	n := len(src) * (dt.Bits() / 8)
	out := append(dst, make([]byte, n)...)
	if err := EncodeFloat32s(out[len(dst):], src, dt); err != nil {
		return dst, err
	}
	return out, nil
}

// decodeChunk bounds the raw bytes held at once while converting a tensor.
var decodeChunk int64 = 4 << 20

// Float32s reads the tensor and converts it to float32 (see DecodeFloat32s
// for the rules). It reads the file in chunks, so the only large allocation
// is the result.
func (f *File) Float32s(name string) ([]float32, error) {
	t, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	if !supportsDecode(t.DType) {
		return nil, &Error{Path: f.path, Tensor: name, hasT: true, Kind: ErrUnsupportedDType, Detail: "cannot convert " + t.DType.String() + " to float32"}
	}
	dst := make([]float32, t.NumElements())
	if err := f.ReadFloat32s(name, dst, 0); err != nil {
		return nil, err
	}
	return dst, nil
}

// ReadFloat32s converts elements [start, start+len(dst)) of the tensor to
// float32 in dst, reading only those elements from the file.
func (f *File) ReadFloat32s(name string, dst []float32, start int64) error {
	t, err := f.lookup(name)
	if err != nil {
		return err
	}
	if !supportsDecode(t.DType) {
		return &Error{Path: f.path, Tensor: name, hasT: true, Kind: ErrUnsupportedDType, Detail: "cannot convert " + t.DType.String() + " to float32"}
	}
	w := int64(t.DType.Bits() / 8)
	if start < 0 || start > t.NumElements() || int64(len(dst)) > t.NumElements()-start {
		return fmt.Errorf("safetensors: %s: tensor %q: elements [%d,%d) outside its %d elements (shape %v)",
			f.path, name, start, start+int64(len(dst)), t.NumElements(), t.Shape)
	}
	per := int(decodeChunk / w)
	buf := make([]byte, min(int64(len(dst)), int64(per))*w)
	for i := 0; i < len(dst); i += per {
		n := min(per, len(dst)-i)
		b := buf[:int64(n)*w]
		if err := f.readAt(b, t, (start+int64(i))*w); err != nil {
			return err
		}
		if err := DecodeFloat32s(dst[i:i+n], b, t.DType); err != nil {
			return err
		}
	}
	return nil
}

// Float64s reads the tensor and converts it to float64 exactly (integers
// above 2^53 in magnitude are rounded).
func (f *File) Float64s(name string) ([]float64, error) {
	t, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	if !supportsDecode(t.DType) {
		return nil, &Error{Path: f.path, Tensor: name, hasT: true, Kind: ErrUnsupportedDType, Detail: "cannot convert " + t.DType.String() + " to float64"}
	}
	raw, err := f.ReadTensor(name)
	if err != nil {
		return nil, err
	}
	dst := make([]float64, t.NumElements())
	if err := DecodeFloat64s(dst, raw, t.DType); err != nil {
		return nil, err
	}
	return dst, nil
}

// Int64s reads an integer or BOOL tensor as int64 values. U64 values above
// the largest int64 are an error.
func (f *File) Int64s(name string) ([]int64, error) {
	t, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	switch t.DType {
	case BOOL, U8, I8, I16, U16, I32, U32, I64, U64:
	default:
		return nil, &Error{Path: f.path, Tensor: name, hasT: true, Kind: ErrUnsupportedDType, Detail: t.DType.String() + " is not an integer type"}
	}
	raw, err := f.ReadTensor(name)
	if err != nil {
		return nil, err
	}
	dst := make([]int64, t.NumElements())
	for i := range dst {
		dst[i] = intAt(raw, i, t.DType)
		if t.DType == U64 && dst[i] < 0 {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: element %d (%d) does not fit in int64", f.path, name, i, binary.LittleEndian.Uint64(raw[8*i:]))
		}
	}
	return dst, nil
}
