//go:build !amd64 || purego

package bfp

func packGroups(f Format, src []float32, stride, n int, exp, mant []byte) {
	packGroupsGo(f, src, stride, n, exp, mant)
}

func unpackGroups(f Format, mant, exp []byte, n int, dst []float32, stride int) {
	unpackGroupsGo(f, mant, exp, n, dst, stride)
}

// Accelerated reports whether Pack and Unpack use SIMD kernels on this
// machine.
func Accelerated() bool { return false }
