package bfp

import (
	"fmt"
	"math/bits"
)

// CanonicalError locates the first place where packed bytes differ from
// anything Pack can produce. It wraps ErrNotCanonical.
type CanonicalError struct {
	Format Format
	Tile   Tile
	// TileIndex is the tile's position in the packed stream; TileRow and
	// TileCol its position in the tile grid.
	TileIndex, TileRow, TileCol int
	// Group is the group within the tile, Element the element within the
	// group (-1 when the problem concerns the group or the exponent
	// section as a whole).
	Group, Element int
	// Row and Col are the matrix position of the element (or of the
	// group's first element); they may lie in the padding.
	Row, Col int
	Reason   string
}

func (e *CanonicalError) Error() string {
	where := fmt.Sprintf("tile %d (grid %d,%d) group %d", e.TileIndex, e.TileRow, e.TileCol, e.Group)
	if e.Element >= 0 {
		where += fmt.Sprintf(" element %d (matrix row %d col %d)", e.Element, e.Row, e.Col)
	}
	return fmt.Sprintf("bfp: %s %s data not canonical at %s: %s", e.Format, e.Tile, where, e.Reason)
}

// Unwrap returns ErrNotCanonical.
func (e *CanonicalError) Unwrap() error { return ErrNotCanonical }

// Validate reports whether src is exactly what Pack produces for some
// rows x cols input, that is whether Pack(Unpack(src)) == src. It returns
// nil if so, and otherwise a *CanonicalError for the first offending tile,
// group and element. Besides the length and shape errors of Unpack, the
// conditions are, per group with exponent byte E:
//
//   - no code is a sign without magnitude (the packer never emits -0);
//   - codes of padding elements (beyond rows or cols) are 0;
//   - every non-zero magnitude decodes to a normal float32 at E, i.e. its
//     normalising shift is smaller than E (so E = 0 allows only zeros);
//   - when E is not 0, some element has the top magnitude bit set (the
//     element whose exponent set E);
//   - the exponent section's alignment padding is zero.
func Validate(f Format, t Tile, src []byte, rows, cols int) error {
	n, err := PackedSize(f, t, rows, cols)
	if err != nil {
		return err
	}
	if len(src) != n {
		return &BufferError{Op: "Validate", Buffer: "packed source", Format: f, Tile: t, Rows: rows, Cols: cols, Got: len(src), Want: n}
	}
	w := uint(f.MantissaBits())
	bitsPer := w + 1
	magMask := uint32(1)<<w - 1
	tb, eb, groups := TileBytes(f, t), t.ExponentBytes(), t.Groups()
	gb := GroupSize * int(bitsPer) / 8
	_, tcN := TileGrid(t, rows, cols)
	for ti := range len(src) / tb {
		tile := src[ti*tb:][:tb]
		tr, tc := ti/tcN, ti%tcN
		fail := func(g, k, r, c int, reason string) error {
			return &CanonicalError{Format: f, Tile: t, TileIndex: ti, TileRow: tr, TileCol: tc,
				Group: g, Element: k, Row: r, Col: c, Reason: reason}
		}
		for g := range groups {
			gr, gc := t.GroupLocation(g)
			r, c0 := tr*t.H+gr, tc*t.W+gc
			e := uint32(tile[g])
			m := tile[eb+g*gb:][:gb]
			top := false
			for k := range GroupSize {
				bit := uint(k) * bitsPer
				code := uint32(m[bit/8]) >> (bit % 8) & (1<<bitsPer - 1)
				mag := code & magMask
				if code == 0 {
					continue
				}
				c := c0 + k
				switch {
				case r >= rows || c >= cols:
					return fail(g, k, r, c, fmt.Sprintf("padding element has code %#x, want 0", code))
				case mag == 0:
					return fail(g, k, r, c, fmt.Sprintf("sign-only code %#x", code))
				case uint32(w)-uint32(bits.Len32(mag)) >= e:
					return fail(g, k, r, c, fmt.Sprintf("magnitude %d is not representable with exponent %d", mag, e))
				}
				top = top || mag>>(w-1) != 0
			}
			if e != 0 && !top {
				return fail(g, -1, r, c0, fmt.Sprintf("exponent %d but no element uses its top magnitude bit", e))
			}
		}
		for i, b := range tile[groups:eb] {
			if b != 0 {
				return fail(groups+i, -1, tr*t.H, tc*t.W, fmt.Sprintf("exponent padding byte %d is %#x, want 0", groups+i, b))
			}
		}
	}
	return nil
}
