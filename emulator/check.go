package emulator

import (
	"fmt"

	"github.com/ttquant/ttquant/bfp"
)

// Layout describes how a stored tensor is laid out in tiles: its logical
// shape (leading dims fold into slices; the last two dims are the matrix of
// each slice; a 1-D tensor is one row), the tile shape, and whether the
// packed matrix of each slice is the transpose of the logical one. For a
// tensor that is not stored in tiles (BF16) the zero Tile stands for the
// 32×32 tiles the device would use, for reporting positions.
type Layout struct {
	Shape      []int64
	Tile       bfp.Tile
	Transposed bool
}

// dims returns the number of slices and the logical rows and columns.
func (l Layout) dims() (slices, rows, cols int, err error) {
	if len(l.Shape) == 0 {
		return 1, 1, 1, nil
	}
	for _, d := range l.Shape {
		if d <= 0 || d > 1<<31 {
			return 0, 0, 0, fmt.Errorf("emulator: shape %v has an empty or too large dimension", l.Shape)
		}
	}
	if len(l.Shape) == 1 {
		return 1, 1, int(l.Shape[0]), nil
	}
	slices = 1
	for _, d := range l.Shape[:len(l.Shape)-2] {
		slices *= int(d)
	}
	return slices, int(l.Shape[len(l.Shape)-2]), int(l.Shape[len(l.Shape)-1]), nil
}

// Elements returns the number of logical elements.
func (l Layout) Elements() int {
	s, r, c, err := l.dims()
	if err != nil {
		return 0
	}
	return s * r * c
}

// DecodeStored returns, in logical row-major order, the BF16 patterns the
// device unpacker produces for a stored BFP tensor: packed holds one packed
// matrix per slice (of the transposed matrix when l.Transposed), each in the
// tile layout of package bfp.
func DecodeStored(f bfp.Format, l Layout, packed []byte) ([]uint16, error) {
	slices, rows, cols, err := l.dims()
	if err != nil {
		return nil, err
	}
	pr, pc := rows, cols
	if l.Transposed {
		pr, pc = cols, rows
	}
	per, err := bfp.PackedSize(f, l.Tile, pr, pc)
	if err != nil {
		return nil, fmt.Errorf("emulator: %w", err)
	}
	if len(packed) != per*slices {
		return nil, fmt.Errorf("emulator: %d packed bytes, want %d for shape %v as %v in %v tiles", len(packed), per*slices, l.Shape, f, l.Tile)
	}
	out := make([]uint16, 0, slices*rows*cols)
	for s := 0; s < slices; s++ {
		m, err := DecodeBFP(f, l.Tile, packed[s*per:(s+1)*per], pr, pc)
		if err != nil {
			return nil, err
		}
		if l.Transposed {
			for r := 0; r < rows; r++ {
				for c := 0; c < cols; c++ {
					out = append(out, m[c*rows+r])
				}
			}
		} else {
			out = append(out, m...)
		}
	}
	return out, nil
}

// Mismatch locates one element of a dump that differs from the emulated
// decode.
type Mismatch struct {
	Tensor string `json:"tensor"`
	// Index is the element's logical index (one entry per dim).
	Index []int64 `json:"index"`
	// Slice, Row and Col locate it in the folded [slices, rows, cols] view.
	Slice int `json:"slice"`
	Row   int `json:"row"`
	Col   int `json:"col"`
	// TileRow and TileCol are the tile coordinates in the slice's stored
	// (packed) matrix; InTileRow and InTileCol the element's place in it.
	TileRow   int `json:"tile_row"`
	TileCol   int `json:"tile_col"`
	InTileRow int `json:"in_tile_row"`
	InTileCol int `json:"in_tile_col"`
	// Want and Got are bit patterns in the dump's format (BF16 in the low
	// 16 bits, or FP32).
	Want uint32 `json:"want"`
	Got  uint32 `json:"got"`
	// Bits is 16 or 32, the width of Want and Got.
	Bits int `json:"bits"`
}

// String describes the mismatch, naming tensor, tile and element.
func (m Mismatch) String() string {
	w := 4
	if m.Bits == 32 {
		w = 8
	}
	return fmt.Sprintf("tensor %q element %v: tile (%d,%d) element (%d,%d): device %0*x, emulated %0*x",
		m.Tensor, m.Index, m.TileRow, m.TileCol, m.InTileRow, m.InTileCol, w, m.Got, w, m.Want)
}

// CheckResult summarises the comparison of one tensor.
type CheckResult struct {
	Tensor     string     `json:"tensor"`
	Elements   int        `json:"elements"`
	Mismatches int        `json:"mismatches"`
	First      []Mismatch `json:"first,omitempty"` // up to the limit, in index order
}

// Dump is a tensor read back from a device: its element bit patterns in
// logical row-major order, either BF16 (in the low 16 bits) or FP32.
type Dump struct {
	Bits []uint32
	BF16 bool
}

// CheckDump compares a device dump with the emulated decode want (BF16
// patterns in logical order, from DecodeStored, or a BF16 tensor's stored
// bits) bit for bit. An FP32 dump must hold each BF16 value exactly (low 16
// bits zero). At most limit mismatches are recorded (all when limit < 0);
// all are counted.
func CheckDump(name string, l Layout, want []uint16, d Dump, limit int) (CheckResult, error) {
	return CheckDumpBits(name, l, bf16Dump(want), d, limit)
}

// bf16Dump holds BF16 patterns as a BF16 Dump.
func bf16Dump(h []uint16) Dump {
	d := Dump{Bits: make([]uint32, len(h)), BF16: true}
	for i, v := range h {
		d.Bits[i] = uint32(v)
	}
	return d
}

// CheckDumpBits is CheckDump with the expected values given as a Dump too:
// BF16 expectations compare with a BF16 dump directly and with an FP32 dump
// shifted into its high half; FP32 expectations (a tensor stored as F32)
// need an FP32 dump.
func CheckDumpBits(name string, l Layout, want, d Dump, limit int) (CheckResult, error) {
	res := CheckResult{Tensor: name}
	slices, rows, cols, err := l.dims()
	if err != nil {
		return res, fmt.Errorf("tensor %q: %w", name, err)
	}
	n := slices * rows * cols
	if len(want.Bits) != n || len(d.Bits) != n {
		return res, fmt.Errorf("emulator: tensor %q: shape %v has %d elements; emulated decode has %d, dump %d", name, l.Shape, n, len(want.Bits), len(d.Bits))
	}
	if !want.BF16 && d.BF16 {
		return res, fmt.Errorf("emulator: tensor %q is stored as F32; a BF16 dump cannot match it bit for bit", name)
	}
	if l.Tile == (bfp.Tile{}) {
		l.Tile = bfp.Tile32x32
	}
	if err := l.Tile.Valid(); err != nil {
		return res, fmt.Errorf("emulator: tensor %q: %w", name, err)
	}
	res.Elements = n
	for i, w := range want.Bits {
		exp, bits := w, 32
		switch {
		case want.BF16 && d.BF16:
			exp, bits = w&0xffff, 16
		case want.BF16:
			exp = (w & 0xffff) << 16
		}
		got := d.Bits[i]
		if d.BF16 {
			got &= 0xffff
		}
		if got == exp {
			continue
		}
		res.Mismatches++
		if limit >= 0 && len(res.First) >= limit {
			continue
		}
		s, r, c := i/(rows*cols), i/cols%rows, i%cols
		pr, pc := r, c
		if l.Transposed {
			pr, pc = c, r
		}
		res.First = append(res.First, Mismatch{
			Tensor: name, Index: logicalIndex(l.Shape, i), Slice: s, Row: r, Col: c,
			TileRow: pr / l.Tile.H, TileCol: pc / l.Tile.W, InTileRow: pr % l.Tile.H, InTileCol: pc % l.Tile.W,
			Want: exp, Got: got, Bits: bits,
		})
	}
	return res, nil
}

func logicalIndex(shape []int64, i int) []int64 {
	idx := make([]int64, len(shape))
	for k := len(shape) - 1; k >= 0; k-- {
		idx[k] = int64(i) % shape[k]
		i /= int(shape[k])
	}
	return idx
}
