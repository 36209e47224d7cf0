package ffn

import (
	"math"

	"github.com/ttquant/ttquant/internal/kernels"
)

// MatMulT sets dst (rows×out, leading dimension ldd) = x (rows×in) · wᵀ
// with w row-major [out, in], through kernels.Sgemm. An element's result
// depends only on its row of x and column of wᵀ, never on rows or on the
// number of goroutines, so batching rows together changes no bit.
func MatMulT(dst []float32, ldd int, x []float32, rows, in int, w []float32, out int) {
	if rows == 0 || out == 0 {
		return
	}
	kernels.Sgemm(false, true, rows, out, in, 1, x, in, w, in, 0, dst, ldd)
}

// Silu is v·sigmoid(v), computed in float64 and rounded to float32.
func Silu(v float32) float32 {
	return float32(float64(v) / (1 + math.Exp(-float64(v))))
}

// Sigmoid is 1/(1+e⁻ᵛ), computed in float64 and rounded to float32.
func Sigmoid(v float32) float32 {
	return float32(1 / (1 + math.Exp(-float64(v))))
}

// SwiGLU sets dst[i] = Silu(g[i])·u[i]; dst may alias g.
func SwiGLU(dst, g, u []float32) {
	for i, v := range g {
		dst[i] = Silu(v) * u[i]
	}
}

// Grow returns b resliced to n values, or a new slice when b is too small.
// The values are not cleared.
func Grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// GatherRows copies rows idx of the cols-wide matrix x into dst (grown as
// needed) and returns it.
func GatherRows(dst, x []float32, cols int, idx []int32) []float32 {
	dst = Grow(dst, len(idx)*cols)
	for i, t := range idx {
		copy(dst[i*cols:(i+1)*cols], x[int(t)*cols:(int(t)+1)*cols])
	}
	return dst
}

// ScatterAdd adds w[i]·y[i] to row idx[i] of the cols-wide matrix out.
func ScatterAdd(out, y []float32, cols int, idx []int32, w []float32) {
	for i, t := range idx {
		o := out[int(t)*cols : (int(t)+1)*cols]
		wi := w[i]
		for j, v := range y[i*cols : (i+1)*cols] {
			o[j] += wi * v
		}
	}
}
