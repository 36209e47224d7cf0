package forward

import (
	"errors"
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
