//go:build amd64 && !purego && linux

package bfp

import (
	"os"
	"strings"
	"testing"
)

// TestAcceleratedMatchesCPUInfo checks the CPUID/XGETBV detection against
// the kernel's view: Linux lists the avx2 flag in /proc/cpuinfo only when
// the CPU has it and the kernel enabled the YMM state.
func TestAcceleratedMatchesCPUInfo(t *testing.T) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skipf("no /proc/cpuinfo: %v", err)
	}
	want := false
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			for _, f := range strings.Fields(v) {
				if f == "avx2" {
					want = true
				}
			}
			break
		}
	}
	if got := Accelerated(); got != want {
		t.Errorf("Accelerated() = %v, /proc/cpuinfo lists avx2: %v", got, want)
	}
	t.Logf("SIMD kernels in use: %v", Accelerated())
}
