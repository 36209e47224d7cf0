package emulator

// The matrix-level product runs the same arithmetic as MVMULStep on
// operands prepared once: each Src datum becomes a word holding its exponent
// (bits 0..7), sign (bit 8) and both of its multiplier slices for its role
// (bits 9..15: the phase-bit-clear slice, bits 16..22: the other), so that a
// step needs no per-lane slicing. TestPreparedStepMatchesMVMULStep checks the
// two paths against each other.

func prepA(s Src) uint32 {
	return s.Exp() | s.Sign()<<8 | sliceA(s, 0)<<9 | sliceA(s, 1)<<16
}

func prepB(s Src) uint32 {
	return s.Exp() | s.Sign()<<8 | sliceB(s, 0)<<9 | sliceB(s, 2)<<16
}

// preparedStep is MVMULStep on prepared operands (16 lanes each).
func preparedStep(dst uint32, a, b []uint32, phase int, dfmt DstFormat, arch Arch) uint32 {
	var gs [2]uint32
	var ge [2]int32
	var gm [2]uint64
	shA := uint(9 + 7*(phase&1))
	shB := uint(9 + 7*(phase>>1))
	adj := phaseExpAdj(phase)
	for g := 0; g < 2; g++ {
		ag := a[g*8 : g*8+8 : g*8+8]
		bg := b[g*8 : g*8+8 : g*8+8]
		var p [8]uint32
		var e [8]int32
		var neg uint32 // bit i: lane i negative
		G := int32(-1 << 30)
		for i := 0; i < 8; i++ {
			x, y := ag[i], bg[i]
			ea, eb := int32(x&0xff), int32(y&0xff)
			if ea == 0 || eb == 0 {
				e[i] = 0
			} else {
				p[i] = (x >> shA & 0x7f) * (y >> shB & 0x7f)
				e[i] = ea + eb + adj
				neg |= ((x ^ y) >> 8 & 1) << i
			}
			G = max(G, e[i])
		}
		if G <= 0 {
			continue
		}
		var T int64
		for i := 0; i < 8; i++ {
			t := uint64(p[i])
			if d := min(G-e[i], 30); d > 0 {
				t = (t + 1<<(d-1)) >> d
			}
			if neg>>i&1 != 0 {
				T -= int64(t)
			} else {
				T += int64(t)
			}
		}
		ge[g] = G
		if T < 0 {
			gs[g], gm[g] = 1, uint64(-T)<<13
		} else {
			gm[g] = uint64(T) << 13
		}
	}
	return combine(dst, gs, ge, gm, dfmt, arch)
}
