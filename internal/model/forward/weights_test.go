package forward

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestCopyView(t *testing.T) {
	all := []float32{0, 1, 2, 3, 4, 5, 6, 7}
	dst := make([]float32, 2)
	if err := CopyView("w", all, 2, []int64{2, 2}, dst, 1); err != nil || dst[0] != 3 || dst[1] != 4 {
		t.Errorf("view read %v, %v: want [3 4]", dst, err)
	}
	for _, c := range []struct{ off, start int64 }{{2, 3}, {2, -1}, {6, 0}, {-1, 0}} {
		var we *WeightError
		if err := CopyView("w", all, c.off, []int64{2, 2}, dst, c.start); !errors.As(err, &we) || we.Tensor != "w" {
			t.Errorf("offset %d start %d: %v, want a WeightError naming w", c.off, c.start, err)
		}
	}
}

// TestCheckFinite: the kernel scan finds every NaN and infinity, at the
// element it names, and lets the extreme finite values (largest, negative,
// subnormal, negative zero) pass.
func TestCheckFinite(t *testing.T) {
	v := make([]float32, 3000)
	edge := []float32{math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, float32(math.Copysign(0, -1)), -1}
	for i := range v {
		v[i] = edge[i%len(edge)]
	}
	if err := checkFinite("t", v, 0); err != nil {
		t.Fatalf("finite values refused: %v", err)
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0xffc00001)} {
		for _, at := range []int{0, 1023, 1024, 2999} {
			w := append([]float32(nil), v...)
			w[at] = bad
			err := checkFinite("t", w, 10)
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at element %d", 10+at)) {
				t.Errorf("%v at %d: %v", bad, at, err)
			}
		}
	}
}
