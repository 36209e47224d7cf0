package forward

import (
	"math"

	"github.com/ttquant/ttquant/internal/kernels"
)

// matmulT sets dst (rows×out, leading dimension ldd) = x (rows×in) · wᵀ
// with w row-major [out, in]. kernels.Sgemm's result for an element depends
// only on its row of x and column of wᵀ, never on rows or on the number of
// goroutines, so batching sequences together changes no bit.
func matmulT(dst []float32, ldd int, x []float32, rows, in int, w []float32, out int) {
	if rows == 0 || out == 0 {
		return
	}
	kernels.Sgemm(false, true, rows, out, in, 1, x, in, w, in, 0, dst, ldd)
}

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

func silu32(v float32) float32 {
	return float32(float64(v) / (1 + math.Exp(-float64(v))))
}

func sigmoid32(v float32) float32 {
	return float32(1 / (1 + math.Exp(-float64(v))))
}

// softplus is log(1+eˣ) with torch's threshold: x itself above 20.
func softplus(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// swiglu sets dst[i] = silu(g[i])·u[i].
func swiglu(dst, g, u []float32) {
	for i, v := range g {
		dst[i] = silu32(v) * u[i]
	}
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
