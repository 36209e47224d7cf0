//go:build amd64 && !purego

package cpu

func init() {
	AVX2, FMA = detect()
	AVX512F = FMA && detectAVX512F()
}

//go:noescape
func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

//go:noescape
func xgetbv() (eax, edx uint32)

// detect reports whether the processor and the operating system support
// AVX2 and FMA3 with the YMM state enabled.
func detect() (avx2, fma bool) {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return false, false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const (
		fma3    = 1 << 12
		osxsave = 1 << 27
		avx     = 1 << 28
	)
	if ecx1&osxsave == 0 || ecx1&avx == 0 {
		return false, false
	}
	// XCR0 bits 1 (SSE state) and 2 (AVX state) must both be enabled by
	// the operating system.
	if xcr0, _ := xgetbv(); xcr0&6 != 6 {
		return false, false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	const avx2Bit = 1 << 5
	avx2 = ebx7&avx2Bit != 0
	return avx2, avx2 && ecx1&fma3 != 0
}

// detectAVX512F reports whether the processor has AVX-512F and the operating
// system saves the opmask and the full ZMM state (XCR0 bits 5, 6 and 7, with
// the SSE and AVX bits). The kernels need nothing beyond AVX-512F.
func detectAVX512F() bool {
	if xcr0, _ := xgetbv(); xcr0&0xe6 != 0xe6 {
		return false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	const avx512f = 1 << 16
	return ebx7&avx512f != 0
}
