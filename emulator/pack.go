package emulator

import "fmt"

// PackFP32ToBF16 is the packer's early conversion of an FP32 Dst value (IEEE
// bit pattern) to a BF16 intermediate or output: NaN becomes ±Inf, then the
// value is rounded to nearest with ties away from zero (add 0x8000, keep the
// top 16 bits); a result with exponent field 0 (denormal or zero of either
// sign) becomes +0. The flush happens after rounding, and rounding overflow
// gives the Inf pattern.
func PackFP32ToBF16(x uint32) uint16 {
	x = nanToInf(x)
	return flush16(uint16((x + 0x8000) >> 16))
}

// PackFP32ToE8M6 is the packer's early conversion of an FP32 Dst value to
// the BFP8 intermediate (tt-metal's default for BFP8_b and BFP4_b output),
// returned in BF16 layout: truncate to BF16, turn NaN into ±Inf, then round
// away the last mantissa bit (add 1 and clear bit 0: ties away from zero,
// looking at that bit only); a result with exponent field 0 becomes +0.
func PackFP32ToE8M6(x uint32) uint16 {
	return PackBF16ToE8M6(uint16(x >> 16))
}

// PackBF16ToE8M6 is the early conversion of a BF16 Dst value to the BFP8
// intermediate: NaN becomes ±Inf, the last mantissa bit is rounded away
// (ties away from zero) and exponent-0 results become +0.
func PackBF16ToE8M6(h uint16) uint16 {
	if isNaN16(h) {
		h = h&0x8000 | 0x7f80
	}
	h = (h + 1) &^ 1
	return flush16(h)
}

// PackBF16 is the early conversion of a BF16 Dst value to a BF16
// intermediate or output: identity, except that NaN becomes ±Inf and
// denormals (and −0) become +0.
func PackBF16(h uint16) uint16 {
	if isNaN16(h) {
		h = h&0x8000 | 0x7f80
	}
	return flush16(h)
}

// TruncFP32ToBF16 is the first step of the late BFP conversion from an FP32
// intermediate (the "precise" BFP8_b path): truncate to BF16 and set
// denormals to +0.
func TruncFP32ToBF16(x uint32) uint16 {
	return flush16(uint16(x >> 16))
}

func nanToInf(x uint32) uint32 {
	if x&0x7f800000 == 0x7f800000 && x&0x7fffff != 0 {
		return x&0x80000000 | 0x7f800000
	}
	return x
}

func isNaN16(h uint16) bool { return h&0x7f80 == 0x7f80 && h&0x7f != 0 }

func flush16(h uint16) uint16 {
	if h&0x7f80 == 0 {
		return 0
	}
	return h
}

// BlockFormat is a device block-float output format of the packer.
type BlockFormat int

// Block formats written by the packer's late conversion.
const (
	BFP8b BlockFormat = iota // 1 sign + 7 magnitude bits per datum
	BFP4b                    // 1 sign + 3 magnitude bits per datum
)

// String returns "BFP8_b" or "BFP4_b".
func (f BlockFormat) String() string {
	switch f {
	case BFP8b:
		return "BFP8_b"
	case BFP4b:
		return "BFP4_b"
	}
	return fmt.Sprintf("BlockFormat(%d)", int(f))
}

// PackBFPBlock is the packer's late conversion of one block (one face row of
// 16 values, given as BF16-layout intermediates) to a shared exponent and 16
// datums of format f. The shared exponent is the largest exponent field of
// the block (255 counts). Each value's 8-bit significand is shifted to the
// shared exponent and rounded to a 7-bit magnitude, half up in magnitude
// (ties away from zero); 128 saturates to 127; values 8 or more binades
// below become 0. BFP4_b drops the 4 low magnitude bits (truncation). The
// sign is kept only when the magnitude is non-zero. Datums are returned in
// the low bits of each byte (BFP4_b: bit 3 sign, bits 2..0 magnitude).
//
// The intermediates must already have been through an early conversion
// (PackFP32ToE8M6, PackBF16ToE8M6 or TruncFP32ToBF16), which flushes
// denormals; an exponent-0 input is read as zero here.
func PackBFPBlock(f BlockFormat, in *[16]uint16) (exp uint8, datums [16]uint8) {
	var emax uint16
	for _, h := range in {
		emax = max(emax, (h>>7)&0xff)
	}
	for i, h := range in {
		e := (h >> 7) & 0xff
		if e == 0 {
			continue
		}
		sig := uint32(h&0x7f) | 0x80
		d := uint32(emax - e)
		if d >= 8 {
			continue
		}
		mag := (sig + 1<<d) >> (d + 1)
		if mag > 127 {
			mag = 127
		}
		sign := uint8(h >> 15)
		switch f {
		case BFP8b:
			if mag != 0 {
				datums[i] = sign<<7 | uint8(mag)
			}
		case BFP4b:
			if m4 := mag >> 4; m4 != 0 {
				datums[i] = sign<<3 | uint8(m4)
			}
		default:
			panic(fmt.Sprintf("emulator: invalid block format %d", int(f)))
		}
	}
	return uint8(emax), datums
}

// PackDstBF16 converts Dst values (FP32 bit patterns, or BF16<<16 with
// DstBF16) to a BF16 output, element by element (PackFP32ToBF16 or
// PackBF16).
func PackDstBF16(dst []uint32, dfmt DstFormat) []uint16 {
	out := make([]uint16, len(dst))
	for i, x := range dst {
		if dfmt == DstBF16 {
			out[i] = PackBF16(uint16(x >> 16))
		} else {
			out[i] = PackFP32ToBF16(x)
		}
	}
	return out
}

// PackDstBFP converts a rows×cols row-major matrix of Dst values to a block
// format, with one block per 16 consecutive values of a row (cols must be a
// multiple of 16; in a tile each block is one face row). It returns one
// shared exponent per block, exps[r*(cols/16)+c/16], and one datum per
// value, datums[r*cols+c], in the low bits of each byte.
//
// The default path (precise false) is tt-metal's: the packer's intermediate
// format is BFP8, so every value is first cut to E8M6 (PackFP32ToE8M6 or
// PackBF16ToE8M6) and then rounded again to the shared exponent. With precise
// true (tt-metal's bfp8_pack_precise, BFP8_b only) the intermediate is FP32
// (FP32 Dst: truncated to BF16) or BF16 (BF16 Dst: PackBF16), so there is a
// single rounding at the shared exponent.
func PackDstBFP(dst []uint32, rows, cols int, dfmt DstFormat, f BlockFormat, precise bool) (exps, datums []uint8, err error) {
	if rows < 0 || cols <= 0 || cols%16 != 0 || len(dst) != rows*cols {
		return nil, nil, fmt.Errorf("emulator: cannot pack %d values as a %d×%d matrix in 16-wide blocks", len(dst), rows, cols)
	}
	if f != BFP8b && f != BFP4b {
		return nil, nil, fmt.Errorf("emulator: invalid block format %d", int(f))
	}
	if precise && f != BFP8b {
		return nil, nil, fmt.Errorf("emulator: the precise packer path exists only for BFP8_b, not %v", f)
	}
	exps = make([]uint8, rows*cols/16)
	datums = make([]uint8, rows*cols)
	var blk [16]uint16
	for b := range exps {
		for i := 0; i < 16; i++ {
			x := dst[b*16+i]
			switch {
			case dfmt == DstBF16 && precise:
				blk[i] = PackBF16(uint16(x >> 16))
			case dfmt == DstBF16:
				blk[i] = PackBF16ToE8M6(uint16(x >> 16))
			case precise:
				blk[i] = TruncFP32ToBF16(x)
			default:
				blk[i] = PackFP32ToE8M6(x)
			}
		}
		e, d := PackBFPBlock(f, &blk)
		exps[b] = e
		copy(datums[b*16:], d[:])
	}
	return exps, datums, nil
}
