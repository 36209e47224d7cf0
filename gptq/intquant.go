package gptq

import "math"

// roundEven rounds half to even, like torch.round.
func roundEven[T float](x T) T { return T(math.RoundToEven(float64(x))) }

// intParams computes the reference's per-row grid (scale, zero) for the
// values x of one row (or one group of one row), in the arithmetic of T.
func intParams[T float](x []T, c *IntConfig) (scale, zero T) {
	maxq := T(int(1)<<c.Bits - 1)
	var xmin, xmax T
	for _, v := range x {
		xmin = min(xmin, v)
		xmax = max(xmax, v)
	}
	if c.Sym {
		xmax = max(-xmin, xmax)
		if xmin < 0 {
			xmin = -xmax
		}
	}
	if xmin == 0 && xmax == 0 {
		xmin, xmax = -1, 1
	}
	scale = (xmax - xmin) / maxq
	if !(scale > 0) || math.IsInf(float64(scale), 0) {
		// Underflow or overflow of the range in T: fall back to a grid on
		// which every value of the row quantizes without NaN.
		return safeParams(x, c, maxq)
	}
	if c.Sym {
		zero = (maxq + 1) / 2
	} else {
		zero = roundEven(-xmin / scale)
	}
	if !c.MSE {
		return scale, zero
	}
	best := T(math.Inf(1))
	steps := int(c.MaxShrink * float64(c.MSEGrid))
	for i := 0; i < steps; i++ {
		p := T(1 - float64(i)/float64(c.MSEGrid))
		xmin1 := T(p * xmin)
		xmax1 := T(p * xmax)
		scale1 := (xmax1 - xmin1) / maxq
		if !(scale1 > 0) {
			continue
		}
		zero1 := zero
		if !c.Sym {
			zero1 = roundEven(-xmin1 / scale1)
		}
		var err T
		for _, v := range x {
			q, _ := intQuant(v, scale1, zero1, maxq)
			d := q - v
			err += T(math.Pow(math.Abs(float64(d)), c.Norm))
		}
		if err < best {
			best, scale, zero = err, scale1, zero1
		}
	}
	return scale, zero
}

// safeParams is the grid used when the reference formula under- or
// overflows in T: it is computed in float64 and clamped into T's range.
func safeParams[T float](x []T, c *IntConfig, maxq T) (T, T) {
	var xmin, xmax float64
	for _, v := range x {
		xmin = min(xmin, float64(v))
		xmax = max(xmax, float64(v))
	}
	if c.Sym {
		xmax = max(-xmin, xmax)
		if xmin < 0 {
			xmin = -xmax
		}
	}
	s := (xmax - xmin) / float64(maxq)
	lim := math.MaxFloat64
	tiny := math.SmallestNonzeroFloat64
	if _, ok := any(maxq).(float32); ok {
		lim, tiny = math.MaxFloat32, 0x1p-126
	}
	s = min(max(s, tiny), lim/float64(maxq+1))
	z := (float64(maxq) + 1) / 2
	if !c.Sym {
		z = min(max(math.RoundToEven(-xmin/s), 0), float64(maxq))
	}
	return T(s), T(z)
}

// intQuant returns the grid value and the integer code of w:
// code = clamp(round(w/s) + z, 0, maxq), value = s·(code − z).
func intQuant[T float](w, s, z, maxq T) (q, code T) {
	code = roundEven(w/s) + z
	code = min(max(code, 0), maxq)
	return s * (code - z), code
}
