package bfp

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error returned by this package wraps one of them,
// so callers can test the kind with errors.Is and get the details with
// errors.As on the typed errors below.
var (
	// ErrUnknownFormat: a format value or name that is not BFP8_b, BFP4_b or BFP2_b.
	ErrUnknownFormat = errors.New("unknown BFP format")
	// ErrUnknownAxis: an exponent-sharing axis that is not input or output.
	ErrUnknownAxis = errors.New("unknown block axis")
	// ErrInvalidTile: a tile shape tt-metal does not accept.
	ErrInvalidTile = errors.New("invalid tile shape")
	// ErrShape: rows or cols not positive, too large, or not matching the data.
	ErrShape = errors.New("invalid matrix shape")
	// ErrBufferSize: a destination or packed buffer of the wrong length.
	ErrBufferSize = errors.New("wrong buffer size")
	// ErrNotCanonical: packed bytes that Pack would never produce (Validate).
	ErrNotCanonical = errors.New("packed data not as the packer emits it")
)

// FormatError reports an unknown format. It wraps ErrUnknownFormat.
type FormatError struct {
	Value string // the name or value that was given
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("bfp: unknown format %q (want BFP8_b, BFP4_b or BFP2_b)", e.Value)
}

// Unwrap returns ErrUnknownFormat.
func (e *FormatError) Unwrap() error { return ErrUnknownFormat }

// AxisError reports an unknown block axis. It wraps ErrUnknownAxis.
type AxisError struct {
	Value string // the name that was given
}

func (e *AxisError) Error() string {
	return fmt.Sprintf("bfp: unknown block axis %q (want input or output)", e.Value)
}

// Unwrap returns ErrUnknownAxis.
func (e *AxisError) Unwrap() error { return ErrUnknownAxis }

// TileError reports a tile shape tt-metal does not accept. It wraps
// ErrInvalidTile.
type TileError struct {
	Tile Tile
}

func (e *TileError) Error() string {
	return fmt.Sprintf("bfp: invalid tile %s (want 32x32, 16x32, 32x16, 16x16, or 8/4/2/1 x 32/16)", e.Tile)
}

// Unwrap returns ErrInvalidTile.
func (e *TileError) Unwrap() error { return ErrInvalidTile }

// ShapeError reports a matrix shape that cannot be used: rows or cols not
// positive, a size overflow, or a source slice whose length is not
// rows*cols. It wraps ErrShape.
type ShapeError struct {
	Rows, Cols int
	Tile       Tile
	Len        int // length of the offending slice, when Reason is about it
	Reason     string
}

func (e *ShapeError) Error() string {
	s := fmt.Sprintf("bfp: matrix %dx%d", e.Rows, e.Cols)
	if e.Tile != (Tile{}) {
		s += " (tile " + e.Tile.String() + ")"
	}
	return s + ": " + e.Reason
}

// Unwrap returns ErrShape.
func (e *ShapeError) Unwrap() error { return ErrShape }

// BufferError reports a buffer whose length does not match what the format,
// tile and shape require. It wraps ErrBufferSize.
type BufferError struct {
	Op         string // "Pack", "Unpack", ...
	Buffer     string // which buffer: "packed source", "destination", ...
	Format     Format
	Tile       Tile
	Rows, Cols int
	Got, Want  int // lengths in elements of the buffer's type
}

func (e *BufferError) Error() string {
	return fmt.Sprintf("bfp: %s %s %dx%d (tile %s): %s has length %d, want %d",
		e.Op, e.Format, e.Rows, e.Cols, e.Tile, e.Buffer, e.Got, e.Want)
}

// Unwrap returns ErrBufferSize.
func (e *BufferError) Unwrap() error { return ErrBufferSize }
