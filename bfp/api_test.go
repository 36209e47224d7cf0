package bfp

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func TestFormatNames(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Format
	}{
		{"BFP8_b", BFP8}, {"bfp8_b", BFP8}, {"BFP8_B", BFP8}, {"bfloat8_b", BFP8}, {"bfp8", BFP8},
		{"BFP4_b", BFP4}, {"bfloat4_b", BFP4}, {" bfp4 ", BFP4},
		{"BFP2_b", BFP2}, {"bfloat2_b", BFP2},
	} {
		got, err := ParseFormat(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseFormat(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "bf16", "bfp8_a", "BFP16_b", "bfp3"} {
		_, err := ParseFormat(bad)
		var fe *FormatError
		if !errors.Is(err, ErrUnknownFormat) || !errors.As(err, &fe) || fe.Value != bad {
			t.Errorf("ParseFormat(%q) error = %v", bad, err)
		}
	}
	want := map[Format][3]int{BFP8: {8, 7, 127}, BFP4: {4, 3, 7}, BFP2: {2, 1, 1}}
	for f, w := range want {
		if f.Bits() != w[0] || f.MantissaBits() != w[1] || int(f.MaxMagnitude()) != w[2] {
			t.Errorf("%v: bits %d mantissa %d max %d", f, f.Bits(), f.MantissaBits(), f.MaxMagnitude())
		}
		txt, err := f.MarshalText()
		var back Format
		if err != nil || back.UnmarshalText(txt) != nil || back != f {
			t.Errorf("%v: text round trip %q %v -> %v", f, txt, err, back)
		}
	}
	if BFP8.String() != "BFP8_b" || BFP4.String() != "BFP4_b" || BFP2.String() != "BFP2_b" {
		t.Error("String names")
	}
	var zero Format
	if err := zero.Valid(); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("zero Format is valid: %v", err)
	}
}

// TestTileSizes checks tile geometry against the size table of the format
// description (tt-metal's tile.cpp; 32x32 sizes also in its constants).
func TestTileSizes(t *testing.T) {
	type row struct {
		t           Tile
		groups, exp int
		sizes       [3]int // BFP8, BFP4, BFP2
		faceH       int
	}
	rows := []row{
		{Tile32x32, 64, 64, [3]int{1088, 576, 320}, 16},
		{Tile16x32, 32, 32, [3]int{544, 288, 160}, 16},
		{Tile32x16, 32, 32, [3]int{544, 288, 160}, 16},
		{Tile16x16, 16, 16, [3]int{272, 144, 80}, 16},
		{Tile8x32, 16, 16, [3]int{272, 144, 80}, 8},
		{Tile4x32, 8, 16, [3]int{144, 80, 48}, 4},
		{Tile8x16, 8, 16, [3]int{144, 80, 48}, 8},
		{Tile2x32, 4, 16, [3]int{80, 48, 32}, 2},
		{Tile4x16, 4, 16, [3]int{80, 48, 32}, 4},
		{Tile1x32, 2, 16, [3]int{48, 32, 24}, 1},
		{Tile2x16, 2, 16, [3]int{48, 32, 24}, 2},
		{Tile1x16, 1, 16, [3]int{32, 24, 20}, 1},
	}
	if len(rows) != len(Tiles()) {
		t.Fatalf("Tiles() has %d shapes, table %d", len(Tiles()), len(rows))
	}
	for _, r := range rows {
		if err := r.t.Valid(); err != nil {
			t.Errorf("%v: %v", r.t, err)
			continue
		}
		if r.t.Groups() != r.groups || r.t.ExponentBytes() != r.exp || r.t.FaceH() != r.faceH {
			t.Errorf("%v: groups %d exp %d faceH %d", r.t, r.t.Groups(), r.t.ExponentBytes(), r.t.FaceH())
		}
		for i, f := range Formats() {
			if got := TileBytes(f, r.t); got != r.sizes[i] {
				t.Errorf("TileBytes(%v, %v) = %d, want %d", f, r.t, got, r.sizes[i])
			}
		}
		p, err := ParseTile(r.t.String())
		if err != nil || p != r.t {
			t.Errorf("ParseTile(%q) = %v, %v", r.t.String(), p, err)
		}
	}
	for _, bad := range []Tile{{}, {32, 8}, {64, 32}, {3, 32}, {16, 64}, {-32, 32}, {32, 0}} {
		var te *TileError
		if err := bad.Valid(); !errors.Is(err, ErrInvalidTile) || !errors.As(err, &te) || te.Tile != bad {
			t.Errorf("%v.Valid() = %v", bad, err)
		}
	}
	for _, s := range []string{"32", "x32", "32x", "axb", "64x64", ""} {
		if _, err := ParseTile(s); !errors.Is(err, ErrInvalidTile) {
			t.Errorf("ParseTile(%q) error = %v", s, err)
		}
	}
	// Group order in a 32x32 tile: face 0 rows, face 1 rows, face 2, face 3.
	for g, want := range map[int][2]int{0: {0, 0}, 15: {15, 0}, 16: {0, 16}, 31: {15, 16}, 32: {16, 0}, 63: {31, 16}} {
		r, c := Tile32x32.GroupLocation(g)
		if r != want[0] || c != want[1] {
			t.Errorf("32x32 group %d at (%d,%d), want %v", g, r, c, want)
		}
	}
	if r, c := Tile8x32.GroupLocation(9); r != 1 || c != 16 {
		t.Errorf("8x32 group 9 at (%d,%d), want (1,16)", r, c)
	}
}

func TestErrors(t *testing.T) {
	src := make([]float32, 6)
	if _, err := Pack(0, Tile32x32, src, 2, 3); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("bad format: %v", err)
	}
	if _, err := Pack(BFP8, Tile{32, 8}, src, 2, 3); !errors.Is(err, ErrInvalidTile) {
		t.Errorf("bad tile: %v", err)
	}
	for _, rc := range [][2]int{{0, 3}, {2, 0}, {-1, 3}, {2, -6}} {
		_, err := Pack(BFP8, Tile32x32, src, rc[0], rc[1])
		var se *ShapeError
		if !errors.Is(err, ErrShape) || !errors.As(err, &se) || se.Rows != rc[0] || se.Cols != rc[1] {
			t.Errorf("shape %v: %v", rc, err)
		}
		if _, err := Unpack(BFP8, Tile32x32, nil, rc[0], rc[1]); !errors.Is(err, ErrShape) {
			t.Errorf("Unpack shape %v: %v", rc, err)
		}
		if _, err := PackedSize(BFP8, Tile32x32, rc[0], rc[1]); !errors.Is(err, ErrShape) {
			t.Errorf("PackedSize shape %v: %v", rc, err)
		}
	}
	if _, err := Pack(BFP8, Tile32x32, src, 2, 4); !errors.Is(err, ErrShape) {
		t.Errorf("short source: %v", err)
	}
	if _, err := PackedSize(BFP8, Tile32x32, math.MaxInt/2, math.MaxInt/2); !errors.Is(err, ErrShape) {
		t.Errorf("overflow: %v", err)
	}
	if err := PackInto(make([]byte, 1087), BFP8, Tile32x32, src, 2, 3); !errors.Is(err, ErrBufferSize) {
		t.Errorf("short dst: %v", err)
	}
	_, err := Unpack(BFP4, Tile32x32, make([]byte, 577), 2, 3)
	var be *BufferError
	if !errors.Is(err, ErrBufferSize) || !errors.As(err, &be) || be.Got != 577 || be.Want != 576 || be.Op != "Unpack" {
		t.Errorf("long packed source: %v", err)
	}
	if err := UnpackInto(make([]float32, 5), BFP4, Tile32x32, make([]byte, 576), 2, 3); !errors.Is(err, ErrBufferSize) {
		t.Errorf("short unpack destination: %v", err)
	}
	// The messages name the shape and sizes.
	if err == nil || err.Error() != "bfp: Unpack BFP4_b 2x3 (tile 32x32): packed source has length 577, want 576" {
		t.Errorf("message: %v", err)
	}
}

// refEncode is an independent formulation of the element rule in terms of
// values: the magnitude is measured in units of 2^(e-127-23) (the
// alignment), the fractional part of that is discarded, and the integer is
// rounded half to even to a multiple of 2^(24-W), then saturated.
func refEncode(f Format, x float32, e uint8) uint8 {
	w := f.MantissaBits()
	b := math.Float32bits(x)
	if b>>23&0xff == 0 {
		return 0
	}
	if int(b>>23&0xff) > int(e) {
		panic("refEncode: element above the shared exponent")
	}
	ax := math.Abs(float64(x))
	if math.IsInf(ax, 0) || math.IsNaN(ax) {
		// Exponent field 255 behaves like a finite number with that field.
		ax = math.Ldexp(1+float64(b&0x7fffff)/(1<<23), 128)
	}
	a := math.Floor(math.Ldexp(ax, 23-(int(e)-127))) // aligned integer, truncated
	unit := math.Ldexp(1, 24-w)
	q := math.Floor(a / unit)
	r := a - q*unit
	if r > unit/2 || (r == unit/2 && math.Mod(q, 2) == 1) {
		q++
	}
	q = math.Min(q, float64(int(1)<<w-1))
	if q == 0 {
		return 0
	}
	code := uint8(q)
	if b>>31 == 1 {
		code |= 1 << w
	}
	return code
}

func TestEncodeAgainstValueModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, f := range Formats() {
		for range 200000 {
			var b uint32
			switch rng.IntN(4) {
			case 0:
				b = rng.Uint32()
			case 1: // near rounding boundaries: few low mantissa bits
				b = rng.Uint32()&0xFFFF0000 | uint32(rng.IntN(3))<<rng.UintN(24)
			case 2:
				b = rng.Uint32() & 0xFF800000
			default:
				b = rng.Uint32()&0xFFFE0000 | 0x10000
			}
			ex := int(b >> 23 & 0xff)
			e := uint8(min(255, ex+rng.IntN(40)))
			if rng.IntN(8) == 0 {
				e = uint8(ex)
			}
			x := math.Float32frombits(b)
			if got, want := f.Encode(x, e), refEncode(f, x, e); got != want {
				t.Fatalf("%v Encode(%#08x, %d) = %#x, value model %#x", f, b, e, got, want)
			}
		}
	}
}

func TestKnownAnswers(t *testing.T) {
	// tt-metal's own unit-test expectations and the worked examples of the
	// format description, BFP8_b unless noted.
	one := func(f Format, x float32) float32 {
		out, err := Quantize(f, Tile32x32, []float32{x}, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	for _, c := range []struct {
		f       Format
		in, out float32
	}{
		{BFP8, 64.75, 65}, {BFP8, 64.5, 64}, {BFP8, 65.5, 66}, {BFP8, -64.75, -65}, {BFP8, 65.25, 65},
		{BFP8, 7.9999, 7.9375}, {BFP8, 1, 1}, {BFP2, 1.5, 1}, {BFP4, 15.9, 14}, {BFP4, 9.5, 10}, {BFP4, 9, 8},
	} {
		if got := one(c.f, c.in); got != c.out {
			t.Errorf("%v: %v -> %v, want %v", c.f, c.in, got, c.out)
		}
	}
	// 7.9999 next to 64.75: code 0x08 -> 8.
	if got := BFP8.Encode(7.9999, 133); got != 0x08 {
		t.Errorf("7.9999 at E=133: %#x", got)
	}
	if got := BFP8.Encode(math.Float32frombits(0x3D900003), 127); got != 4 {
		t.Errorf("discarded-bits tie: %#x", got)
	}
	for in, want := range map[uint32]uint8{0x3F000000: 0, 0x3F000002: 1, 0x3F000001: 0, 0x3FC00000: 1} {
		if got := BFP2.Encode(math.Float32frombits(in), 127); got != want {
			t.Errorf("BFP2 %#08x at E=127: %#x want %#x", in, got, want)
		}
	}
	inf := float32(math.Inf(1))
	out, _ := Quantize(BFP8, Tile32x32, []float32{inf, math.MaxFloat32}, 1, 2)
	if !math.IsInf(float64(out[0]), 1) || !math.IsInf(float64(out[1]), 1) {
		t.Errorf("Inf row: %v", out)
	}
	// Encode saturates elements above the shared exponent.
	if got := BFP4.Encode(-100, 127); got != 0xF {
		t.Errorf("saturating Encode: %#x", got)
	}
	if got := BFP4.Nearest(100, 127); got != 1.75 {
		t.Errorf("saturating Nearest: %v", got)
	}
}

func TestSharedExponentAndQuantizeGroup(t *testing.T) {
	if SharedExponent(nil) != 0 || SharedExponent([]float32{0, float32(math.Copysign(0, -1)), 1e-40}) != 0 {
		t.Error("zeros and subnormals must give 0")
	}
	if SharedExponent([]float32{1, -3, 0.5}) != 128 {
		t.Error("max exponent of {1,-3,0.5}")
	}
	if SharedExponent([]float32{1, float32(math.NaN())}) != 255 {
		t.Error("NaN gives 255")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, f := range Formats() {
		for range 1000 {
			g := make([]float32, 16)
			for i := range g {
				g[i] = float32(rng.NormFloat64() * math.Exp(rng.NormFloat64()*3))
			}
			want, err := Quantize(f, Tile1x16, g, 1, 16)
			if err != nil {
				t.Fatal(err)
			}
			e := SharedExponent(g)
			for i, v := range g {
				if n := f.Nearest(v, e); math.Float32bits(n) != math.Float32bits(want[i]) {
					t.Fatalf("%v Nearest(%v, %d) = %v, Pack/Unpack gives %v", f, v, e, n, want[i])
				}
			}
			if got := f.QuantizeGroup(g); got != e {
				t.Fatalf("QuantizeGroup exponent %d, want %d", got, e)
			}
			for i := range g {
				if math.Float32bits(g[i]) != math.Float32bits(want[i]) {
					t.Fatalf("QuantizeGroup element %d = %v, want %v", i, g[i], want[i])
				}
			}
		}
	}
}

// TestLayout checks tile order and padding on a matrix whose values encode
// their own position, independently of the conformance data.
func TestLayout(t *testing.T) {
	for _, tl := range Tiles() {
		rows, cols := 2*tl.H+3, 3*tl.W+5
		src := make([]float32, rows*cols)
		for i := range src {
			// Distinct small integers, exactly representable in BFP8 when
			// alone in a group at exponent 2^6: use value 64+(i%63) so all
			// elements of a group share exponent 133.
			src[i] = float32(64 + i%63)
		}
		p, err := Pack(BFP8, tl, src, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		tr, tc := TileGrid(tl, rows, cols)
		tb := TileBytes(BFP8, tl)
		eb := tl.ExponentBytes()
		for ti := range tr * tc {
			tile := p[ti*tb:][:tb]
			for g := range tl.Groups() {
				gr, gc := tl.GroupLocation(g)
				r := (ti/tc)*tl.H + gr
				for k := range 16 {
					c := (ti%tc)*tl.W + gc + k
					code := tile[eb+g*16+k]
					want := uint8(0)
					if r < rows && c < cols {
						want = uint8(64 + (r*cols+c)%63)
					}
					if code != want {
						t.Fatalf("%v tile %d group %d element %d: code %#x want %#x", tl, ti, g, k, code, want)
					}
				}
				e := tile[g]
				if r < rows && gc+(ti%tc)*tl.W < cols && e != 133 {
					t.Fatalf("%v tile %d group %d exponent %d", tl, ti, g, e)
				}
			}
			for _, b := range tile[tl.Groups():eb] {
				if b != 0 {
					t.Fatalf("%v: exponent padding not zero", tl)
				}
			}
		}
		back, err := Unpack(BFP8, tl, p, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		for i := range src {
			if back[i] != src[i] {
				t.Fatalf("%v: element %d %v -> %v", tl, i, src[i], back[i])
			}
		}
	}
}

func TestTileText(t *testing.T) {
	for _, tl := range Tiles() {
		b, err := tl.MarshalText()
		var back Tile
		if err != nil || back.UnmarshalText(b) != nil || back != tl {
			t.Errorf("%v: text round trip %q %v -> %v", tl, b, err, back)
		}
	}
	if p, err := ParseTile(" 16X32 "); err != nil || p != Tile16x32 {
		t.Errorf("ParseTile(\" 16X32 \") = %v, %v", p, err)
	}
	if _, err := (Tile{3, 3}).MarshalText(); !errors.Is(err, ErrInvalidTile) {
		t.Errorf("invalid tile marshals: %v", err)
	}
	var back Tile
	if err := back.UnmarshalText([]byte("64x64")); !errors.Is(err, ErrInvalidTile) {
		t.Errorf("64x64 unmarshals: %v", err)
	}
	var f Format
	if err := f.UnmarshalText([]byte("bf16")); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("bf16 unmarshals: %v", err)
	}
}
