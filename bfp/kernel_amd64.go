//go:build amd64 && !purego

package bfp

import (
	"unsafe"

	"github.com/ttquant/ttquant/internal/cpu"
)

// hasAVX2 is set when the CPU and the operating system support AVX2.
var hasAVX2 = cpu.AVX2

// The assembly row kernels. pack*: nt tiles of fc groups from src; the
// exponent of group c of tile t goes to exp+t*tb+c*se, its codes to
// mant+t*tb+c*sm. unpack*: the inverse, returning the number of groups it
// skipped because their exponent needs the exact slow rule (E < W or
// E = 255); the caller redoes those.

//go:noescape
func packRow8AVX2(src *float32, nt, fc int, exp, mant *byte, tb, se, sm int)

//go:noescape
func packRow4AVX2(src *float32, nt, fc int, exp, mant *byte, tb, se, sm int)

//go:noescape
func packRow2AVX2(src *float32, nt, fc int, exp, mant *byte, tb, se, sm int)

//go:noescape
func unpackRow8AVX2(exp, mant *byte, nt, fc, tb, se, sm int, dst *float32, stream bool) int

//go:noescape
func unpackRow4AVX2(exp, mant *byte, nt, fc, tb, se, sm int, dst *float32, stream bool) int

//go:noescape
func unpackRow2AVX2(exp, mant *byte, nt, fc, tb, se, sm int, dst *float32, stream bool) int

var (
	packRow   packRowFunc   = packRowGo
	unpackRow unpackRowFunc = unpackRowGo
)

func init() {
	if hasAVX2 {
		packRow, unpackRow = packRowAVX2, unpackRowAVX2
	}
}

// Accelerated reports whether Pack and Unpack use SIMD kernels on this
// machine.
func Accelerated() bool { return hasAVX2 }

// packRowAVX2 checks the slice bounds the assembly relies on, then calls it.
func packRowAVX2(f Format, src []float32, nt, fc int, exp, mant []byte, tb, se, sm int) {
	if nt == 0 {
		return
	}
	gb := 2 * f.Bits()
	if len(src) < 16*nt*fc || len(exp) <= (nt-1)*tb+(fc-1)*se || len(mant) < (nt-1)*tb+(fc-1)*sm+gb {
		panic("bfp: row kernel bounds")
	}
	s, e, m := unsafe.SliceData(src), unsafe.SliceData(exp), unsafe.SliceData(mant)
	switch f {
	case BFP8:
		packRow8AVX2(s, nt, fc, e, m, tb, se, sm)
	case BFP4:
		packRow4AVX2(s, nt, fc, e, m, tb, se, sm)
	case BFP2:
		packRow2AVX2(s, nt, fc, e, m, tb, se, sm)
	default:
		panic("bfp: invalid format " + f.String())
	}
}

func unpackRowAVX2(f Format, exp, mant []byte, nt, fc, tb, se, sm int, dst []float32, stream bool) {
	if nt == 0 {
		return
	}
	gb := 2 * f.Bits()
	if len(dst) < 16*nt*fc || len(exp) <= (nt-1)*tb+(fc-1)*se || len(mant) < (nt-1)*tb+(fc-1)*sm+gb {
		panic("bfp: row kernel bounds")
	}
	e, m, d := unsafe.SliceData(exp), unsafe.SliceData(mant), unsafe.SliceData(dst)
	stream = stream && uintptr(unsafe.Pointer(d))%32 == 0 // non-temporal stores need alignment
	var skipped int
	switch f {
	case BFP8:
		skipped = unpackRow8AVX2(e, m, nt, fc, tb, se, sm, d, stream)
	case BFP4:
		skipped = unpackRow4AVX2(e, m, nt, fc, tb, se, sm, d, stream)
	case BFP2:
		skipped = unpackRow2AVX2(e, m, nt, fc, tb, se, sm, d, stream)
	default:
		panic("bfp: invalid format " + f.String())
	}
	if skipped > 0 {
		// Rare: exponents below W or 255. Redo those groups exactly.
		w := uint8(f.MantissaBits())
		for t := range nt {
			for c := range fc {
				o := t * tb
				if x := exp[o+c*se]; x < w || x == 255 {
					unpackGroupSlow(f, mant[o+c*sm:], uint32(x), (*[16]float32)(dst[16*(t*fc+c):]))
				}
			}
		}
	}
}
