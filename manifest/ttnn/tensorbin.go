package ttnn

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"

	"github.com/ttquant/ttquant/bfp"
)

// Ext is the file name extension ttnn requires.
const Ext = ".tensorbin"

// DataAlign is the alignment of the data region and of every buffer in the
// files this package writes (file offsets; the newest ttnn writers use the
// same, older readers need 8).
const DataAlign = 64

// maxDevices bounds the devices of a mesh (the largest tt-metal systems
// have a few hundred).
const maxDevices = 4096

// maxElements bounds the element count of a shape so that size arithmetic
// cannot overflow.
const maxElements = 1 << 50

// PaddedShape returns the shape the payload covers: each dimension rounded
// up to its alignment, the alignment vector (the stored one, or ttnn's
// default when empty) right-aligned against the shape.
func (s *Spec) PaddedShape() ([]uint64, error) {
	if len(s.Shape) == 0 {
		return nil, fmt.Errorf("%w: empty shape", ErrShape)
	}
	elems := uint64(1)
	for _, d := range s.Shape {
		if d == 0 {
			return nil, fmt.Errorf("%w: shape %v has a zero dimension", ErrShape, s.Shape)
		}
	}
	align := s.Alignment
	switch s.Layout {
	case TileLayout:
		if err := s.Tile.Valid(); err != nil {
			return nil, fmt.Errorf("%w: tile %s is not a tile shape ttnn accepts", ErrShape, s.Tile)
		}
		if len(s.Shape) < 2 {
			return nil, fmt.Errorf("%w: shape %v: TILE layout needs rank 2 or more", ErrShape, s.Shape)
		}
		if len(align) == 0 {
			align = []uint32{uint32(s.Tile.H), uint32(s.Tile.W)}
		}
		if len(align) < 2 || align[len(align)-2]%uint32(s.Tile.H) != 0 || align[len(align)-1]%uint32(s.Tile.W) != 0 {
			return nil, fmt.Errorf("%w: alignment %v does not cover the %s tile", ErrFormat, align, s.Tile)
		}
	case RowMajor:
		if len(align) == 0 {
			align = []uint32{1}
		}
	default:
		return nil, fmt.Errorf("%w: layout %v", ErrFormat, s.Layout)
	}
	if len(align) > len(s.Shape) {
		return nil, fmt.Errorf("%w: alignment %v longer than shape %v", ErrFormat, align, s.Shape)
	}
	out := make([]uint64, len(s.Shape))
	for i, d := range s.Shape {
		p := uint64(d)
		if k := i - (len(s.Shape) - len(align)); k >= 0 {
			a := uint64(align[k])
			if a == 0 {
				return nil, fmt.Errorf("%w: alignment %v has a zero", ErrFormat, align)
			}
			p = (p + a - 1) / a * a
		}
		out[i] = p
		if p > maxElements/elems {
			return nil, fmt.Errorf("%w: shape %v is too large", ErrShape, s.Shape)
		}
		elems *= p
	}
	return out, nil
}

// PayloadSize returns the bytes of one shard's buffer for the spec: whole
// tiles (tile bytes per tile) for TILE, elements for ROW_MAJOR. This is
// ttnn's packed buffer size; a file whose buffers differ is refused.
func (s *Spec) PayloadSize() (int64, error) {
	if !s.DType.Valid() {
		return 0, fmt.Errorf("%w: data type %v", ErrUnsupported, s.DType)
	}
	padded, err := s.PaddedShape()
	if err != nil {
		return 0, err
	}
	n := uint64(1)
	for _, d := range padded {
		n *= d
	}
	f, isBFP := s.DType.BFP()
	if s.Layout == RowMajor {
		if isBFP {
			return 0, fmt.Errorf("%w: %s needs TILE layout", ErrShape, s.DType)
		}
		return int64(n) * int64(s.DType.ElementSize()), nil
	}
	tiles := int64(n / uint64(s.Tile.H*s.Tile.W))
	if isBFP {
		return tiles * int64(bfp.TileBytes(f, s.Tile)), nil
	}
	return tiles * int64(s.Tile.H*s.Tile.W*s.DType.ElementSize()), nil
}

// Replicated returns the shards and topology of a tensor replicated over a
// mesh: one shard per mesh coordinate (row-major), all referencing the one
// buffer at offset 0. A 1×1 mesh gets the label ttnn writes for a single
// device tensor (distribution shape [1], one Replicate placement).
func Replicated(mesh []uint32, size uint64) ([]Shard, *Topology, error) {
	if len(mesh) == 0 {
		return nil, nil, fmt.Errorf("%w: empty mesh shape", ErrShape)
	}
	n := 1
	for _, d := range mesh {
		if d == 0 || d > maxDevices || n*int(d) > maxDevices {
			return nil, nil, fmt.Errorf("%w: mesh shape %v", ErrShape, mesh)
		}
		n *= int(d)
	}
	var shards []Shard
	coords := make([][]uint32, 0, n)
	for i := 0; i < n; i++ {
		c := make([]uint32, len(mesh))
		r := i
		for k := len(mesh) - 1; k >= 0; k-- {
			c[k] = uint32(r % int(mesh[k]))
			r /= int(mesh[k])
		}
		coords = append(coords, c)
		shards = append(shards, Shard{Offset: 0, Size: size, Coord: c})
	}
	topo := &Topology{}
	if n == 1 {
		topo.DistributionShape = []uint32{1}
		topo.Placements = []Placement{{Kind: Replicate}}
	} else {
		topo.DistributionShape = slices.Clone(mesh)
		for range mesh {
			topo.Placements = append(topo.Placements, Placement{Kind: Replicate})
		}
	}
	for _, c := range coords {
		topo.MeshCoords = append(topo.MeshCoords, slices.Clone(c))
	}
	return shards, topo, nil
}

// NewHeader returns the header of a tensor with the given spec replicated
// over mesh (nil means 1×1), its payload one buffer of the spec's size.
func NewHeader(spec Spec, mesh []uint32) (*Header, error) {
	if len(mesh) == 0 {
		mesh = []uint32{1, 1}
	}
	n, err := spec.PayloadSize()
	if err != nil {
		return nil, err
	}
	if spec.Alignment == nil {
		switch spec.Layout {
		case TileLayout:
			spec.Alignment = []uint32{uint32(spec.Tile.H), uint32(spec.Tile.W)}
		case RowMajor:
			spec.Alignment = []uint32{1}
		}
	}
	shards, topo, err := Replicated(mesh, uint64(n))
	if err != nil {
		return nil, err
	}
	return &Header{Spec: spec, MeshShape: slices.Clone(mesh), Shards: shards, Topology: topo}, nil
}

// EncodeHeader returns the bytes of a tensor file before its data region:
// header_size, the flatbuffer and zero padding up to the next DataAlign
// boundary. The header is checked first (Check); a buffer offset that is not
// a multiple of DataAlign is refused.
func EncodeHeader(h *Header) ([]byte, error) {
	var dataEnd uint64
	for i, s := range h.Shards {
		if s.Offset%DataAlign != 0 {
			return nil, fmt.Errorf("%w: shard %d at data offset %d, not a multiple of %d", ErrFormat, i, s.Offset, DataAlign)
		}
		dataEnd = max(dataEnd, s.Offset+s.Size)
	}
	if err := h.Check(dataEnd); err != nil {
		return nil, err
	}
	fb := buildFlatBuffer(h)
	total := (8 + len(fb) + DataAlign - 1) / DataAlign * DataAlign
	out := make([]byte, total)
	binary.LittleEndian.PutUint64(out, uint64(total-8))
	copy(out[8:], fb)
	return out, nil
}

// Marshal returns a whole tensor file: the header of spec replicated over
// mesh (nil: 1×1) and the payload, whose length must be the spec's payload
// size.
func Marshal(spec Spec, mesh []uint32, payload []byte) ([]byte, error) {
	var b bytes.Buffer
	if _, err := Write(&b, spec, mesh, payload); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Write writes a tensor file to w (see Marshal) and returns the bytes
// written.
func Write(w io.Writer, spec Spec, mesh []uint32, payload []byte) (int64, error) {
	h, err := NewHeader(spec, mesh)
	if err != nil {
		return 0, err
	}
	if want := h.Shards[0].Size; uint64(len(payload)) != want {
		return 0, fmt.Errorf("%w: payload of %d bytes, the spec (%v %s %s) needs %d", ErrShape, len(payload), spec.Shape, spec.DType, spec.Layout, want)
	}
	head, err := EncodeHeader(h)
	if err != nil {
		return 0, err
	}
	n, err := w.Write(head)
	if err != nil {
		return int64(n), err
	}
	m, err := w.Write(payload)
	return int64(n + m), err
}

// Check checks a header's meaning: a valid spec, a mesh shape, every shard
// coordinate inside the mesh and listed once, every buffer the spec's
// payload size and inside a data region of dataSize bytes, and a topology
// that agrees with the shards (placements per distribution dimension,
// coordinates per distribution element, every shard coordinate listed).
func (h *Header) Check(dataSize uint64) error {
	want, err := h.Spec.PayloadSize()
	if err != nil {
		return err
	}
	if h.Spec.Layout == TileLayout && h.Spec.TransposeTile {
		return fmt.Errorf("%w: transposed tiles", ErrUnsupported)
	}
	if len(h.MeshShape) == 0 {
		return fmt.Errorf("%w: empty mesh shape", ErrFormat)
	}
	devices := uint64(1)
	for _, d := range h.MeshShape {
		if d == 0 {
			return fmt.Errorf("%w: mesh shape %v has a zero dimension", ErrFormat, h.MeshShape)
		}
		if devices *= uint64(d); devices > maxDevices {
			return fmt.Errorf("%w: mesh shape %v is too large", ErrFormat, h.MeshShape)
		}
	}
	if len(h.Shards) == 0 {
		return fmt.Errorf("%w: no shards", ErrFormat)
	}
	seen := map[string]bool{}
	for i, s := range h.Shards {
		if len(s.Coord) != len(h.MeshShape) {
			return fmt.Errorf("%w: shard %d: coordinate %v for mesh %v", ErrFormat, i, s.Coord, h.MeshShape)
		}
		for k, c := range s.Coord {
			if c >= h.MeshShape[k] {
				return fmt.Errorf("%w: shard %d: coordinate %v outside mesh %v", ErrFormat, i, s.Coord, h.MeshShape)
			}
		}
		key := fmt.Sprint(s.Coord)
		if seen[key] {
			return fmt.Errorf("%w: shard %d: coordinate %v listed twice", ErrFormat, i, s.Coord)
		}
		seen[key] = true
		// Every shard this package reads is a full copy: sharded
		// placements would split the payload, which Check does not model.
		if s.Size != uint64(want) {
			return fmt.Errorf("%w: shard %d at %v holds %d bytes, the spec (%v %s %s) needs %d", ErrShape, i, s.Coord, s.Size, h.Spec.Shape, h.Spec.DType, h.Spec.Layout, want)
		}
		if s.Offset > dataSize || s.Size > dataSize-s.Offset {
			return fmt.Errorf("%w: shard %d: bytes [%d, %d) past the data region of %d bytes", ErrFormat, i, s.Offset, s.Offset+s.Size, dataSize)
		}
	}
	if t := h.Topology; t != nil {
		if len(t.Placements) != len(t.DistributionShape) {
			return fmt.Errorf("%w: topology: %d placements for distribution shape %v", ErrFormat, len(t.Placements), t.DistributionShape)
		}
		n := uint64(1)
		for _, d := range t.DistributionShape {
			if n *= uint64(d); n > maxDevices {
				return fmt.Errorf("%w: topology: distribution shape %v too large", ErrFormat, t.DistributionShape)
			}
		}
		if uint64(len(t.MeshCoords)) != n {
			return fmt.Errorf("%w: topology: %d mesh coordinates for distribution shape %v", ErrFormat, len(t.MeshCoords), t.DistributionShape)
		}
		for _, p := range t.Placements {
			if p.Kind == ShardDim {
				return fmt.Errorf("%w: topology shards tensor dim %d; only replicated tensors are read", ErrUnsupported, p.Dim)
			}
		}
		listed := map[string]bool{}
		for _, c := range t.MeshCoords {
			listed[fmt.Sprint(c)] = true
		}
		for _, s := range h.Shards {
			if !listed[fmt.Sprint(s.Coord)] {
				return fmt.Errorf("%w: topology does not list shard coordinate %v", ErrFormat, s.Coord)
			}
		}
	}
	return nil
}

// File is a tensor file's header as read: the decoded flatbuffer and the
// positions of its parts.
type File struct {
	Header
	// HeaderSize is the stored header_size: the flatbuffer and its
	// padding.
	HeaderSize uint64
	// DataStart is the file offset of the data region (8 + HeaderSize).
	DataStart int64
	// Size is the file size.
	Size int64
	// PayloadSize is the spec's payload size, the size of every buffer.
	PayloadSize int64
}

// Aligned reports whether the data region and every buffer start on a
// DataAlign boundary (ttnn loads files aligned to 8; 64 spares it a staged
// copy).
func (f *File) Aligned() bool {
	if f.DataStart%DataAlign != 0 {
		return false
	}
	for _, s := range f.Shards {
		if s.Offset%DataAlign != 0 {
			return false
		}
	}
	return true
}

// ReadHeader reads and checks the header of a tensor file of size bytes:
// the header length, the flatbuffer (VerifyFlatBuffer over exactly
// header_size bytes, as ttnn's loader does), an 8-aligned data region, and
// the header's meaning (Header.Check) against the data region's size.
func ReadHeader(r io.ReaderAt, size int64) (*File, error) {
	f, err := ReadHeaderRaw(r, size)
	if err != nil {
		return nil, err
	}
	if err := f.Check(uint64(size - f.DataStart)); err != nil {
		return nil, err
	}
	if f.PayloadSize, err = f.Spec.PayloadSize(); err != nil {
		return nil, err
	}
	return f, nil
}

// ReadHeaderRaw reads a tensor file's header as far as the loader does
// before using it (header length, flatbuffer verification, 8-aligned data
// region) without checking its meaning, so that a tool can show a header
// whose payload does not fit it. PayloadSize is set when the spec allows.
func ReadHeaderRaw(r io.ReaderAt, size int64) (*File, error) {
	if size < 8 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the 8-byte header length", ErrFormat, size)
	}
	var lb [8]byte
	if _, err := r.ReadAt(lb[:], 0); err != nil {
		return nil, err
	}
	hs := binary.LittleEndian.Uint64(lb[:])
	if hs >= maxFlatBuffer || int64(hs) > size-8 {
		return nil, fmt.Errorf("%w: header_size %d for a file of %d bytes", ErrFormat, hs, size)
	}
	fb := make([]byte, hs)
	if _, err := r.ReadAt(fb, 8); err != nil {
		return nil, err
	}
	h, err := parseFlatBuffer(fb)
	if err != nil {
		return nil, err
	}
	f := &File{Header: *h, HeaderSize: hs, DataStart: 8 + int64(hs), Size: size}
	if f.DataStart%8 != 0 {
		return nil, fmt.Errorf("%w: data region at file offset %d is not 8-aligned (ttnn refuses it)", ErrFormat, f.DataStart)
	}
	f.PayloadSize, _ = f.Spec.PayloadSize()
	return f, nil
}

// Parse reads a whole tensor file held in memory and returns its header and
// the first shard's buffer (every shard of a replicated file holds the same
// bytes; Parse checks that they do).
func Parse(data []byte) (*File, []byte, error) {
	r := bytes.NewReader(data)
	f, err := ReadHeader(r, int64(len(data)))
	if err != nil {
		return nil, nil, err
	}
	first := f.Shards[0]
	payload := data[f.DataStart+int64(first.Offset):][:first.Size]
	for i, s := range f.Shards[1:] {
		if s.Offset == first.Offset {
			continue // the same bytes
		}
		b := data[f.DataStart+int64(s.Offset):][:s.Size]
		if !bytes.Equal(b, payload) {
			return nil, nil, fmt.Errorf("%w: shard %d differs from shard 0 in a replicated tensor", ErrFormat, i+1)
		}
	}
	return f, payload, nil
}
