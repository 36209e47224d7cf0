package calib

import "github.com/ttquant/ttquant/internal/kernels"

// matmulT sets dst (rows×out) = x (rows×in) · wᵀ, with w row-major
// [out, in]. It uses kernels.Sgemm, whose float32 result depends only on
// the inputs (not on the number of goroutines it uses).
func matmulT(dst, x []float32, rows, in int, w []float32, out int) {
	if rows == 0 || out == 0 {
		return
	}
	kernels.Sgemm(false, true, rows, out, in, 1, x, in, w, in, 0, dst, out)
}
