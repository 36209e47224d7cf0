package gptq

import (
	"fmt"
	"math"

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

// RTNOptions configures RTNWith.
type RTNOptions struct {
	// Exponent is the rule choosing each BFP group's exponent; 0 means
	// ExpMax (then RTNWith equals RTN). A rule for an integer grid is an
	// error.
	Exponent ExponentRule
	// Diag, when not nil, holds cols non-negative weights per input
	// column, normally the diagonal of the input Hessian (twice the mean
	// squared activation of each channel, Hessian.Matrix()'s diagonal):
	// ExpSearch then weights each value's squared error by its column's
	// entry. On the output axis a group lies in one column, whose values
	// share the weight, so Diag changes nothing there. ExpTTMetal ignores
	// it (the rule is unweighted).
	Diag []float64
	// Name identifies the matrix in error messages.
	Name string
}

// RTNWith is RTN with the exponent rule and weights of opt. Every output
// is exactly representable: bfp.Pack then bfp.Unpack (of the result, or
// of its transpose for the output axis) returns it bit for bit.
func RTNWith(w []float32, rows, cols int, g Grid, opt RTNOptions) ([]float32, error) {
	if err := checkWeights(w, rows, cols, opt.Name); err != nil {
		return nil, err
	}
	if err := checkGrid(g, opt.Name); err != nil {
		return nil, err
	}
	if err := checkRule(opt.Exponent, g, opt.Name); err != nil {
		return nil, err
	}
	if opt.Diag != nil {
		if len(opt.Diag) != cols {
			return nil, fmt.Errorf("%w: Hessian diagonal%s has %d values, want one per input column (%d)", ErrShape, label(opt.Name), len(opt.Diag), cols)
		}
		for c, v := range opt.Diag {
			if !(v >= 0) || math.IsInf(v, 1) {
				return nil, fmt.Errorf("%w: Hessian diagonal%s [%d] = %g: want a finite value ≥ 0", ErrHessian, label(opt.Name), c, v)
			}
		}
	}
	return rtnRuleTo(make([]float32, len(w)), g, w, rows, cols, opt.Exponent, opt.Diag), nil
}

// rtnRuleTo is rtnTo with an exponent rule (0 or ExpMax: rtnTo itself) and
// optional per-column weights for ExpSearch on the input axis.
func rtnRuleTo[T float](q []T, g Grid, w []T, rows, cols int, rule ExponentRule, diag []float64) []T {
	bg, ok := g.(*BFPGrid)
	if !ok || rule == 0 || rule == ExpMax {
		return rtnTo(q, g, w, rows, cols)
	}
	rd := newBFPRounder(bg.Format)
	ec := newExpChoice(rd, rule)
	if bg.Axis == bfp.AxisInput {
		for r := 0; r < rows; r++ {
			for c0 := 0; c0 < cols; c0 += bfp.GroupSize {
				c1 := min(c0+bfp.GroupSize, cols)
				x := w[r*cols+c0 : r*cols+c1]
				var wts []float64
				if diag != nil {
					wts = diag[c0:c1]
				}
				bfpRoundConst(rd, x, q[r*cols+c0:r*cols+c1], choose(&ec, x, wts, maxExponent(x)))
			}
		}
		return q
	}
	var buf, qb [bfp.GroupSize]T
	for c := 0; c < cols; c++ {
		for r0 := 0; r0 < rows; r0 += bfp.GroupSize {
			r1 := min(r0+bfp.GroupSize, rows)
			b := buf[:r1-r0]
			for r := r0; r < r1; r++ {
				b[r-r0] = w[r*cols+c]
			}
			bfpRoundConst(rd, b, qb[:r1-r0], choose(&ec, b, nil, maxExponent(b)))
			for r := r0; r < r1; r++ {
				q[r*cols+c] = qb[r-r0]
			}
		}
	}
	return q
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
		if g.Axis == bfp.AxisInput {
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

// ProxyLoss returns ½·tr(Δ·H·Δᵀ) for Δ = w − q, the loss Result.ProxyLoss
// reports, for any quantized q of the rows×cols (out×in) matrix w, with h
// the cols×cols Hessian (row-major). Lengths that do not fit the shape
// are an error.
func ProxyLoss(w, q []float32, rows, cols int, h []float64) (float64, error) {
	if rows <= 0 || cols <= 0 || len(w) != rows*cols || len(q) != rows*cols || len(h) != cols*cols {
		return 0, fmt.Errorf("%w: proxy loss of %d and %d values with a Hessian of %d for %d×%d", ErrShape, len(w), len(q), len(h), rows, cols)
	}
	return proxyLoss(w, q, rows, cols, h), nil
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
