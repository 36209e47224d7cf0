package gptq

import (
	"math"
	"strings"
	"testing"
)

// TestHessianIndependentOfBatching checks that the accumulated Hessian
// depends only on the token stream: the same rows added in one call, in
// uneven batches, or row by row give bit-identical matrices.
func TestHessianIndependentOfBatching(t *testing.T) {
	const rows, cols = 700, 37
	x := make([]float32, rows*cols)
	for i := range x {
		x[i] = float32((i*7919)%1013)/101 - 5
	}
	whole := NewHessian(cols)
	if err := whole.Add(x, rows); err != nil {
		t.Fatal(err)
	}
	want := whole.Matrix()
	for _, batch := range []int{1, 3, 100, 255, 256, 257, 699} {
		h := NewHessian(cols)
		for r := 0; r < rows; r += batch {
			n := min(batch, rows-r)
			if err := h.Add(x[r*cols:(r+n)*cols], n); err != nil {
				t.Fatal(err)
			}
		}
		if h.Tokens() != rows {
			t.Fatalf("batch %d: %d tokens, want %d", batch, h.Tokens(), rows)
		}
		for i, v := range h.Matrix() {
			if v != want[i] {
				t.Fatalf("batch %d: H[%d,%d] = %v, one call gives %v", batch, i/cols, i%cols, v, want[i])
			}
		}
	}
}

// TestHessianRejectsOutOfRange checks the range scan at the edges: the
// largest float32 not above 1e15 is accepted, the next one, NaN and ±Inf are
// rejected and located.
func TestHessianRejectsOutOfRange(t *testing.T) {
	const cols = 4
	ok := float32(1e15)
	next := math.Nextafter32(ok, float32(math.Inf(1)))
	for _, c := range []struct {
		v    float32
		fail bool
	}{{ok, false}, {-ok, false}, {next, true}, {-next, true}, {float32(math.NaN()), true}, {float32(math.Inf(-1)), true}} {
		x := make([]float32, 3000*cols)
		x[2999*cols+2] = c.v
		err := NewHessian(cols).Add(x, 3000)
		if (err != nil) != c.fail {
			t.Errorf("value %v: error %v, want failure %v", c.v, err, c.fail)
		}
		if err != nil && !strings.Contains(err.Error(), "[2999,2]") {
			t.Errorf("value %v: error %q does not locate [2999,2]", c.v, err)
		}
	}
}
