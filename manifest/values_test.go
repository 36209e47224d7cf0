package manifest

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/bfp"
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

// TestPackExact: values on the grid pack and come back (−0 counts as 0);
// a value off the grid is an error naming it, not a panic.
func TestPackExact(t *testing.T) {
	shape := []int64{1, 3}
	tile, _ := bfp.ParseTile("32x32")
	packed, back, err := PackExact(bfp.BFP8, tile, []float32{1, float32(math.Copysign(0, -1)), 0.5}, shape, OrientRow)
	if err != nil || len(packed) == 0 || back[0] != 1 || back[1] != 0 || back[2] != 0.5 {
		t.Fatalf("on-grid values: %v %v", back, err)
	}
	if _, _, err := PackExact(bfp.BFP4, tile, []float32{1, 0.0001}, []int64{1, 2}, OrientRow); err == nil || !strings.Contains(err.Error(), "value 1") {
		t.Fatalf("off-grid value: %v", err)
	}
}
