package ttnn

import (
	"fmt"

	"github.com/ttquant/ttquant/bfp"
)

// tileGeometry describes a stack of matrices laid out in tiles: slices
// matrices of rows×cols elements of elem bytes, each padded to whole tiles.
type tileGeometry struct {
	slices, rows, cols, elem int
	tile                     bfp.Tile
}

func (g tileGeometry) tiledSize() int {
	tr, tc := bfp.TileGrid(g.tile, g.rows, g.cols)
	return g.slices * tr * tc * g.tile.H * g.tile.W * g.elem
}

// walk calls fn(src, dst) with the byte offsets of every element of a row
// segment: for each face row of each tile, the row-major offset of its
// first element (or -1 for a padding row), the tiled offset, and the number
// of real elements in the segment (the rest of the 16 are padding).
func (g tileGeometry) walk(fn func(src, dst, n int)) {
	t := g.tile
	fh := t.FaceH()
	faceCols := t.W / bfp.FaceW
	tr, tc := bfp.TileGrid(t, g.rows, g.cols)
	dst := 0
	for s := 0; s < g.slices; s++ {
		base := s * g.rows * g.cols
		for i := 0; i < tr; i++ {
			for j := 0; j < tc; j++ {
				for f := 0; f < t.Faces(); f++ {
					r0 := i*t.H + (f/faceCols)*fh
					c0 := j*t.W + (f%faceCols)*bfp.FaceW
					n := min(bfp.FaceW, max(0, g.cols-c0))
					for r := r0; r < r0+fh; r++ {
						src := -1
						m := n
						if r < g.rows {
							src = (base + r*g.cols + c0) * g.elem
						} else {
							m = 0
						}
						fn(src, dst, m)
						dst += bfp.FaceW * g.elem
					}
				}
			}
		}
	}
}

// tilize lays a row-major stack of matrices out in tiles, faces row-major
// within a tile and face rows top to bottom, padding with zeros: the order
// ttnn's tilize gives BFLOAT16 and FLOAT32 TILE tensors.
func tilize(src []byte, g tileGeometry) ([]byte, error) {
	if len(src) != g.slices*g.rows*g.cols*g.elem {
		return nil, fmt.Errorf("%w: %d bytes for %d×%d×%d elements of %d bytes", ErrShape, len(src), g.slices, g.rows, g.cols, g.elem)
	}
	dst := make([]byte, g.tiledSize())
	g.walk(func(s, d, n int) {
		if n > 0 {
			copy(dst[d:d+n*g.elem], src[s:s+n*g.elem])
		}
	})
	return dst, nil
}

// untilize inverts tilize. Padding that is not zero is an error: tilize
// never writes it, so such a payload did not come from a row-major tensor
// of this shape.
func untilize(src []byte, g tileGeometry) ([]byte, error) {
	if len(src) != g.tiledSize() {
		return nil, fmt.Errorf("%w: %d tiled bytes, want %d", ErrShape, len(src), g.tiledSize())
	}
	dst := make([]byte, g.slices*g.rows*g.cols*g.elem)
	bad := -1
	g.walk(func(s, d, n int) {
		if n > 0 {
			copy(dst[s:s+n*g.elem], src[d:d+n*g.elem])
		}
		for _, b := range src[d+n*g.elem : d+bfp.FaceW*g.elem] {
			if b != 0 && bad < 0 {
				bad = d
			}
		}
	})
	if bad >= 0 {
		return nil, fmt.Errorf("%w: non-zero padding in the tile data near byte %d", ErrFormat, bad)
	}
	return dst, nil
}

// transposeLast2 transposes the last two dimensions of a row-major stack of
// rows×cols matrices of elem-byte elements.
func transposeLast2(src []byte, slices, rows, cols, elem int) []byte {
	dst := make([]byte, len(src))
	for s := 0; s < slices; s++ {
		base := s * rows * cols * elem
		for r := 0; r < rows; r++ {
			for c := 0; c < cols; c++ {
				from := base + (r*cols+c)*elem
				to := base + (c*rows+r)*elem
				copy(dst[to:to+elem], src[from:from+elem])
			}
		}
	}
	return dst
}
