package forward

import "math"

// rmsNormZC writes the zero-centred RMSNorm of each cols-wide row of x
// into dst: x · 1/sqrt(mean(x²) + eps) · (1 + w). The sum of squares is
// accumulated in float64 in index order.
func rmsNormZC(dst, x []float32, cols int, w []float32, eps float64) {
	for r := 0; r*cols < len(x); r++ {
		xr := x[r*cols : (r+1)*cols]
		dr := dst[r*cols : (r+1)*cols]
		inv := rmsInv(xr, eps)
		for i, v := range xr {
			dr[i] = v * inv * (1 + w[i])
		}
	}
}

// rmsInv returns 1/sqrt(mean(x²) + eps) rounded to float32.
func rmsInv(x []float32, eps float64) float32 {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	return float32(1 / math.Sqrt(ss/float64(len(x))+eps))
}

// l2Normalize scales x to unit length: x · 1/sqrt(Σx² + 1e-6), then by
// scale.
func l2Normalize(x []float32, scale float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := float32(1/math.Sqrt(ss+1e-6)) * scale
	for i := range x {
		x[i] *= inv
	}
}

// softplus is log(1+eˣ) with torch's threshold: x itself above 20.
func softplus(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}
