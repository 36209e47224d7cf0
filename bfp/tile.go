package bfp

import (
	"fmt"
	"strconv"
	"strings"
)

// Tile is a tile shape, H rows by W columns. Only the shapes tt-metal
// accepts are valid: 32x32, 16x32, 32x16, 16x16, and the small shapes 8x32,
// 4x32, 2x32, 1x32, 8x16, 4x16, 2x16, 1x16.
//
// A tile is cut into faces: 16 columns wide and min(H, 16) rows high, walked
// row-major over the face grid. Each face row (16 values) is one exponent
// group.
type Tile struct{ H, W int }

// The valid tile shapes.
var (
	Tile32x32 = Tile{32, 32}
	Tile16x32 = Tile{16, 32}
	Tile32x16 = Tile{32, 16}
	Tile16x16 = Tile{16, 16}
	Tile8x32  = Tile{8, 32}
	Tile4x32  = Tile{4, 32}
	Tile2x32  = Tile{2, 32}
	Tile1x32  = Tile{1, 32}
	Tile8x16  = Tile{8, 16}
	Tile4x16  = Tile{4, 16}
	Tile2x16  = Tile{2, 16}
	Tile1x16  = Tile{1, 16}
)

// Tiles lists every valid tile shape, 32x32 first.
func Tiles() []Tile {
	return []Tile{Tile32x32, Tile16x32, Tile32x16, Tile16x16,
		Tile8x32, Tile4x32, Tile2x32, Tile1x32,
		Tile8x16, Tile4x16, Tile2x16, Tile1x16}
}

// ExponentAlign is the alignment in bytes of a tile's exponent section
// (tt-metal's L1 alignment). Tiles with fewer groups than this pad their
// exponent section with zero bytes up to it.
const ExponentAlign = 16

// GroupSize is the number of elements sharing one exponent byte: one face row.
const GroupSize = 16

// FaceW is the width of every face, and of every exponent group.
const FaceW = 16

// Valid reports whether t is a shape tt-metal accepts. The error wraps
// ErrInvalidTile.
func (t Tile) Valid() error {
	if t.W == 32 || t.W == 16 {
		switch t.H {
		case 32, 16, 8, 4, 2, 1:
			return nil
		}
	}
	return &TileError{Tile: t}
}

// String returns "HxW".
func (t Tile) String() string { return strconv.Itoa(t.H) + "x" + strconv.Itoa(t.W) }

// ParseTile parses "HxW" (for example "32x32"); the result is validated and
// the error wraps ErrInvalidTile.
func ParseTile(s string) (Tile, error) {
	hs, ws, ok := strings.Cut(strings.ToLower(strings.TrimSpace(s)), "x")
	if !ok {
		return Tile{}, fmt.Errorf("bfp: tile %q is not of the form HxW: %w", s, ErrInvalidTile)
	}
	h, err1 := strconv.Atoi(hs)
	w, err2 := strconv.Atoi(ws)
	if err1 != nil || err2 != nil {
		return Tile{}, fmt.Errorf("bfp: tile %q is not of the form HxW: %w", s, ErrInvalidTile)
	}
	t := Tile{h, w}
	if err := t.Valid(); err != nil {
		return Tile{}, err
	}
	return t, nil
}

// MarshalText implements encoding.TextMarshaler ("HxW").
func (t Tile) MarshalText() ([]byte, error) {
	if err := t.Valid(); err != nil {
		return nil, err
	}
	return []byte(t.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseTile.
func (t *Tile) UnmarshalText(b []byte) error {
	v, err := ParseTile(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

func (t Tile) mustValid() {
	if err := t.Valid(); err != nil {
		panic("bfp: invalid tile " + t.String())
	}
}

// FaceH returns the face height: 16 for tiles 16 or more rows high, the tile
// height otherwise. It panics on an invalid tile.
func (t Tile) FaceH() int {
	t.mustValid()
	return min(t.H, 16)
}

// Faces returns the number of faces in the tile.
func (t Tile) Faces() int {
	return (t.H / t.FaceH()) * (t.W / FaceW)
}

// Groups returns the number of 16-value exponent groups in the tile.
func (t Tile) Groups() int {
	t.mustValid()
	return t.H * t.W / GroupSize
}

// ExponentBytes returns the size of the tile's exponent section: one byte
// per group, padded with zeros up to ExponentAlign bytes.
func (t Tile) ExponentBytes() int {
	g := t.Groups()
	return (g + ExponentAlign - 1) / ExponentAlign * ExponentAlign
}

// TileBytes returns the packed size in bytes of one tile: the exponent
// section followed by H*W codes of f.Bits() bits. It panics on an invalid
// format or tile (check with Valid first).
func TileBytes(f Format, t Tile) int {
	return t.ExponentBytes() + t.H*t.W*f.Bits()/8
}

// GroupLocation returns where group g of a tile starts: tile-local row and
// column of its first element. Groups are numbered in packed order: faces
// row-major over the face grid, face rows top to bottom. g must be in
// [0, t.Groups()).
func (t Tile) GroupLocation(g int) (row, col int) {
	if g < 0 || g >= t.Groups() {
		panic("bfp: group index out of range for tile " + t.String())
	}
	fh := t.FaceH()
	face, r := g/fh, g%fh
	faceCols := t.W / FaceW
	return (face/faceCols)*fh + r, (face % faceCols) * FaceW
}

// PackedSize returns the number of bytes Pack produces for a rows x cols
// matrix: the matrix is padded to whole tiles and every tile takes
// TileBytes(f, t). The error names the invalid format, tile or shape.
func PackedSize(f Format, t Tile, rows, cols int) (int, error) {
	if err := check(f, t, rows, cols); err != nil {
		return 0, err
	}
	n, ok := packedSize(f, t, rows, cols)
	if !ok {
		return 0, &ShapeError{Rows: rows, Cols: cols, Tile: t, Reason: "packed size overflows int"}
	}
	return n, nil
}

// TileGrid returns the number of tile rows and tile columns covering a
// rows x cols matrix. It panics on an invalid tile.
func TileGrid(t Tile, rows, cols int) (tileRows, tileCols int) {
	t.mustValid()
	return (rows + t.H - 1) / t.H, (cols + t.W - 1) / t.W
}

func packedSize(f Format, t Tile, rows, cols int) (int, bool) {
	tr, tc := TileGrid(t, rows, cols)
	const maxInt = int(^uint(0) >> 1)
	tb := TileBytes(f, t)
	if tr > maxInt/tc {
		return 0, false
	}
	n := tr * tc
	if n > maxInt/tb || n > maxInt/(t.H*t.W) {
		return 0, false
	}
	return n * tb, true
}

func check(f Format, t Tile, rows, cols int) error {
	if err := f.Valid(); err != nil {
		return err
	}
	if err := t.Valid(); err != nil {
		return err
	}
	if rows <= 0 || cols <= 0 {
		return &ShapeError{Rows: rows, Cols: cols, Tile: t, Reason: "rows and cols must be positive"}
	}
	return nil
}
