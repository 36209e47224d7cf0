//go:build amd64 && !purego

package gptq

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
func xgetbv() (eax, edx uint32)

//go:noescape
func axpySubAVX(a float32, x, y []float32)

// hasAVX reports whether the CPU and the operating system support the
// 256-bit AVX instructions of axpySubAVX.
var hasAVX = func() bool {
	if max, _, _, _ := cpuid(0, 0); max < 1 {
		return false
	}
	_, _, ecx, _ := cpuid(1, 0)
	const osxsave, avx = 1 << 27, 1 << 28
	if ecx&osxsave == 0 || ecx&avx == 0 {
		return false
	}
	xcr0, _ := xgetbv()
	return xcr0&6 == 6 // XMM and YMM state enabled
}()

// axpySub32 computes y -= a·x elementwise with every product rounded to
// float32 before the subtraction, exactly like axpySub (an elementwise
// multiply then subtract gives the same bits at any vector width).
func axpySub32(a float32, x, y []float32) {
	y = y[:len(x)]
	n := 0
	if hasAVX {
		n = len(x) &^ 15
		if n > 0 {
			axpySubAVX(a, x[:n], y[:n])
		}
	}
	for i := n; i < len(x); i++ {
		y[i] -= float32(a * x[i])
	}
}

const simdName = "avx"

func simdActive() bool { return hasAVX }
