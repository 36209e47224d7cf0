//go:build amd64 && !purego

package emulator

import "github.com/ttquant/ttquant/internal/kernels"

//go:generate go run gen_device_amd64.go

//go:noescape
func devKernAVX2(ktiles int, a *int16, b *int32, phases int, scratch *int32, dst *[8]uint32)

// deviceAsm selects the AVX2 kernel for the FP32-Dst Blackhole case. It is
// set when the processor has AVX2 (the kernels package's AVX2 code is in
// use); tests switch it off to compare the two paths.
var deviceAsm = kernels.Impl() != "go"

func devKern(ktiles int, a []int16, b []int32, phases int, scratch []int32, dst *[8]uint32) {
	_ = a[ktiles*TileDim*panelStride-1]
	_ = b[ktiles*TileDim*rowStride-1]
	_ = scratch[scratchLen-1]
	devKernAVX2(ktiles, &a[0], &b[0], phases, &scratch[0], dst)
}
