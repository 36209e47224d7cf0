package manifest

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/x448/float16"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/safetensors"
)

// IsFloatDType reports whether a safetensors dtype name is one this package
// converts to float32 values exactly.
func IsFloatDType(dt string) bool {
	switch dt {
	case "F32", "BF16", "F16", "F64":
		return true
	}
	return false
}

// floatDTypeOf returns the safetensors dtype of a float dtype name after
// checking that nbytes is a whole number of its elements.
func floatDTypeOf(dt string, nbytes int) (safetensors.DType, error) {
	d, err := safetensors.ParseDType(dt)
	if err != nil || !IsFloatDType(dt) {
		return 0, fmt.Errorf("dtype %s has no float32 conversion", dt)
	}
	if nbytes%(d.Bits()/8) != 0 {
		return 0, fmt.Errorf("%d bytes is not a whole number of %s values", nbytes, dt)
	}
	return d, nil
}

// DecodeFloats converts little-endian tensor bytes of a float dtype to
// float32. F64 values are rounded to float32 (ties to even), the others are
// exact.
func DecodeFloats(dt string, b []byte) ([]float32, error) {
	d, err := floatDTypeOf(dt, len(b))
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(b)/(d.Bits()/8))
	if d == safetensors.F16 {
		// Half NaNs come out quiet, as a hardware half-to-single conversion
		// gives them (safetensors.DecodeFloat32s keeps the payload as is).
		for i := range out {
			out[i] = float16.Frombits(binary.LittleEndian.Uint16(b[2*i:])).Float32()
		}
		return out, nil
	}
	if err := safetensors.DecodeFloat32s(out, b, d); err != nil {
		return nil, err
	}
	return out, nil
}

// FiniteFloats is AllFinite of DecodeFloats(dt, b), decoding a chunk at a
// time so that a large tensor is never held as float32 whole.
func FiniteFloats(dt string, b []byte) (bool, error) {
	d, err := floatDTypeOf(dt, len(b))
	if err != nil {
		return false, err
	}
	size := d.Bits() / 8
	var buf [4096]float32
	for len(b) > 0 {
		n := min(len(buf), len(b)/size)
		if err := safetensors.DecodeFloat32s(buf[:n], b[:n*size], d); err != nil {
			return false, err
		}
		if !AllFinite(buf[:n]) {
			return false, nil
		}
		b = b[n*size:]
	}
	return true, nil
}

// AllFinite reports whether every value is finite.
func AllFinite(v []float32) bool {
	for _, x := range v {
		if math.Float32bits(x)&0x7f800000 == 0x7f800000 {
			return false
		}
	}
	return true
}

// EncodeFloats encodes values as BF16 (nearest, ties to even; NaN stays a
// quiet NaN with its sign) or F32 little-endian bytes.
func EncodeFloats(dt string, v []float32) []byte {
	var d safetensors.DType
	switch dt {
	case "BF16":
		d = safetensors.BF16
	case "F32":
		d = safetensors.F32
	default:
		panic("manifest: EncodeFloats to " + dt)
	}
	out, err := safetensors.AppendFloat32s(nil, v, d)
	if err != nil {
		panic("manifest: " + err.Error())
	}
	return out
}

// MatDims returns the number of leading slices and the rows and columns of
// the last two dims of shape (a 1-D shape is one row; a scalar one value).
func MatDims(shape []int64) (slices, rows, cols int) {
	switch len(shape) {
	case 0:
		return 1, 1, 1
	case 1:
		return 1, 1, int(shape[0])
	}
	slices = 1
	for _, d := range shape[:len(shape)-2] {
		slices *= int(d)
	}
	return slices, int(shape[len(shape)-2]), int(shape[len(shape)-1])
}

// PackedGeometry returns, for a BFP tensor of the given logical shape and
// orientation, the padded shape (of the packed matrices, leading dims kept)
// and the packed byte size.
func PackedGeometry(f bfp.Format, t bfp.Tile, shape []int64, orient string) ([]int64, int64, error) {
	slices, rows, cols := MatDims(shape)
	if orient == OrientTransposed {
		rows, cols = cols, rows
	}
	if slices <= 0 || rows <= 0 || cols <= 0 {
		return nil, 0, fmt.Errorf("shape %v has no elements to pack", shape)
	}
	n, err := bfp.PackedSize(f, t, rows, cols)
	if err != nil {
		return nil, 0, err
	}
	pr := int64((rows + t.H - 1) / t.H * t.H)
	pc := int64((cols + t.W - 1) / t.W * t.W)
	var padded []int64
	if len(shape) > 2 {
		padded = append(padded, shape[:len(shape)-2]...)
	}
	padded = append(padded, pr, pc)
	return padded, int64(n) * int64(slices), nil
}

// transposeInto writes the transpose of the rows×cols matrix src to dst.
func transposeInto(dst, src []float32, rows, cols int) {
	for r := 0; r < rows; r++ {
		row := src[r*cols : (r+1)*cols]
		for c, v := range row {
			dst[c*rows+r] = v
		}
	}
}

// PackBFP packs logical values (row-major over shape) in the given
// orientation, slice by slice.
func PackBFP(f bfp.Format, t bfp.Tile, vals []float32, shape []int64, orient string) ([]byte, error) {
	slices, rows, cols := MatDims(shape)
	if len(vals) != slices*rows*cols {
		return nil, fmt.Errorf("%d values for shape %v", len(vals), shape)
	}
	pr, pc := rows, cols
	if orient == OrientTransposed {
		pr, pc = cols, rows
	}
	per, err := bfp.PackedSize(f, t, pr, pc)
	if err != nil {
		return nil, err
	}
	out := make([]byte, per*slices)
	var tmp []float32
	if orient == OrientTransposed {
		tmp = make([]float32, rows*cols)
	}
	for s := 0; s < slices; s++ {
		src := vals[s*rows*cols : (s+1)*rows*cols]
		if orient == OrientTransposed {
			transposeInto(tmp, src, rows, cols)
			src = tmp
		}
		if err := bfp.PackInto(out[s*per:(s+1)*per], f, t, src, pr, pc); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// UnpackBFP decodes packed bytes back to logical values (row-major over
// shape).
func UnpackBFP(f bfp.Format, t bfp.Tile, packed []byte, shape []int64, orient string) ([]float32, error) {
	slices, rows, cols := MatDims(shape)
	pr, pc := rows, cols
	if orient == OrientTransposed {
		pr, pc = cols, rows
	}
	per, err := bfp.PackedSize(f, t, pr, pc)
	if err != nil {
		return nil, err
	}
	if len(packed) != per*slices {
		return nil, fmt.Errorf("%d packed bytes, want %d for shape %v as %s %s", len(packed), per*slices, shape, f, t)
	}
	out := make([]float32, slices*rows*cols)
	var tmp []float32
	if orient == OrientTransposed {
		tmp = make([]float32, rows*cols)
	}
	for s := 0; s < slices; s++ {
		dst := out[s*rows*cols : (s+1)*rows*cols]
		if orient == OrientTransposed {
			if err := bfp.UnpackInto(tmp, f, t, packed[s*per:(s+1)*per], pr, pc); err != nil {
				return nil, err
			}
			transposeInto(dst, tmp, pr, pc)
		} else if err := bfp.UnpackInto(dst, f, t, packed[s*per:(s+1)*per], pr, pc); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// SquaredError returns Σ (a−b)² accumulated in float64 in index order.
func SquaredError(a, b []float32) float64 {
	var s float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		s += d * d
	}
	return s
}

// PackExact packs values that must lie on the format's grid (a quantizer's
// output) and checks that they do: the packed bytes decode to the same
// values, compared as numbers (so −0 and +0 are the same value). It returns
// the packed bytes and the decoded values, or an error naming the first
// value that is not representable; it never panics.
func PackExact(f bfp.Format, t bfp.Tile, q []float32, shape []int64, orient string) ([]byte, []float32, error) {
	packed, err := PackBFP(f, t, q, shape, orient)
	if err != nil {
		return nil, nil, err
	}
	back, err := UnpackBFP(f, t, packed, shape, orient)
	if err != nil {
		return nil, nil, err
	}
	for i := range back {
		if back[i] != q[i] {
			return nil, nil, fmt.Errorf("quantized value %d (%g) is not representable in %s: it packs to %g", i, q[i], f, back[i])
		}
	}
	return packed, back, nil
}
