//go:build !amd64 || purego

package bfp

var (
	packRow   packRowFunc   = packRowGo
	unpackRow unpackRowFunc = unpackRowGo
)

// Accelerated reports whether Pack and Unpack use SIMD kernels on this
// machine.
func Accelerated() bool { return false }
