package bfp

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// floatsFrom reinterprets data as little-endian float32 bit patterns.
func floatsFrom(data []byte) []float32 {
	v := make([]float32, len(data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return v
}

func bytesOf(bits ...uint32) []byte {
	b := make([]byte, 4*len(bits))
	for i, x := range bits {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

// pick maps a selector byte to a format and a tile.
func pick(sel uint8) (Format, Tile) {
	return Formats()[int(sel)%3], Tiles()[int(sel)/3%len(Tiles())]
}

func addSeeds(f *testing.F) {
	specials := bytesOf(0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC00123, 0x7F7FFFFF,
		0x00000001, 0x80000000, 0x3F800000, 0x42818000, 0x42810000, 0x40FFFF97, 0x3D900003,
		0x3F000001, 0x3F000002, 0xBF000000, 0x00800000, 0x80800000, 0x7F000000, 0x3FC00000)
	f.Add(specials, uint8(0), uint8(5))
	f.Add(specials, uint8(1), uint8(7))
	f.Add(specials, uint8(2), uint8(20))
	f.Add(bytes.Repeat(specials, 30), uint8(3), uint8(33))
	f.Add(bytes.Repeat(specials, 60), uint8(35), uint8(17))
	f.Add(bytes.Repeat(bytesOf(0x3C23D70A, 0xBC23D70A, 0x3A83126F, 0x00400000), 300), uint8(4), uint8(40))
	f.Add(bytesOf(0x42810000), uint8(0), uint8(0))
}

// shapeOf chooses rows x cols for n values.
func shapeOf(n int, c uint8) (rows, cols int) {
	cols = 1 + int(c)%n
	return n / cols, cols
}

// FuzzPackRoundTrip: for any float32 input, Pack(Unpack(Pack(x))) ==
// Pack(x), the decoded values are a fixed point, and the SIMD and pure-Go
// kernels agree.
func FuzzPackRoundTrip(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte, sel, c uint8) {
		src := floatsFrom(data)
		if len(src) == 0 {
			return
		}
		fm, tl := pick(sel)
		rows, cols := shapeOf(len(src), c)
		src = src[:rows*cols]
		p1, err := Pack(fm, tl, src, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		u1, err := Unpack(fm, tl, p1, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		p2, err := Pack(fm, tl, u1, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		if d := firstDiff(p1, p2); d >= 0 {
			t.Fatalf("%v %v %dx%d: Pack(Unpack(Pack(x))) differs at byte %d", fm, tl, rows, cols, d)
		}
		u2, _ := Unpack(fm, tl, p2, rows, cols)
		for i := range u1 {
			if math.Float32bits(u1[i]) != math.Float32bits(u2[i]) {
				t.Fatalf("decoded values are not a fixed point at %d", i)
			}
		}
		// Element-level consistency: every value equals Nearest against
		// its group's shared exponent.
		for i, x := range src {
			r, cc := i/cols, i%cols
			g := src[r*cols+cc/16*16 : r*cols+min(cc/16*16+16, cols)]
			e := SharedExponent(g)
			if n := fm.Nearest(x, e); math.Float32bits(n) != math.Float32bits(u1[i]) {
				t.Fatalf("element %d: Nearest %#08x, Pack/Unpack %#08x", i, math.Float32bits(n), math.Float32bits(u1[i]))
			}
		}
		kernelsAgree(t, fm, src)
	})
}

// FuzzUnpack: Unpack never panics on arbitrary bytes of the right length,
// every value is what Decode gives for its code and exponent, and the SIMD
// and pure-Go kernels agree.
func FuzzUnpack(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte, sel, c uint8) {
		fm, tl := pick(sel)
		rows, cols := 1+int(c)%37, 1+int(c)/7%41
		n, err := PackedSize(fm, tl, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		src := make([]byte, max(n, 3*TileBytes(fm, Tile32x32)))
		if len(data) > 0 {
			for i := range src {
				src[i] = data[i%len(data)] + uint8(i/len(data))
			}
		}
		unpackKernelsAgree(t, fm, src)
		src = src[:n]
		out, err := Unpack(fm, tl, src, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		verr := Validate(fm, tl, src, rows, cols)
		if back := packsBack(fm, tl, src, rows, cols); back != (verr == nil) {
			t.Fatalf("Validate = %v but Pack(Unpack(b)) == b is %v", verr, back)
		}
		tb, eb := TileBytes(fm, tl), tl.ExponentBytes()
		_, tc := TileGrid(tl, rows, cols)
		w := fm.Bits()
		for i, v := range out {
			r, cc := i/cols, i%cols
			tile := src[((r/tl.H)*tc+cc/tl.W)*tb:][:tb]
			tr, tcol := r%tl.H, cc%tl.W
			fh := tl.FaceH()
			g := ((tr/fh)*(tl.W/16)+tcol/16)*fh + tr%fh
			k := g*16 + tcol%16
			code := tile[eb+k*w/8] >> (k * w % 8) & (1<<w - 1)
			if want := fm.Decode(code, tile[g]); math.Float32bits(want) != math.Float32bits(v) {
				t.Fatalf("element (%d,%d): %#08x, Decode gives %#08x", r, cc, math.Float32bits(v), math.Float32bits(want))
			}
		}
	})
}

// FuzzRepresentable: groups built from codes (so every value is exactly
// representable with its group's exponent) survive Pack then Unpack bit for
// bit, and Pack reproduces the codes.
func FuzzRepresentable(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte, sel, c uint8) {
		fm, _ := pick(sel)
		if len(data) < 17 {
			return
		}
		w := uint(fm.MantissaBits())
		ng := len(data) / 17
		vals := make([]float32, 16*ng)
		for g := range ng {
			d := data[17*g:]
			e := d[0] | 1 // exponent 0 holds only zeros
			top := int(d[1]) % 16
			for k := range 16 {
				code := d[1+k] & (1<<(w+1) - 1)
				if k == top {
					code |= 1 << (w - 1) // this element sets the exponent
				}
				if code&(1<<w-1) == 0 {
					code = 0 // a sign-only code is never produced
				}
				v := fm.Decode(code, e)
				if b := math.Float32bits(v); b>>23&0xff == 0 {
					v = 0 // subnormal patterns are not representable inputs
				}
				vals[16*g+k] = v
			}
		}
		p, err := Pack(fm, Tile1x16, vals, ng, 16)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Unpack(fm, Tile1x16, p, ng, 16)
		if err != nil {
			t.Fatal(err)
		}
		for i := range vals {
			if math.Float32bits(back[i]) != math.Float32bits(vals[i]) {
				t.Fatalf("%v: representable %#08x came back as %#08x", fm, math.Float32bits(vals[i]), math.Float32bits(back[i]))
			}
		}
		kernelsAgree(t, fm, vals)
	})
}

// kernelsAgree packs src as a 1-row-per-group matrix of 16-value rows
// (zero-padded) with the dispatched kernels and with the pure-Go kernels
// over several tile shapes, and requires identical bytes.
func kernelsAgree(t *testing.T, fm Format, src []float32) {
	t.Helper()
	for _, tl := range []Tile{Tile32x32, Tile16x16, Tile1x32} {
		cols := 3 * tl.W
		rows := (len(src) + cols - 1) / cols
		buf := make([]float32, rows*cols)
		copy(buf, src)
		if !sameKernels(fm, tl, buf, rows, cols) {
			t.Fatalf("%v %v: SIMD and pure-Go pack kernels differ", fm, tl)
		}
	}
}

// sameKernels compares Pack with a pack through the pure-Go kernel.
func sameKernels(fm Format, tl Tile, src []float32, rows, cols int) bool {
	p1, err := Pack(fm, tl, src, rows, cols)
	if err != nil {
		panic(err)
	}
	p2 := make([]byte, len(p1))
	tr, _ := TileGrid(tl, rows, cols)
	packRange(packRowGo, p2, fm, tl, src, rows, cols, 0, tr)
	return bytes.Equal(p1, p2)
}

// unpackKernelsAgree decodes raw bytes as a packed 32x32-tile matrix with
// both kernels.
func unpackKernelsAgree(t *testing.T, fm Format, raw []byte) {
	t.Helper()
	tb := TileBytes(fm, Tile32x32)
	n := len(raw) / tb
	if n == 0 {
		return
	}
	d1, err := Unpack(fm, Tile32x32, raw[:n*tb], 32, 32*n)
	if err != nil {
		t.Fatal(err)
	}
	d2 := make([]float32, len(d1))
	unpackRange(unpackRowGo, d2, fm, Tile32x32, raw[:n*tb], 32, 32*n, 0, 1)
	for i := range d1 {
		if math.Float32bits(d1[i]) != math.Float32bits(d2[i]) {
			t.Fatalf("%v: SIMD and pure-Go unpack kernels differ at %d: %#08x vs %#08x", fm, i, math.Float32bits(d1[i]), math.Float32bits(d2[i]))
		}
	}
}

// TestKernelsAgreeRandom compares the dispatched (SIMD where available) and
// pure-Go kernels on random matrices rich in special values, for every
// format and tile shape and for shapes that need padding.
func TestKernelsAgreeRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	specials := []uint32{0, 0x80000000, 1, 0x807FFFFF, 0x00800000, 0x7F800000, 0xFF800000, 0x7FC00000,
		0x7F800001, 0xFFFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0x42818000, 0x3D900003}
	for _, fm := range Formats() {
		for _, tl := range Tiles() {
			for _, shape := range [][2]int{{tl.H, tl.W}, {2*tl.H + 1, 3*tl.W - 5}} {
				rows, cols := shape[0], shape[1]
				src := make([]float32, rows*cols)
				for i := range src {
					var b uint32
					switch rng.IntN(6) {
					case 0:
						b = specials[rng.IntN(len(specials))]
					case 1:
						b = rng.Uint32() // any pattern, wide exponents
					default: // a narrow exponent band, as in weights
						b = rng.Uint32()&0x807FFFFF | uint32(118+rng.IntN(8))<<23
					}
					src[i] = math.Float32frombits(b)
				}
				if !sameKernels(fm, tl, src, rows, cols) {
					t.Fatalf("%v %v %dx%d: pack kernels differ", fm, tl, rows, cols)
				}
				raw := make([]byte, 3*TileBytes(fm, Tile32x32))
				for i := range raw {
					raw[i] = uint8(rng.Uint32())
				}
				unpackKernelsAgree(t, fm, raw)
			}
		}
	}
}

// TestLargeUnpackPaths covers the output sizes from which the SIMD unpack
// writes around the cache, with the destination aligned and misaligned,
// against the pure-Go kernel.
func TestLargeUnpackPaths(t *testing.T) {
	rows, cols := 2048, 1024 // 8 MiB of float32: at the streaming threshold
	if rows*cols < streamBytes/4 {
		t.Fatal("matrix below the streaming threshold")
	}
	rng := rand.New(rand.NewPCG(31, 32))
	src := make([]float32, rows*cols)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 0.02)
		if i%997 == 0 {
			src[i] = math.Float32frombits(rng.Uint32())
		}
	}
	for _, fm := range Formats() {
		p, err := Pack(fm, Tile32x32, src, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, rows*cols)
		unpackRange(unpackRowGo, want, fm, Tile32x32, p, rows, cols, 0, rows/32)
		buf := make([]float32, rows*cols+1)
		for _, off := range []int{0, 1} {
			got := buf[off : off+rows*cols]
			if err := UnpackInto(got, fm, Tile32x32, p, rows, cols); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%v offset %d: element %d %#08x, pure Go %#08x", fm, off, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
				}
			}
		}
	}
}
