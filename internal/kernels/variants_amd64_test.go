//go:build amd64 && !purego

package kernels

import (
	"unsafe"

	"github.com/ttquant/ttquant/internal/cpu"
)

// kernelVariants gives the tests each assembly micro-kernel by name,
// whatever the dispatch chose.
var kernelVariants = struct {
	avx512       bool
	s2, s5       func(kc int, a, b, c []float32, ldc int)
	s64x2, s64x5 func(kc int, a, b []float32, c []float64, ldc int)
	d2, d5       func(kc int, a, b, c []float64, ldc int)
	s12          func(kc int, a, b, c []float32, ldc int)
	s12x64       func(kc int, a, b []float32, c []float64, ldc int)
}{
	avx512: useAsm && cpu.AVX512F,
	s2: func(kc int, a, b, c []float32, ldc int) {
		sgemmKernAVX2(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
	},
	s5: func(kc int, a, b, c []float32, ldc int) {
		sgemmKernAVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
	},
	s64x2: func(kc int, a, b []float32, c []float64, ldc int) {
		sgemmKern64AVX2(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
	},
	s64x5: func(kc int, a, b []float32, c []float64, ldc int) {
		sgemmKern64AVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
	},
	d2: func(kc int, a, b, c []float64, ldc int) {
		dgemmKernAVX2(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
	},
	d5: func(kc int, a, b, c []float64, ldc int) {
		dgemmKernAVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
	},
	s12: func(kc int, a, b, c []float32, ldc int) {
		sgemmKern12AVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
	},
	s12x64: func(kc int, a, b []float32, c []float64, ldc int) {
		sgemmKern12to64AVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc)
	},
}

func microKernels32() []microKernel32 {
	ks := []microKernel32{{"dispatch-6x16-" + implName(), sMR, sNR, sgemmKern}}
	if kernelVariants.avx512 {
		ks = append(ks, microKernel32{"avx2-6x16", sMR, sNR, kernelVariants.s2},
			microKernel32{"avx512-12x32", 2 * sMR, 2 * sNR, kernelVariants.s12})
	}
	return ks
}
