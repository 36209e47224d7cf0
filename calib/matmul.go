package calib

// matmulT sets dst (rows×out) = x (rows×in) · wᵀ, with w row-major
// [out, in]. Each output is a float32 dot product accumulated in eight
// interleaved partial sums combined in a fixed order, so the result depends
// only on the inputs.
func matmulT(dst, x []float32, rows, in int, w []float32, out int) {
	for r := 0; r < rows; r++ {
		xr := x[r*in : (r+1)*in]
		d := dst[r*out : (r+1)*out]
		for o := range d {
			d[o] = dot32(xr, w[o*in:(o+1)*in])
		}
	}
}

func dot32(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3, s4, s5, s6, s7 float32
	i := 0
	for ; i+8 <= len(a); i += 8 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
		s4 += a[i+4] * b[i+4]
		s5 += a[i+5] * b[i+5]
		s6 += a[i+6] * b[i+6]
		s7 += a[i+7] * b[i+7]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
}
