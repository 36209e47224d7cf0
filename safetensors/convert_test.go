package safetensors

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/x448/float16"
)

func TestFP8SpotValues(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	cases := []struct {
		dt   DType
		b    byte
		want float64
	}{
		// OCP E4M3 ("fn"): bias 7, no infinities, S.1111.111 is NaN.
		{F8_E4M3, 0x00, 0}, {F8_E4M3, 0x38, 1}, {F8_E4M3, 0x7e, 448}, {F8_E4M3, 0xfe, -448},
		{F8_E4M3, 0x7f, nan}, {F8_E4M3, 0xff, nan}, {F8_E4M3, 0x78, 256}, {F8_E4M3, 0x01, 0x1p-9},
		{F8_E4M3, 0x07, 7 * 0x1p-9}, {F8_E4M3, 0x08, 0x1p-6}, {F8_E4M3, 0x80, math.Copysign(0, -1)},
		// OCP E5M2: bias 15, IEEE-like specials.
		{F8_E5M2, 0x3c, 1}, {F8_E5M2, 0x7b, 57344}, {F8_E5M2, 0x7c, inf}, {F8_E5M2, 0xfc, -inf},
		{F8_E5M2, 0x7d, nan}, {F8_E5M2, 0x7f, nan}, {F8_E5M2, 0x01, 0x1p-16}, {F8_E5M2, 0x04, 0x1p-14},
		// FNUZ: bias 8 / 16, 0x80 is the only NaN, no infinities.
		{F8_E4M3FNUZ, 0x40, 1}, {F8_E4M3FNUZ, 0x7f, 240}, {F8_E4M3FNUZ, 0x80, nan},
		{F8_E4M3FNUZ, 0xff, -240}, {F8_E4M3FNUZ, 0x01, 0x1p-10},
		{F8_E5M2FNUZ, 0x40, 1}, {F8_E5M2FNUZ, 0x7f, 57344}, {F8_E5M2FNUZ, 0x80, nan},
		{F8_E5M2FNUZ, 0x7c, 32768}, {F8_E5M2FNUZ, 0x01, 0x1p-17},
		// E8M0: 2^(e-127), 0xff NaN.
		{F8_E8M0, 0x7f, 1}, {F8_E8M0, 0x00, 0x1p-127}, {F8_E8M0, 0xfe, 0x1p127}, {F8_E8M0, 0xff, nan},
	}
	for _, c := range cases {
		var got [1]float32
		if err := DecodeFloat32s(got[:], []byte{c.b}, c.dt); err != nil {
			t.Fatal(err)
		}
		g := float64(got[0])
		if math.IsNaN(c.want) {
			if !math.IsNaN(g) {
				t.Errorf("%s 0x%02x = %v, want NaN", c.dt, c.b, g)
			}
			continue
		}
		if g != c.want || math.Signbit(g) != math.Signbit(c.want) {
			t.Errorf("%s 0x%02x = %v, want %v", c.dt, c.b, g, c.want)
		}
	}
}

func TestFP8Exhaustive(t *testing.T) {
	// Every E4M3 code other than NaN is finite with |x| <= 448, every
	// E5M2 code maps to distinct values, and float64 decoding agrees.
	for _, dt := range []DType{F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0} {
		src := make([]byte, 256)
		for i := range src {
			src[i] = byte(i)
		}
		f32 := make([]float32, 256)
		f64 := make([]float64, 256)
		if err := DecodeFloat32s(f32, src, dt); err != nil {
			t.Fatal(err)
		}
		if err := DecodeFloat64s(f64, src, dt); err != nil {
			t.Fatal(err)
		}
		nans := 0
		seen := map[float32]int{}
		for i := range f32 {
			if math.IsNaN(float64(f32[i])) {
				nans++
				continue
			}
			if float64(f32[i]) != f64[i] {
				t.Errorf("%s 0x%02x: float32 %v, float64 %v", dt, i, f32[i], f64[i])
			}
			if f32[i] != 0 {
				if j, dup := seen[f32[i]]; dup {
					t.Errorf("%s: codes 0x%02x and 0x%02x both decode to %v", dt, j, i, f32[i])
				}
				seen[f32[i]] = i
			}
		}
		want := map[DType]int{F8_E4M3: 2, F8_E5M2: 6, F8_E4M3FNUZ: 1, F8_E5M2FNUZ: 1, F8_E8M0: 1}[dt]
		if nans != want {
			t.Errorf("%s: %d NaN codes, want %d", dt, nans, want)
		}
	}
}

func TestF16AgainstFloat16Package(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		got := F16ToFloat32(uint16(h))
		want := float16.Frombits(uint16(h)).Float32()
		if math.IsNaN(float64(want)) {
			// The float16 package quietens signalling NaNs; this package
			// keeps the payload bits. Both must be NaN of the same sign.
			if !math.IsNaN(float64(got)) || math.Signbit(float64(got)) != math.Signbit(float64(want)) {
				t.Fatalf("F16ToFloat32(0x%04x) = %v, want NaN", h, got)
			}
			continue
		}
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("F16ToFloat32(0x%04x) = %v (0x%08x), want %v (0x%08x)", h, got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(f float32) {
		if math.IsNaN(float64(f)) {
			return
		}
		got := Float32ToF16(f)
		want := float16.Fromfloat32(f).Bits()
		if got != want {
			t.Fatalf("Float32ToF16(%v = 0x%08x) = 0x%04x, want 0x%04x", f, math.Float32bits(f), got, want)
		}
	}
	for i := 0; i < 200000; i++ {
		check(math.Float32frombits(rng.Uint32()))
		// Values in and around half's range, including exact ties.
		check(float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(40)-25)))
	}
	for h := 0; h < 1<<16; h++ {
		// Midpoints between adjacent halves exercise round-to-even.
		a := float64(F16ToFloat32(uint16(h)))
		b := float64(F16ToFloat32(uint16(h + 1)))
		if !math.IsInf(a, 0) && !math.IsInf(b, 0) && !math.IsNaN(a) && !math.IsNaN(b) && h&0x7fff != 0x7bff {
			check(float32((a + b) / 2))
		}
	}
}

// nearestBF16 rounds by comparing distances in float64, independently of
// the bit trick used by Float32ToBF16.
func nearestBF16(f float32) uint16 {
	b := math.Float32bits(f)
	lo := uint16(b >> 16)
	hi := lo + 1
	dl := math.Abs(float64(f) - float64(BF16ToFloat32(lo)))
	vh := float64(BF16ToFloat32(hi))
	if math.IsNaN(vh) {
		return lo
	}
	dh := math.Abs(vh - float64(f))
	switch {
	case dl < dh:
		return lo
	case dh < dl:
		return hi
	case lo&1 == 0:
		return lo
	}
	return hi
}

func TestBF16Rounding(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 300000; i++ {
		f := math.Float32frombits(rng.Uint32())
		if math.IsNaN(float64(f)) {
			if g := Float32ToBF16(f); !math.IsNaN(float64(BF16ToFloat32(g))) {
				t.Fatalf("NaN 0x%08x became 0x%04x", math.Float32bits(f), g)
			}
			continue
		}
		if math.IsInf(float64(f), 0) || math.Abs(float64(f)) > 3.38e38 {
			continue
		}
		if got, want := Float32ToBF16(f), nearestBF16(f); got != want {
			t.Fatalf("Float32ToBF16(0x%08x) = 0x%04x, want 0x%04x", math.Float32bits(f), got, want)
		}
	}
	// Ties: 1 + 2^-8 is halfway between 1 and 1+2^-7; it rounds to even (1).
	if g := Float32ToBF16(1 + 0x1p-8); g != 0x3f80 {
		t.Errorf("tie rounds to 0x%04x, want 0x3f80", g)
	}
	if g := Float32ToBF16(1 + 3*0x1p-8); g != 0x3f82 {
		t.Errorf("tie rounds to 0x%04x, want 0x3f82", g)
	}
}

func TestDecodeIntegersAndErrors(t *testing.T) {
	src := make([]byte, 16)
	binary.LittleEndian.PutUint64(src, uint64(math.MaxUint64))
	binary.LittleEndian.PutUint64(src[8:], uint64(1<<53+1))
	u := make([]float64, 2)
	if err := DecodeFloat64s(u, src, U64); err != nil {
		t.Fatal(err)
	}
	if u[0] != 0x1p64 || u[1] != 0x1p53 {
		t.Errorf("U64 decode = %v", u)
	}
	i := make([]float32, 2)
	if err := DecodeFloat32s(i, src, I64); err != nil {
		t.Fatal(err)
	}
	if i[0] != -1 || i[1] != 0x1p53 {
		t.Errorf("I64 decode = %v", i)
	}
	b := make([]float32, 4)
	if err := DecodeFloat32s(b, []byte{0, 1, 2, 255}, BOOL); err != nil || b[0] != 0 || b[1] != 1 || b[3] != 1 {
		t.Errorf("BOOL decode = %v, %v", b, err)
	}
	if err := DecodeFloat32s(b, []byte{0, 0x80, 0, 0}, I16); err == nil {
		t.Error("length mismatch accepted")
	}
	if err := DecodeFloat32s(b[:1], make([]byte, 8), C64); err == nil {
		t.Error("C64 decoded")
	}
	if err := DecodeFloat32s(b[:2], []byte{0x12}, F4); err == nil {
		t.Error("F4 decoded")
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	vals := []float32{0, 1, -2.5, 65504, 1e-7, float32(math.Inf(-1)), 3.14159}
	for _, dt := range []DType{F32, F64, F16, BF16} {
		enc, err := AppendFloat32s(nil, vals, dt)
		if err != nil {
			t.Fatal(err)
		}
		dec := make([]float32, len(vals))
		if err := DecodeFloat32s(dec, enc, dt); err != nil {
			t.Fatal(err)
		}
		for k, v := range vals {
			var want float32
			switch dt {
			case F32, F64:
				want = v
			case F16:
				want = F16ToFloat32(Float32ToF16(v))
			case BF16:
				want = BF16ToFloat32(Float32ToBF16(v))
			}
			if dec[k] != want {
				t.Errorf("%s: %v -> %v, want %v", dt, v, dec[k], want)
			}
		}
	}
	if _, err := AppendFloat32s(nil, vals, F8_E4M3); err == nil {
		t.Error("encoding to F8_E4M3 is not supported and must fail")
	}
}

func TestReadFloat32sChunks(t *testing.T) {
	defer func(c int64) { decodeChunk = c }(decodeChunk)
	decodeChunk = 6 // three BF16 elements per read
	vals := make([]float32, 100)
	for i := range vals {
		vals[i] = float32(i) - 50.5
	}
	bf, _ := AppendFloat32s(nil, vals, BF16)
	path := t.TempDir() + "/c.safetensors"
	if err := WriteFile(path, []Tensor{{"w", BF16, []int64{10, 10}, bf}}, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all, err := f.Float32s("w")
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range all {
		if want := BF16ToFloat32(Float32ToBF16(vals[i])); v != want {
			t.Fatalf("element %d = %v, want %v", i, v, want)
		}
	}
	part := make([]float32, 7)
	if err := f.ReadFloat32s("w", part, 90); err != nil {
		t.Fatal(err)
	}
	for i, v := range part {
		if v != all[90+i] {
			t.Fatalf("ReadFloat32s element %d = %v, want %v", 90+i, v, all[90+i])
		}
	}
	if err := f.ReadFloat32s("w", part, 94); err == nil || !strings.Contains(err.Error(), `"w"`) {
		t.Errorf("range past the end: %v", err)
	}
}
