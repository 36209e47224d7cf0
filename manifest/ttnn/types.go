package ttnn

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ttquant/ttquant/bfp"
)

// Sentinel errors; every error of this package about a file's contents or a
// tensor's geometry wraps one of them.
var (
	// ErrFormat: bytes that are not a well-formed .tensorbin (header length,
	// flatbuffer structure, required fields, alignment, payload size).
	ErrFormat = errors.New("not a valid ttnn tensor file")
	// ErrUnsupported: a well-formed file or a request using a feature this
	// package does not handle (a sharded memory config, an unknown data type).
	ErrUnsupported = errors.New("unsupported ttnn tensor feature")
	// ErrShape: a shape ttnn cannot lay out as asked (a rank below 2 in TILE
	// layout, a zero or too large dimension, a payload of the wrong size).
	ErrShape = errors.New("shape ttnn cannot lay out")
)

// DataType is a ttnn data type. The zero value is invalid.
type DataType int

// Data types; Wire gives the value stored in the file.
const (
	BFloat16 DataType = iota + 1
	Float32
	UInt32
	BFloat8B
	BFloat4B
	UInt8
	UInt16
	Int32
)

var dataTypeNames = [...]string{"", "BFLOAT16", "FLOAT32", "UINT32", "BFLOAT8_B", "BFLOAT4_B", "UINT8", "UINT16", "INT32"}

// Valid reports whether d is one of the defined data types.
func (d DataType) Valid() bool { return d >= BFloat16 && d <= Int32 }

// String returns the ttnn enum name (BFLOAT8_B, ...), as used in as_tensor
// cache file names.
func (d DataType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DataType(%d)", int(d))
	}
	return dataTypeNames[d]
}

// Wire returns the flatbuffer enum value (BFloat16 = 0 ... Int32 = 7).
func (d DataType) Wire() uint8 { return uint8(d - 1) }

func dataTypeFromWire(v uint8) (DataType, bool) {
	d := DataType(v) + 1
	return d, d.Valid()
}

// ParseDataType parses a ttnn data type name.
func ParseDataType(s string) (DataType, error) {
	for i, n := range dataTypeNames {
		if i > 0 && strings.EqualFold(s, n) {
			return DataType(i), nil
		}
	}
	return 0, fmt.Errorf("ttnn: unknown data type %q (want one of %s)", s, strings.Join(dataTypeNames[1:], ", "))
}

// BFP returns the block floating point format of BFloat8B and BFloat4B.
func (d DataType) BFP() (bfp.Format, bool) {
	switch d {
	case BFloat8B:
		return bfp.BFP8, true
	case BFloat4B:
		return bfp.BFP4, true
	}
	return 0, false
}

// ElementSize returns the bytes per element of a non-BFP data type (0 for
// BFP types).
func (d DataType) ElementSize() int {
	switch d {
	case BFloat16, UInt16:
		return 2
	case Float32, UInt32, Int32:
		return 4
	case UInt8:
		return 1
	}
	return 0
}

// Layout is a ttnn tensor layout. The zero value is invalid.
type Layout int

// Layouts. Their values are the flatbuffer PageConfig union types.
const (
	RowMajor   Layout = 1
	TileLayout Layout = 2
)

// String returns the ttnn enum name (ROW_MAJOR or TILE).
func (l Layout) String() string {
	switch l {
	case RowMajor:
		return "ROW_MAJOR"
	case TileLayout:
		return "TILE"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// ParseLayout parses ROW_MAJOR or TILE.
func ParseLayout(s string) (Layout, error) {
	switch strings.ToUpper(s) {
	case "ROW_MAJOR":
		return RowMajor, nil
	case "TILE":
		return TileLayout, nil
	}
	return 0, fmt.Errorf("ttnn: unknown layout %q (want TILE or ROW_MAJOR)", s)
}

// BufferType is where a tensor is placed on the device. The zero value is
// invalid.
type BufferType int

// Buffer types; Wire gives the stored value.
const (
	DRAM BufferType = iota + 1
	L1
	SystemMemory
	L1Small
	Trace
)

var bufferTypeNames = [...]string{"", "DRAM", "L1", "SYSTEM_MEMORY", "L1_SMALL", "TRACE"}

func (b BufferType) String() string {
	if b < DRAM || b > Trace {
		return fmt.Sprintf("BufferType(%d)", int(b))
	}
	return bufferTypeNames[b]
}

// Wire returns the flatbuffer enum value.
func (b BufferType) Wire() uint16 { return uint16(b - 1) }

// MemoryLayout is a ttnn tensor memory layout. The zero value is invalid.
type MemoryLayout int

// Memory layouts; Wire gives the stored value.
const (
	Interleaved MemoryLayout = iota + 1
	HeightSharded
	WidthSharded
	BlockSharded
)

func (m MemoryLayout) String() string {
	switch m {
	case Interleaved:
		return "INTERLEAVED"
	case HeightSharded:
		return "HEIGHT_SHARDED"
	case WidthSharded:
		return "WIDTH_SHARDED"
	case BlockSharded:
		return "BLOCK_SHARDED"
	}
	return fmt.Sprintf("MemoryLayout(%d)", int(m))
}

// Wire returns the flatbuffer enum value (Interleaved 0, HeightSharded 2,
// WidthSharded 3, BlockSharded 4; 1 was the removed SingleBank).
func (m MemoryLayout) Wire() uint16 {
	if m == Interleaved {
		return 0
	}
	return uint16(m)
}

func memoryLayoutFromWire(v uint16) (MemoryLayout, bool) {
	switch v {
	case 0:
		return Interleaved, true
	case 2, 3, 4:
		return MemoryLayout(v), true
	}
	return 0, false
}

// MemoryConfig is the device placement stored in the file; ttnn moves the
// loaded tensor to the device with it, whatever the caller asks for.
type MemoryConfig struct {
	Layout MemoryLayout
	Buffer BufferType
	// Sharded is set by the reader when the file carries a shard spec; this
	// package does not write or interpret one.
	Sharded bool
}

// DRAMInterleaved is ttnn's default memory config.
var DRAMInterleaved = MemoryConfig{Layout: Interleaved, Buffer: DRAM}

// L1Interleaved places the tensor interleaved over the L1 banks.
var L1Interleaved = MemoryConfig{Layout: Interleaved, Buffer: L1}

// String returns a short name such as dram-interleaved.
func (m MemoryConfig) String() string {
	s := strings.ToLower(strings.ReplaceAll(m.Buffer.String(), "_", "-") + "-" + strings.ReplaceAll(m.Layout.String(), "_", "-"))
	if m.Sharded {
		s += "+shard-spec"
	}
	return s
}

// ParseMemoryConfig parses the memory configs this package writes:
// dram-interleaved and l1-interleaved.
func ParseMemoryConfig(s string) (MemoryConfig, error) {
	switch strings.ToLower(s) {
	case "dram-interleaved", "dram":
		return DRAMInterleaved, nil
	case "l1-interleaved", "l1":
		return L1Interleaved, nil
	}
	return MemoryConfig{}, fmt.Errorf("ttnn: memory config %q not supported (want dram-interleaved or l1-interleaved; sharded configs need a shard spec this exporter does not write)", s)
}

// Spec is a ttnn TensorSpec: the logical shape and the layout.
type Spec struct {
	// Shape is the logical shape (any rank ≥ 1).
	Shape []uint32
	DType DataType
	// Layout is TILE or ROW_MAJOR.
	Layout Layout
	// Tile is the tile shape of a TILE tensor (zero for ROW_MAJOR).
	Tile bfp.Tile
	// TransposeTile is the Tile table's transpose flag (always false in
	// files this package writes).
	TransposeTile bool
	Memory        MemoryConfig
	// Alignment is the stored alignment vector; empty means ttnn's default
	// ([tile H, tile W] for TILE, [1] for ROW_MAJOR).
	Alignment []uint32
}

// PlacementKind is how a tensor dimension is laid over a mesh dimension.
type PlacementKind int

// Placement kinds.
const (
	Replicate PlacementKind = iota + 1
	ShardDim
)

func (p PlacementKind) String() string {
	switch p {
	case Replicate:
		return "replicate"
	case ShardDim:
		return "shard"
	}
	return fmt.Sprintf("PlacementKind(%d)", int(p))
}

// MarshalText gives the kind's name (replicate or shard).
func (p PlacementKind) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText parses replicate or shard.
func (p *PlacementKind) UnmarshalText(b []byte) error {
	switch string(b) {
	case "replicate":
		*p = Replicate
	case "shard":
		*p = ShardDim
	default:
		return fmt.Errorf("ttnn: unknown placement %q (want replicate or shard)", b)
	}
	return nil
}

// Placement is one entry of a topology's placements.
type Placement struct {
	Kind PlacementKind `json:"kind"`
	// Dim is the tensor dimension sharded (ShardDim only).
	Dim int32 `json:"dim,omitempty"`
}

// Topology is the tensor topology: how the tensor is distributed.
type Topology struct {
	DistributionShape []uint32    `json:"distribution_shape"`
	Placements        []Placement `json:"placements"`
	MeshCoords        [][]uint32  `json:"mesh_coords"`
}

// Shard is one device's buffer: a byte range of the data region.
type Shard struct {
	// Offset is relative to the start of the data region; Size in bytes.
	Offset uint64   `json:"offset"`
	Size   uint64   `json:"size"`
	Coord  []uint32 `json:"mesh_coordinate"`
}

// Header is the decoded flatbuffer of a tensor file.
type Header struct {
	Spec      Spec
	MeshShape []uint32
	Shards    []Shard
	// Topology is nil when the file has none (ttnn then treats the tensor
	// as replicated over MeshShape).
	Topology *Topology
}
