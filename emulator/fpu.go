package emulator

import (
	"fmt"
	"math/bits"
	"strings"
)

// Fidelity is a math-fidelity setting of the Matrix Unit: how many of the
// four mantissa-slice phases each multiply-accumulate runs.
type Fidelity int

// Math fidelities, with the phases each runs (in order):
// LoFi {0}, HiFi2 {0,1}, HiFi3 {0,1,2}, HiFi4 {0,1,2,3}.
const (
	LoFi Fidelity = iota
	HiFi2
	HiFi3
	HiFi4
)

// Phases returns the number of fidelity phases run: phases 0..n-1 in order.
func (f Fidelity) Phases() int {
	switch f {
	case LoFi:
		return 1
	case HiFi2:
		return 2
	case HiFi3:
		return 3
	case HiFi4:
		return 4
	}
	panic(fmt.Sprintf("emulator: invalid fidelity %d", int(f)))
}

// String returns "LoFi", "HiFi2", "HiFi3" or "HiFi4".
func (f Fidelity) String() string {
	switch f {
	case LoFi:
		return "LoFi"
	case HiFi2:
		return "HiFi2"
	case HiFi3:
		return "HiFi3"
	case HiFi4:
		return "HiFi4"
	}
	return fmt.Sprintf("Fidelity(%d)", int(f))
}

// ParseFidelity parses a fidelity name, case-insensitively ("lofi",
// "hifi2", "hifi3", "hifi4").
func ParseFidelity(s string) (Fidelity, error) {
	switch strings.ToLower(s) {
	case "lofi":
		return LoFi, nil
	case "hifi2":
		return HiFi2, nil
	case "hifi3":
		return HiFi3, nil
	case "hifi4":
		return HiFi4, nil
	}
	return 0, fmt.Errorf("emulator: unknown math fidelity %q (want lofi, hifi2, hifi3 or hifi4)", s)
}

// DstFormat is the format of the destination register (Dst) the Matrix Unit
// accumulates into.
type DstFormat int

// Destination formats: FP32 (fp32_dest_acc_en) and 16-bit BF16 (FP16_B).
const (
	DstFP32 DstFormat = iota
	DstBF16
)

// String returns "fp32" or "bf16".
func (d DstFormat) String() string {
	switch d {
	case DstFP32:
		return "fp32"
	case DstBF16:
		return "bf16"
	}
	return fmt.Sprintf("DstFormat(%d)", int(d))
}

// ParseDstFormat parses "fp32" or "bf16" (case-insensitive).
func ParseDstFormat(s string) (DstFormat, error) {
	switch strings.ToLower(s) {
	case "fp32":
		return DstFP32, nil
	case "bf16":
		return DstBF16, nil
	}
	return 0, fmt.Errorf("emulator: unknown destination format %q (want fp32 or bf16)", s)
}

// Arch selects the device generation whose numerics are modelled.
type Arch int

// Architectures. Blackhole (P150) is the default; Wormhole differs in the
// Matrix Unit only by its leading-sign-count quirk on an exact "−1 unit" sum.
const (
	Blackhole Arch = iota
	Wormhole
)

// String returns "blackhole" or "wormhole".
func (a Arch) String() string {
	switch a {
	case Blackhole:
		return "blackhole"
	case Wormhole:
		return "wormhole"
	}
	return fmt.Sprintf("Arch(%d)", int(a))
}

// ParseArch parses "blackhole" or "wormhole" (case-insensitive).
func ParseArch(s string) (Arch, error) {
	switch strings.ToLower(s) {
	case "blackhole", "bh":
		return Blackhole, nil
	case "wormhole", "wh":
		return Wormhole, nil
	}
	return 0, fmt.Errorf("emulator: unknown architecture %q (want blackhole or wormhole)", s)
}

// Lanes is the number of products one Matrix Unit step sums per output
// element (one 16-deep block of the inner dimension).
const Lanes = 16

// MVMULStep computes one Matrix Unit multiply-accumulate step for a single
// output element: dst + Σ a[i]·b[i] over 16 lanes, where a is the SrcA column
// (weights) and b the SrcB row (activations) of the current 16-block, with
// the operands sliced for the given fidelity phase (0..3).
//
// dst and the result are IEEE float32 bit patterns; with DstBF16 they are BF16
// patterns shifted left by 16 (the low 16 bits of dst are ignored and those of
// the result are zero). The arithmetic follows the device exactly: truncated
// mantissa slices, two groups of 8 lanes each aligned (round half up in
// magnitude) to its largest product, groups aligned to the largest exponent
// with ties toward +∞ and Dst with ties away from zero, an exact sum, one
// normalising rounding (ties away), flush of results with exponent ≤ 0 to +0
// and an Inf pattern (no NaN) on overflow.
func MVMULStep(dst uint32, a, b *[Lanes]Src, phase int, dfmt DstFormat, arch Arch) uint32 {
	if phase < 0 || phase > 3 {
		panic(fmt.Sprintf("emulator: invalid fidelity phase %d", phase))
	}
	var gs [2]uint32 // group sign (1 = negative)
	var ge [2]int32  // group exponent
	var gm [2]uint64 // group magnitude, 1.0 at bit 23
	for g := 0; g < 2; g++ {
		gs[g], ge[g], gm[g] = laneGroup(a[g*8:g*8+8], b[g*8:g*8+8], phase)
	}
	return combine(dst, gs, ge, gm, dfmt, arch)
}

// sliceA returns the SrcA multiplier slice for the phase (5 bits).
func sliceA(s Src, phase int) uint32 {
	if phase&1 == 0 {
		return (1024 + s.Man()) >> 6
	}
	return (s.Man() >> 1) & 31
}

// sliceB returns the SrcB multiplier slice for the phase (7 bits).
func sliceB(s Src, phase int) uint32 {
	if phase&2 == 0 {
		return (1024 + s.Man()) >> 4
	}
	return (s.Man() & 15) << 3
}

// phaseExpAdj is what a lane product's exponent adds to the sum of its
// operands' exponent fields: minus the bias, and minus the weight of the
// low slices (5 bits of SrcA in odd phases, 7 of SrcB in phases 2 and 3).
func phaseExpAdj(phase int) int32 {
	adj := int32(-127)
	if phase&1 != 0 {
		adj -= 5
	}
	if phase&2 != 0 {
		adj -= 7
	}
	return adj
}

// laneGroup multiplies and sums one group of 8 lanes, returning the sign,
// exponent and magnitude (1.0 at bit 23) of the group sum.
func laneGroup(a, b []Src, phase int) (sign uint32, exp int32, mag uint64) {
	adj := phaseExpAdj(phase)
	var p [8]uint32
	var e [8]int32
	var s [8]uint32
	G := int32(0)
	first := true
	for i := 0; i < 8; i++ {
		ea, eb := a[i].Exp(), b[i].Exp()
		if ea == 0 || eb == 0 {
			p[i], e[i], s[i] = 0, max(adj, 0), 0
		} else {
			p[i] = sliceA(a[i], phase) * sliceB(b[i], phase)
			e[i] = int32(ea) + int32(eb) + adj
			s[i] = a[i].Sign() ^ b[i].Sign()
		}
		if first || e[i] > G {
			G = e[i]
			first = false
		}
	}
	if G <= 0 {
		return 0, 0, 0
	}
	var T int64
	for i := 0; i < 8; i++ {
		d := min(G-e[i], 30)
		t := uint64(p[i])
		if d > 0 {
			t = (t + 1<<(d-1)) >> d
		}
		if s[i] != 0 {
			T -= int64(t)
		} else {
			T += int64(t)
		}
	}
	if T < 0 {
		return 1, G, uint64(-T) << 13
	}
	return 0, G, uint64(T) << 13
}

// combine aligns the two group sums and the Dst operand to the largest
// exponent, adds them and normalises the result into Dst's format.
func combine(dst uint32, gs [2]uint32, ge [2]int32, gm [2]uint64, dfmt DstFormat, arch Arch) uint32 {
	if dfmt == DstBF16 {
		dst &= 0xffff0000
	}
	ds := dst >> 31
	ed := int32(dst>>23) & 0xff
	var md uint64
	if ed != 0 {
		md = uint64(dst&0x7fffff) | 1<<23
	}
	E := max(ge[0], ge[1], ed)
	if E <= 0 {
		return 0
	}
	for g := 0; g < 2; g++ {
		if d := E - ge[g]; d > 0 {
			if d >= 31 {
				gm[g] = 0
			} else {
				gm[g] = (gm[g] + 1<<(d-1) - uint64(gs[g])) >> d
			}
		}
	}
	if d := E - ed; d > 0 {
		if d >= 31 {
			md = 0
		} else {
			md = (md + 1<<(d-1)) >> d
		}
	}
	if dfmt == DstBF16 {
		for g := 0; g < 2; g++ {
			gm[g] = (gm[g] + 1<<12 - uint64(gs[g])) >> 13 << 13
		}
		md = (md + 1<<12) >> 13 << 13
	}
	R := signed(md, ds) + signed(gm[0], gs[0]) + signed(gm[1], gs[1])
	if R == 0 {
		return 0
	}
	sign := uint32(0)
	if R < 0 {
		sign = 1
		R = -R
	}
	r := uint64(R)
	sh := int32(bits.LeadingZeros32(uint32(r))) - 8
	if arch == Wormhole && sign == 1 && r == 1 {
		sh -= 27
	}
	E -= sh
	keep := int32(24) // significant bits kept
	if dfmt == DstBF16 {
		keep = 8
	}
	// Shift so that the MSB lands on bit keep-1, rounding half up in
	// magnitude when bits fall off, then scale back to bit 23.
	down := 24 - keep - sh // right shift amount from the raw sum
	if down > 0 {
		if down >= 63 {
			r = 0
		} else {
			r = (r + 1<<(down-1)) >> down
		}
		if r>>keep != 0 {
			r >>= 1
			E++
		}
		r <<= 24 - keep
	} else {
		r <<= -down
	}
	if E <= 0 {
		return 0
	}
	if E >= 255 {
		return sign<<31 | 0x7f800000
	}
	return sign<<31 | uint32(E)<<23 | uint32(r)&0x7fffff
}

func signed(m uint64, s uint32) int64 {
	if s != 0 {
		return -int64(m)
	}
	return int64(m)
}
