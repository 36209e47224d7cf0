package bfp

import (
	"runtime"
	"strconv"
	"sync"
)

// Pack packs a row-major rows x cols float32 matrix into tiles of format f.
// The matrix is padded with +0.0 to whole tiles, tiles are emitted
// row-major over the tile grid, and each tile is the exponent section
// followed by the codes, exactly as tt-metal's host packer lays it out for
// what ttnn hands it. len(src) must be rows*cols.
func Pack(f Format, t Tile, src []float32, rows, cols int) ([]byte, error) {
	n, err := PackedSize(f, t, rows, cols)
	if err != nil {
		return nil, err
	}
	if err := checkSrc(t, len(src), rows, cols); err != nil {
		return nil, err
	}
	dst := make([]byte, n)
	tr, _ := TileGrid(t, rows, cols)
	packRange(packRow, dst, f, t, src, rows, cols, 0, tr)
	return dst, nil
}

// PackInto is Pack writing into dst, which must have length
// PackedSize(f, t, rows, cols). Every byte of dst is written, padding
// included. PackInto allocates only a one-row scratch buffer, and only when
// the matrix is not a whole number of tiles.
func PackInto(dst []byte, f Format, t Tile, src []float32, rows, cols int) error {
	return ParallelPackInto(dst, f, t, src, rows, cols, 1)
}

// ParallelPackInto is PackInto spreading the tile rows over up to workers
// goroutines (workers <= 0 means GOMAXPROCS). The output does not depend on
// workers.
func ParallelPackInto(dst []byte, f Format, t Tile, src []float32, rows, cols, workers int) error {
	n, err := PackedSize(f, t, rows, cols)
	if err != nil {
		return err
	}
	if err := checkSrc(t, len(src), rows, cols); err != nil {
		return err
	}
	if len(dst) != n {
		return &BufferError{Op: "Pack", Buffer: "destination", Format: f, Tile: t, Rows: rows, Cols: cols, Got: len(dst), Want: n}
	}
	tr, _ := TileGrid(t, rows, cols)
	parallel(tr, workers, func(r0, r1 int) {
		packRange(packRow, dst, f, t, src, rows, cols, r0, r1)
	})
	return nil
}

// Unpack decodes packed tiles of format f back into the row-major
// rows x cols matrix, dropping the tile padding. len(src) must be
// PackedSize(f, t, rows, cols). Every byte pattern decodes to some value,
// exactly as tt-metal's host unpacker decodes it.
func Unpack(f Format, t Tile, src []byte, rows, cols int) ([]float32, error) {
	n, err := PackedSize(f, t, rows, cols)
	if err != nil {
		return nil, err
	}
	if len(src) != n {
		return nil, &BufferError{Op: "Unpack", Buffer: "packed source", Format: f, Tile: t, Rows: rows, Cols: cols, Got: len(src), Want: n}
	}
	dst := make([]float32, rows*cols)
	tr, _ := TileGrid(t, rows, cols)
	unpackRange(unpackRow, dst, f, t, src, rows, cols, 0, tr)
	return dst, nil
}

// UnpackInto is Unpack writing into dst, which must have length rows*cols.
func UnpackInto(dst []float32, f Format, t Tile, src []byte, rows, cols int) error {
	return ParallelUnpackInto(dst, f, t, src, rows, cols, 1)
}

// ParallelUnpackInto is UnpackInto spreading the tile rows over up to
// workers goroutines (workers <= 0 means GOMAXPROCS). The output does not
// depend on workers.
func ParallelUnpackInto(dst []float32, f Format, t Tile, src []byte, rows, cols, workers int) error {
	n, err := PackedSize(f, t, rows, cols)
	if err != nil {
		return err
	}
	if len(src) != n {
		return &BufferError{Op: "Unpack", Buffer: "packed source", Format: f, Tile: t, Rows: rows, Cols: cols, Got: len(src), Want: n}
	}
	if len(dst) != rows*cols {
		return &BufferError{Op: "Unpack", Buffer: "destination", Format: f, Tile: t, Rows: rows, Cols: cols, Got: len(dst), Want: rows * cols}
	}
	tr, _ := TileGrid(t, rows, cols)
	parallel(tr, workers, func(r0, r1 int) {
		unpackRange(unpackRow, dst, f, t, src, rows, cols, r0, r1)
	})
	return nil
}

// Quantize returns the matrix as the device sees it after packing:
// Unpack(Pack(src)) without the intermediate buffer being kept.
func Quantize(f Format, t Tile, src []float32, rows, cols int) ([]float32, error) {
	p, err := Pack(f, t, src, rows, cols)
	if err != nil {
		return nil, err
	}
	return Unpack(f, t, p, rows, cols)
}

func checkSrc(t Tile, n, rows, cols int) error {
	// PackedSize has succeeded, so rows*cols padded to tiles fits an int
	// and so does rows*cols.
	if n != rows*cols {
		return &ShapeError{Rows: rows, Cols: cols, Tile: t, Len: n,
			Reason: "source has " + strconv.Itoa(n) + " values, want rows*cols = " + strconv.Itoa(rows*cols)}
	}
	return nil
}

// parallel runs fn over [0, n) split into contiguous chunks, one per worker.
func parallel(n, workers int, fn func(lo, hi int)) {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, n)
	if workers <= 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := n*w/workers, n*(w+1)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

// packRowFunc packs one matrix row of a tile band: nt tiles of fc groups
// each, src holding the nt*fc*16 values. The exponent byte of group c of
// tile t goes to exp[t*tb+c*se], its codes to mant[t*tb+c*sm:].
type packRowFunc func(f Format, src []float32, nt, fc int, exp, mant []byte, tb, se, sm int)

// unpackRowFunc is the inverse of packRowFunc, writing nt*fc*16 values to
// dst. stream hints that dst is part of a large output that will not be
// read again soon, so a kernel may bypass the cache when writing it.
type unpackRowFunc func(f Format, exp, mant []byte, nt, fc, tb, se, sm int, dst []float32, stream bool)

// streamBytes is the output size from which unpacking writes around the
// cache (beyond what a core's caches hold anyway).
const streamBytes = 8 << 20

// packRange packs tile rows [tr0, tr1) with kernel k. It walks the matrix
// row by row, so the source is read sequentially; each row scatters its
// groups over the tiles of its band.
func packRange(k packRowFunc, dst []byte, f Format, t Tile, src []float32, rows, cols, tr0, tr1 int) {
	_, tcN := TileGrid(t, rows, cols)
	tb := TileBytes(f, t)
	fh := t.FaceH()
	fc := t.W / FaceW
	groups := t.Groups()
	eb := t.ExponentBytes()
	gb := GroupSize * f.Bits() / 8 // bytes of codes per group
	rowLen := tcN * t.W
	var row []float32
	for tr := tr0; tr < tr1; tr++ {
		band := dst[tr*tcN*tb:][:tcN*tb]
		for r := range t.H {
			gOff := (r/fh)*fc*fh + r%fh // first group of this row in a tile
			R := tr*t.H + r
			var s []float32
			if R < rows && cols == rowLen {
				s = src[R*cols:][:rowLen]
			} else {
				if row == nil {
					row = make([]float32, rowLen)
				}
				if R < rows {
					copy(row, src[R*cols:(R+1)*cols])
					clear(row[cols:])
				} else {
					clear(row)
				}
				s = row
			}
			k(f, s, tcN, fc, band[gOff:], band[eb+gOff*gb:], tb, fh, fh*gb)
		}
		if groups < eb {
			for tc := range tcN {
				clear(band[tc*tb+groups : tc*tb+eb])
			}
		}
	}
}

// unpackRange unpacks tile rows [tr0, tr1) with kernel k, row by row;
// padding rows are skipped and padding columns dropped.
func unpackRange(k unpackRowFunc, dst []float32, f Format, t Tile, src []byte, rows, cols, tr0, tr1 int) {
	_, tcN := TileGrid(t, rows, cols)
	tb := TileBytes(f, t)
	fh := t.FaceH()
	fc := t.W / FaceW
	eb := t.ExponentBytes()
	gb := GroupSize * f.Bits() / 8
	rowLen := tcN * t.W
	stream := rows*cols >= streamBytes/4
	var row []float32
	for tr := tr0; tr < tr1; tr++ {
		band := src[tr*tcN*tb:][:tcN*tb]
		for r := range t.H {
			R := tr*t.H + r
			if R >= rows {
				break
			}
			gOff := (r/fh)*fc*fh + r%fh
			if cols == rowLen {
				k(f, band[gOff:], band[eb+gOff*gb:], tcN, fc, tb, fh, fh*gb, dst[R*cols:][:rowLen], stream)
				continue
			}
			if row == nil {
				row = make([]float32, rowLen)
			}
			k(f, band[gOff:], band[eb+gOff*gb:], tcN, fc, tb, fh, fh*gb, row, false)
			copy(dst[R*cols:(R+1)*cols], row)
		}
	}
}
