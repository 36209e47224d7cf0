// Package cpu reports the processor features the assembly kernels of bfp
// and internal/kernels need. It is a leaf: the leaves may import it. With
// the purego build tag, or on other architectures, every feature is
// reported absent, so the portable code paths run.
package cpu

// Features of this machine, set once at start-up.
var (
	// AVX2 is set when the processor and the operating system support
	// AVX2 (YMM state enabled).
	AVX2 bool
	// FMA is set when AVX2 is and the processor has FMA3.
	FMA bool
	// AVX512F is set when FMA is, the processor has AVX-512F, and the
	// operating system saves the opmask and ZMM state (XCR0 bits 5 to 7).
	AVX512F bool
)
