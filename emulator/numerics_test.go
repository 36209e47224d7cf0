package emulator

import (
	"math"
	"testing"
)

func TestParseNames(t *testing.T) {
	for s, want := range map[string]Fidelity{"lofi": LoFi, "HiFi2": HiFi2, "HIFI3": HiFi3, "hifi4": HiFi4} {
		got, err := ParseFidelity(s)
		if err != nil || got != want {
			t.Errorf("ParseFidelity(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseFidelity("hifi1"); err == nil {
		t.Error("hifi1 accepted")
	}
	if p := []int{LoFi.Phases(), HiFi2.Phases(), HiFi3.Phases(), HiFi4.Phases()}; p[0] != 1 || p[1] != 2 || p[2] != 3 || p[3] != 4 {
		t.Errorf("phases %v", p)
	}
	if d, err := ParseDstFormat("BF16"); err != nil || d != DstBF16 {
		t.Errorf("ParseDstFormat: %v %v", d, err)
	}
	if _, err := ParseDstFormat("fp16"); err == nil {
		t.Error("fp16 Dst accepted")
	}
	if a, err := ParseArch("wormhole"); err != nil || a != Wormhole {
		t.Errorf("ParseArch: %v %v", a, err)
	}
	if _, err := ParseArch("grayskull"); err == nil {
		t.Error("grayskull accepted")
	}
	if err := (Config{Fidelity: HiFi3, Dst: DstBF16, Arch: Wormhole}).Validate(); err != nil {
		t.Error(err)
	}
	if err := (Config{Dst: 5}).Validate(); err == nil {
		t.Error("invalid Dst format accepted")
	}
	if s := (Config{Fidelity: HiFi2}).String(); s != "HiFi2/fp32/blackhole" {
		t.Errorf("Config.String() = %q", s)
	}
}

func TestSrcConversions(t *testing.T) {
	// 1.0 in BF16 is 0x3f80: sign 0, exponent 127, mantissa 0.
	s := SrcFromBF16(0x3f80)
	if s.Sign() != 0 || s.Exp() != 127 || s.Man() != 0 || s.Float64() != 1 {
		t.Errorf("1.0: %05x", uint32(s))
	}
	// FP32 1 + 2^-10 + 2^-11: TF32 keeps the 2^-10 bit, BF16 drops both.
	x := math.Float32bits(1 + 1.0/1024 + 1.0/2048)
	if v := SrcFromFP32TF32(x).Float64(); v != 1+1.0/1024 {
		t.Errorf("TF32 truncation gives %v", v)
	}
	if v := SrcFromFP32BF16(x).Float64(); v != 1 {
		t.Errorf("BF16 truncation gives %v", v)
	}
	// A denormal reads as zero; through the BF16 path it is flushed.
	if SrcFromFP32BF16(0x00400000).Exp() != 0 || SrcFromFP32TF32(0x00400000).Float64() != 0 {
		t.Error("denormal not zero")
	}
	// Exponent 255 is a finite number.
	if v := SrcFromBF16(0xff80).Float64(); v != -math.Ldexp(1, 128) {
		t.Errorf("0xff80 reads as %v, want -2^128", v)
	}
}

// TestMVMULStepExamples checks worked examples from the notes.
func TestMVMULStepExamples(t *testing.T) {
	one := SrcFromBF16(0x3f80)
	var a, b [Lanes]Src
	a[0], b[0] = one, one
	// −(1+2^−23) + 1·1 is −2^−23 on Blackhole and −16 on Wormhole.
	if got := MVMULStep(0xbf800001, &a, &b, 0, DstFP32, Blackhole); got != 0xb4000000 {
		t.Errorf("Blackhole: %08x, want b4000000", got)
	}
	if got := MVMULStep(0xbf800001, &a, &b, 0, DstFP32, Wormhole); got != 0xc1800000 {
		t.Errorf("Wormhole: %08x, want c1800000", got)
	}
	// 2^24 plus seven products 1·1 in the same 8-lane group: the small
	// products vanish on the large one's grid, even with FP32 Dst.
	big := SrcFromBF16(0x4b80) // 2^24
	a, b = [Lanes]Src{}, [Lanes]Src{}
	a[0], b[0] = big, one
	for i := 1; i < 8; i++ {
		a[i], b[i] = one, one
	}
	if got := MVMULStep(0, &a, &b, 0, DstFP32, Blackhole); got != 0x4b800000 {
		t.Errorf("2^24 + 7: %08x, want 4b800000", got)
	}
	// In separate groups a small product survives (the group sums are
	// aligned on Dst's 24-bit grid): 2^20 + 1·1 is exact.
	a, b = [Lanes]Src{}, [Lanes]Src{}
	a[0], b[0] = SrcFromBF16(0x4980), one // 2^20
	a[8], b[8] = one, one
	if got := math.Float32frombits(MVMULStep(0, &a, &b, 0, DstFP32, Blackhole)); got != 1<<20+1 {
		t.Errorf("2^20 + 1 across groups: %v", got)
	}
	// In the same group it is lost.
	a[8], b[8] = 0, 0
	a[1], b[1] = one, one
	if got := math.Float32frombits(MVMULStep(0, &a, &b, 0, DstFP32, Blackhole)); got != 1<<20 {
		t.Errorf("2^20 + 1 in one group: %v", got)
	}
	// Exact cancellation gives +0.
	a, b = [Lanes]Src{}, [Lanes]Src{}
	a[0], b[0] = one, one
	if got := MVMULStep(0xbf800000, &a, &b, 0, DstFP32, Blackhole); got != 0 {
		t.Errorf("-1 + 1 = %08x, want +0", got)
	}
	// LoFi drops the low mantissa bits: 1.5 (BF16 0x3fc0) × (1+2^-7) at
	// phase 0 uses SrcA's top 4 mantissa bits and SrcB's top 6, so the 2^-7
	// bit of SrcB is lost; phase 2 supplies it.
	a, b = [Lanes]Src{}, [Lanes]Src{}
	a[0], b[0] = SrcFromBF16(0x3fc0), SrcFromBF16(0x3f81)
	d0 := MVMULStep(0, &a, &b, 0, DstFP32, Blackhole)
	if got := math.Float32frombits(d0); got != 1.5 {
		t.Errorf("phase 0: %v, want 1.5", got)
	}
	if got := math.Float32frombits(MVMULStep(d0, &a, &b, 2, DstFP32, Blackhole)); got != 1.5*(1+1.0/128) {
		t.Errorf("phases 0+2: %v, want %v", got, 1.5*(1+1.0/128))
	}
}

func TestPackExamples(t *testing.T) {
	// Ties go away from zero on the device: 1+2^-8 → 1+2^-7.
	if got := PackFP32ToBF16(math.Float32bits(1 + 1.0/256)); got != 0x3f81 {
		t.Errorf("1+2^-8 → %04x, want 3f81", got)
	}
	if got := PackFP32ToBF16(math.Float32bits(-(1 + 1.0/256))); got != 0xbf81 {
		t.Errorf("-(1+2^-8) → %04x, want bf81", got)
	}
	if got := PackFP32ToBF16(0x7fc00000); got != 0x7f80 {
		t.Errorf("NaN → %04x, want 7f80", got)
	}
	if got := PackFP32ToBF16(0x80000000); got != 0 {
		t.Errorf("-0 → %04x, want 0", got)
	}
	// One block: 1.0 and 2^-8·1.5 → the small value is below the 7-bit
	// grid of the shared exponent and becomes 0; 0.75 → magnitude 48.
	var blk [16]uint16
	blk[0], blk[1], blk[2] = 0x3f80, 0x3bc0, 0xbf40
	e, d := PackBFPBlock(BFP8b, &blk)
	if e != 127 || d[0] != 0x40 || d[1] != 0 || d[2] != 0x80|48 {
		t.Errorf("BFP8 block: exp %d, datums %x", e, d[:3])
	}
	e, d = PackBFPBlock(BFP4b, &blk)
	if e != 127 || d[0] != 0x4 || d[2] != 0x8|3 {
		t.Errorf("BFP4 block: exp %d, datums %x", e, d[:3])
	}
	if _, _, err := PackDstBFP(make([]uint32, 20), 1, 20, DstFP32, BFP8b, false); err == nil {
		t.Error("row of 20 accepted")
	}
	if _, _, err := PackDstBFP(make([]uint32, 16), 1, 16, DstFP32, BFP4b, true); err == nil {
		t.Error("precise BFP4 accepted")
	}
}

// TestUnpackBFP8Exhaustive checks every (datum, shared exponent) pair
// against the value model mag/64·2^(E−127): exact whenever the result's
// exponent does not wrap, the documented wrap (E − leading zeros mod 256)
// otherwise, and the sign-only and zero codes.
func TestUnpackBFP8Exhaustive(t *testing.T) {
	for e := 0; e < 256; e++ {
		for d := 0; d < 256; d++ {
			h := UnpackBFP8(uint8(d), uint8(e))
			mag := d & 0x7f
			neg := d&0x80 != 0
			switch {
			case mag == 0 && neg:
				if h != 0xff80 {
					t.Fatalf("datum %02x exp %d: %04x, want ff80", d, e, h)
				}
				continue
			case mag == 0:
				if h != 0 {
					t.Fatalf("datum %02x exp %d: %04x, want 0", d, e, h)
				}
				continue
			}
			lz := 0
			for m := mag; m&0x40 == 0; m <<= 1 {
				lz++
			}
			if gotExp := int(h>>7) & 0xff; gotExp != (e-lz+256)%256 {
				t.Fatalf("datum %02x exp %d: exponent field %d, want %d", d, e, gotExp, (e-lz+256)%256)
			}
			if e-lz >= 1 {
				want := math.Ldexp(float64(mag)/64, e-127)
				if neg {
					want = -want
				}
				if got := SrcFromBF16(h).Float64(); got != want { // as the FPU reads it (exponent 255 is finite)
					t.Fatalf("datum %02x exp %d: %04x = %g, want %g", d, e, h, got, want)
				}
			}
			if nib := d >> 4; d&0x0f == 0 && UnpackBFP4(uint8(nib), uint8(e)) != h {
				t.Fatalf("nibble %x exp %d differs from datum %02x", nib, e, d)
			}
		}
	}
}
