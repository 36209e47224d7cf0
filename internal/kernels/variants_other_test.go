//go:build !amd64 || purego

package kernels

// kernelVariants: no assembly micro-kernels in this build.
var kernelVariants = struct {
	avx512       bool
	s2, s5       func(kc int, a, b, c []float32, ldc int)
	s64x2, s64x5 func(kc int, a, b []float32, c []float64, ldc int)
	d2, d5       func(kc int, a, b, c []float64, ldc int)
	s12          func(kc int, a, b, c []float32, ldc int)
	s12x64       func(kc int, a, b []float32, c []float64, ldc int)
}{}

func microKernels32() []microKernel32 {
	return []microKernel32{{"dispatch-6x16-" + implName(), sMR, sNR, sgemmKern}}
}
