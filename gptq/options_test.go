package gptq

import (
	"errors"
	"math"
	"testing"
)

// TestOptionsValidate: out-of-range options are refused by Validate and by
// Quantize with ErrOptions, never turned into a fallback.
func TestOptionsValidate(t *testing.T) {
	good := []Options{DefaultOptions(), {}, {BlockSize: 1}, {BlockSize: MaxBlockSize, SubBlock: 8, PercDamp: MaxPercDamp}}
	for _, o := range good {
		if err := o.Validate(); err != nil {
			t.Errorf("%+v refused: %v", o, err)
		}
	}
	bad := []Options{
		{BlockSize: -5, PercDamp: 0.01},
		{BlockSize: MaxBlockSize + 1, PercDamp: 0.01},
		{BlockSize: 128, SubBlock: -1, PercDamp: 0.01},
		{BlockSize: 128, PercDamp: -1},
		{BlockSize: 128, PercDamp: math.NaN()},
		{BlockSize: 128, PercDamp: math.Inf(1)},
		{BlockSize: 128, PercDamp: 1.5},
	}
	const rows, cols = 2, 4
	w := []float32{1, -2, 3, -4, 0.5, 0.25, -0.125, 2}
	h := make([]float64, cols*cols)
	for i := 0; i < cols; i++ {
		h[i*cols+i] = 1
	}
	for _, o := range bad {
		if err := o.Validate(); !errors.Is(err, ErrOptions) {
			t.Errorf("%+v: Validate = %v, want ErrOptions", o, err)
		}
		if _, err := Quantize(w, rows, cols, h, NewIntGrid(IntConfig{Bits: 4}), o); !errors.Is(err, ErrOptions) {
			t.Errorf("%+v: Quantize = %v, want ErrOptions", o, err)
		}
		if _, err := NewFactor(h, cols, o); !errors.Is(err, ErrOptions) {
			t.Errorf("%+v: NewFactor = %v, want ErrOptions", o, err)
		}
	}
}
