//go:build !amd64 || purego

package bfp

import "testing"

// TestAcceleratedOff checks that builds without the assembly kernels (other
// architectures, the purego tag) report the pure-Go path.
func TestAcceleratedOff(t *testing.T) {
	if Accelerated() {
		t.Error("Accelerated() = true in a build without SIMD kernels")
	}
}
