package gptq

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

// FuzzQuantize builds a small problem from arbitrary bytes — weights of any
// float32 value (including huge, tiny, subnormal, NaN, Inf) and activations
// for the Hessian — and checks that Quantize never panics, that its errors
// wrap the package's sentinels, and that every successful BFP result is
// finite and survives Pack→Unpack bit for bit.
func FuzzQuantize(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, uint8(3), uint8(5), uint8(0))
	f.Add(make([]byte, 64), uint8(1), uint8(1), uint8(1))
	big := make([]byte, 0, 256)
	for i := 0; i < 64; i++ {
		big = binary.LittleEndian.AppendUint32(big, math.Float32bits(float32(i%7-3)*0x1p120))
	}
	f.Add(big, uint8(4), uint8(7), uint8(2))
	tiny := make([]byte, 0, 256)
	for i := 0; i < 64; i++ {
		tiny = binary.LittleEndian.AppendUint32(tiny, math.Float32bits(float32(i%5-2)*0x1p-130))
	}
	f.Add(tiny, uint8(5), uint8(6), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, r8, c8, mode uint8) {
		rows, cols := int(r8%20)+1, int(c8%40)+1
		vals := func(n, off int) []float32 {
			v := make([]float32, n)
			for i := range v {
				j := (off + 4*i) % max(len(data)-3, 1)
				if len(data) >= 4 {
					v[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[j:]))
				}
			}
			return v
		}
		w := vals(rows*cols, 0)
		tokens := int(mode%4) * 3
		x := vals(tokens*cols, 7)
		for i, v := range x {
			// Keep activations finite and moderate so that the Hessian is.
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 1e6 {
				x[i] = 0
			}
		}
		hs := NewHessian(cols)
		if err := hs.Add(x, tokens); err != nil {
			t.Fatal(err)
		}
		h := hs.Matrix()
		opt := DefaultOptions()
		opt.BlockSize = int(mode%5) + 3
		opt.ActOrder = mode&8 != 0
		opt.Float64 = mode&16 != 0
		opt.KeepDead = mode&32 != 0
		grids := []Grid{NewBFPGrid(bfp.BFP4, bfp.AxisInput), NewBFPGrid(bfp.BFP8, bfp.AxisOutput), NewIntGrid(IntConfig{Bits: 3, GroupSize: 4, Sym: mode&64 != 0})}
		for _, g := range grids {
			res, err := Quantize(w, rows, cols, h, g, opt)
			if err != nil {
				if !errors.Is(err, ErrNotFinite) && !errors.Is(err, ErrNumeric) && !errors.Is(err, ErrHessian) {
					t.Fatalf("%v: unexpected error kind: %v", g, err)
				}
				continue
			}
			for i, v := range res.Q {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%v: Q[%d] = %v", g, i, v)
				}
			}
			if bg, ok := g.(*BFPGrid); ok {
				packRoundTrip(t, bg.Format, bg.Axis, res.Q, rows, cols)
			}
		}
	})
}
