package manifest

import (
	"encoding/binary"
	"math"
	"testing"
)

// TestFiniteFloats checks the chunked finiteness test against decoding the
// whole tensor, with the one non-finite value placed in the first chunk, on
// a chunk boundary and in the last, short chunk.
func TestFiniteFloats(t *testing.T) {
	const n = 3*4096 + 17
	for _, dt := range []string{"F32", "BF16", "F16", "F64"} {
		for _, at := range []int{-1, 0, 4095, 4096, n - 1} {
			size := map[string]int{"F32": 4, "BF16": 2, "F16": 2, "F64": 8}[dt]
			b := make([]byte, n*size)
			for i := 0; i < n; i++ {
				putFloat(dt, b[i*size:], 1.5)
			}
			if at >= 0 {
				putFloat(dt, b[at*size:], math.Inf(-1))
			}
			vals, err := DecodeFloats(dt, b)
			if err != nil {
				t.Fatal(err)
			}
			got, err := FiniteFloats(dt, b)
			if err != nil {
				t.Fatal(err)
			}
			if want := at < 0; got != want || AllFinite(vals) != want {
				t.Errorf("%s, infinity at %d: FiniteFloats %v, AllFinite(DecodeFloats) %v, want %v", dt, at, got, AllFinite(vals), want)
			}
		}
	}
	if _, err := FiniteFloats("BF16", make([]byte, 3)); err == nil {
		t.Error("3 bytes of BF16: no error")
	}
	if _, err := FiniteFloats("I32", make([]byte, 4)); err == nil {
		t.Error("I32: no error")
	}
}

// putFloat writes v in dtype dt; the values used are exact in every dtype.
func putFloat(dt string, b []byte, v float64) {
	switch dt {
	case "F32":
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case "BF16":
		binary.LittleEndian.PutUint16(b, uint16(math.Float32bits(float32(v))>>16))
	case "F16":
		h := uint16(0x3e00) // 1.5
		if math.IsInf(v, -1) {
			h = 0xfc00
		}
		binary.LittleEndian.PutUint16(b, h)
	case "F64":
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
	}
}
