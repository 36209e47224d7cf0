package gptq

import (
	"fmt"

	"github.com/ttquant/ttquant/bfp"
)

// RTN rounds every weight of w (rows = outputs, cols = inputs, row-major) to
// the nearest value of grid g without error feedback, in float32 arithmetic:
// integer grids take each row's (or group's) grid from w itself; BFP grids
// take each group's exponent from its own values, so the result equals
// bfp.Pack followed by bfp.Unpack (of w for the input axis, of wᵀ for the
// output axis). It is the baseline GPTQ is measured against.
func RTN(w []float32, rows, cols int, g Grid) ([]float32, error) {
	if err := checkWeights(w, rows, cols, ""); err != nil {
		return nil, err
	}
	if err := checkGrid(g, ""); err != nil {
		return nil, err
	}
	return rtn(g, w, rows, cols), nil
}

func rtn[T float](g Grid, w []T, rows, cols int) []T {
	return rtnTo(make([]T, len(w)), g, w, rows, cols)
}

// rtnTo is rtn writing every element of q (len(w) values).
func rtnTo[T float](q []T, g Grid, w []T, rows, cols int) []T {
	switch g := g.(type) {
	case *IntGrid:
		cfg := &g.cfg
		maxq := T(int(1)<<cfg.Bits - 1)
		gs := cfg.GroupSize
		if gs <= 0 {
			gs = cols
		}
		for r := 0; r < rows; r++ {
			for c0 := 0; c0 < cols; c0 += gs {
				c1 := min(c0+gs, cols)
				x := w[r*cols+c0 : r*cols+c1]
				s, z := intParams(x, cfg)
				for j, v := range x {
					q[r*cols+c0+j], _ = intQuant(v, s, z, maxq)
				}
			}
		}
	case *BFPGrid:
		rd := newBFPRounder(g.Format)
		var buf, qb [bfp.GroupSize]float32
		if g.Axis == InputAxis {
			for r := 0; r < rows; r++ {
				bfpRoundGroups(rd, w[r*cols:(r+1)*cols], q[r*cols:(r+1)*cols])
			}
		} else {
			for c := 0; c < cols; c++ {
				for r0 := 0; r0 < rows; r0 += bfp.GroupSize {
					r1 := min(r0+bfp.GroupSize, rows)
					b := buf[:r1-r0]
					for r := r0; r < r1; r++ {
						b[r-r0] = float32(w[r*cols+c])
					}
					bfpRoundConst(rd, b, qb[:r1-r0], bfp.SharedExponent(b))
					for r := r0; r < r1; r++ {
						q[r*cols+c] = T(qb[r-r0])
					}
				}
			}
		}
	default:
		panic(fmt.Sprintf("gptq: unknown grid type %T", g))
	}
	return q
}

// proxyLoss returns ½·tr(Δ·H·Δᵀ) for Δ = w − q.
func proxyLoss[T float](w []float32, q []T, rows, cols int, h []float64) float64 {
	d := getBuf[float32](rows * cols)
	defer putBuf(d)
	for i, v := range w {
		d[i] = float32(float64(v) - float64(q[i]))
	}
	return traceForm(d, rows, cols, h) / 2
}
