package safetensors

import (
	"math"
	"testing"
)

func TestView(t *testing.T) {
	b := f32bytes(1.5, -2, float32(math.Inf(1)))
	v, err := View[float32](b)
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 3 || v[0] != 1.5 || v[1] != -2 || !math.IsInf(float64(v[2]), 1) {
		t.Errorf("View[float32] = %v", v)
	}
	v[1] = 4 // shares memory
	if w, _ := View[float32](b); w[1] != 4 {
		t.Error("view does not share the buffer")
	}
	bf, _ := AppendFloat32s(nil, []float32{1, 2}, BF16)
	u, err := View[uint16](bf)
	if err != nil || BF16ToFloat32(u[1]) != 2 {
		t.Errorf("View[uint16] of BF16 = %v, %v", u, err)
	}
	if _, err := View[float32](b[:5]); err == nil {
		t.Error("length not a multiple of 4 accepted")
	}
	if _, err := View[float32](b[1:5]); err == nil {
		t.Error("misaligned view accepted")
	}
}
