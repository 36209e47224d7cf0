package emulator

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

// packSlices packs each slice of a [slices, rows, cols] tensor with the
// host packer, transposing first when asked (the stored layout).
func packSlices(t *testing.T, f bfp.Format, tile bfp.Tile, vals []float32, s, rows, cols int, transposed bool) []byte {
	t.Helper()
	var out []byte
	for k := 0; k < s; k++ {
		m := vals[k*rows*cols : (k+1)*rows*cols]
		pr, pc := rows, cols
		if transposed {
			tm := make([]float32, len(m))
			for r := 0; r < rows; r++ {
				for c := 0; c < cols; c++ {
					tm[c*rows+r] = m[r*cols+c]
				}
			}
			m, pr, pc = tm, cols, rows
		}
		p, err := bfp.Pack(f, tile, m, pr, pc)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p...)
	}
	return out
}

func TestCheckDumpFindsFlippedBit(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	const s, rows, cols = 2, 40, 50
	vals := make([]float32, s*rows*cols)
	for i := range vals {
		vals[i] = float32(r.NormFloat64() * 0.05)
	}
	for _, c := range []struct {
		f          bfp.Format
		tile       bfp.Tile
		transposed bool
		bf16       bool
	}{
		{bfp.BFP8, bfp.Tile32x32, false, false},
		{bfp.BFP4, bfp.Tile32x32, true, true},
		{bfp.BFP8, bfp.Tile16x32, true, false},
	} {
		l := Layout{Shape: []int64{s, rows, cols}, Tile: c.tile, Transposed: c.transposed}
		packed := packSlices(t, c.f, c.tile, vals, s, rows, cols, c.transposed)
		want, err := DecodeStored(c.f, l, packed)
		if err != nil {
			t.Fatal(err)
		}
		// The device readback of a correct upload: the host's decode of the
		// same bytes (identical for packer output), in the dump's format.
		host := make([]float32, 0, len(vals))
		for k := 0; k < s; k++ {
			per := len(packed) / s
			pr, pc := rows, cols
			if c.transposed {
				pr, pc = cols, rows
			}
			m, err := bfp.Unpack(c.f, c.tile, packed[k*per:(k+1)*per], pr, pc)
			if err != nil {
				t.Fatal(err)
			}
			if c.transposed {
				for rr := 0; rr < rows; rr++ {
					for cc := 0; cc < cols; cc++ {
						host = append(host, m[cc*rows+rr])
					}
				}
			} else {
				host = append(host, m...)
			}
		}
		d := Dump{Bits: make([]uint32, len(host)), BF16: c.bf16}
		for i, v := range host {
			d.Bits[i] = math.Float32bits(v)
			if c.bf16 {
				d.Bits[i] >>= 16
			}
		}
		res, err := CheckDump("w", l, want, d, 10)
		if err != nil {
			t.Fatal(err)
		}
		if res.Mismatches != 0 || res.Elements != s*rows*cols {
			t.Fatalf("%+v: clean dump: %+v", c, res)
		}
		// Flip one bit of element [1, 37, 45].
		const fs, fr, fc = 1, 37, 45
		i := fs*rows*cols + fr*cols + fc
		bit := uint32(1) << 20
		if c.bf16 {
			bit = 1 << 4
		}
		d.Bits[i] ^= bit
		res, err = CheckDump("w", l, want, d, 10)
		if err != nil {
			t.Fatal(err)
		}
		if res.Mismatches != 1 || len(res.First) != 1 {
			t.Fatalf("%+v: %+v", c, res)
		}
		m := res.First[0]
		pr, pc := fr, fc
		if c.transposed {
			pr, pc = fc, fr
		}
		if m.Tensor != "w" || !slices.Equal(m.Index, []int64{fs, fr, fc}) || m.Slice != fs || m.Row != fr || m.Col != fc ||
			m.TileRow != pr/c.tile.H || m.TileCol != pc/c.tile.W || m.InTileRow != pr%c.tile.H || m.InTileCol != pc%c.tile.W ||
			m.Got^m.Want != bit {
			t.Errorf("%+v: mismatch %+v", c, m)
		}
		if s := m.String(); !strings.Contains(s, `tensor "w" element [1 37 45]`) || !strings.Contains(s, "tile (") {
			t.Errorf("description %q", s)
		}
	}
}

func TestCheckDumpErrors(t *testing.T) {
	l := Layout{Shape: []int64{2, 3}, Tile: bfp.Tile32x32}
	if _, err := CheckDump("x", l, make([]uint16, 6), Dump{Bits: make([]uint32, 5)}, 1); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("short dump: %v", err)
	}
	if _, err := DecodeStored(bfp.BFP8, l, make([]byte, 5)); err == nil {
		t.Error("short packed data accepted")
	}
	// Many mismatches: all counted, only limit recorded.
	want := make([]uint16, 6)
	d := Dump{Bits: []uint32{1, 1, 1, 1, 1, 1}, BF16: true}
	res, err := CheckDump("x", l, want, d, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Mismatches != 6 || len(res.First) != 2 {
		t.Errorf("%+v", res)
	}
}
