package ttnn

import (
	"encoding/binary"
	"fmt"
	"math"

	flatbuffers "github.com/google/flatbuffers/go"
)

// Vtable slots of the tables in tensor.fbs.
const (
	slotTensorSpec     = 0
	slotTensorMesh     = 1
	slotTensorShards   = 2
	slotTensorTopology = 3

	slotSpecShape  = 0
	slotSpecLayout = 1

	slotLayoutDType    = 0
	slotLayoutPageType = 1
	slotLayoutPage     = 2
	slotLayoutMemory   = 3
	slotLayoutAlign    = 4

	slotTilePageTile = 0
	slotTileH        = 0
	slotTileW        = 1
	slotTileT        = 2

	slotMemLayout = 0
	slotMemBuffer = 1
	slotMemShard  = 2
	slotMemND     = 3
	slotMemNDFlag = 4

	slotMeshDims = 0
	slotCoordVal = 0

	slotShardBufType = 0
	slotShardBuf     = 1
	slotShardCoord   = 2

	slotTopoShape  = 0
	slotTopoPlace  = 1
	slotTopoCoords = 2

	slotPlaceType = 0
	slotPlaceDim  = 1
)

// Union type values.
const (
	pageRowMajor      = 1
	pageTile          = 2
	bufferInlineFile  = 1
	inlineStorageSize = 16
)

// maxFlatBuffer is the largest flatbuffer the flatbuffers verifier accepts
// (FLATBUFFERS_MAX_BUFFER_SIZE, 2^31 − 1 bytes).
const maxFlatBuffer = math.MaxInt32

// buildFlatBuffer encodes h as the flatbuffer of a tensor file. Fields at
// their default value are omitted, as flatbuffers builders do.
func buildFlatBuffer(h *Header) []byte {
	w := fbWriter{flatbuffers.NewBuilder(512)}
	b := w.b
	// The tables are built bottom-up, in this order, as the bytes of the
	// format's reference writer are.
	spec := w.spec(&h.Spec)
	mesh := w.meshShape(h.MeshShape)
	shardVec := w.shards(h.Shards)
	var topo flatbuffers.UOffsetT
	if t := h.Topology; t != nil {
		topo = w.topology(t)
	}
	b.StartObject(4)
	b.PrependUOffsetTSlot(slotTensorSpec, spec, 0)
	b.PrependUOffsetTSlot(slotTensorMesh, mesh, 0)
	b.PrependUOffsetTSlot(slotTensorShards, shardVec, 0)
	if topo != 0 {
		b.PrependUOffsetTSlot(slotTensorTopology, topo, 0)
	}
	root := b.EndObject()
	b.Finish(root)
	return b.FinishedBytes()
}

// fbWriter builds the tables of a tensor header into one flatbuffer.
type fbWriter struct{ b *flatbuffers.Builder }

func (w fbWriter) u32s(v []uint32) flatbuffers.UOffsetT {
	b := w.b
	b.StartVector(4, len(v), 4)
	for i := len(v) - 1; i >= 0; i-- {
		b.PrependUint32(v[i])
	}
	return b.EndVector(len(v))
}

func (w fbWriter) coord(v []uint32) flatbuffers.UOffsetT {
	vals := w.u32s(v)
	w.b.StartObject(1)
	w.b.PrependUOffsetTSlot(slotCoordVal, vals, 0)
	return w.b.EndObject()
}

func (w fbWriter) meshShape(v []uint32) flatbuffers.UOffsetT {
	dims := w.u32s(v)
	w.b.StartObject(1)
	w.b.PrependUOffsetTSlot(slotMeshDims, dims, 0)
	return w.b.EndObject()
}

func (w fbWriter) offsets(v []flatbuffers.UOffsetT) flatbuffers.UOffsetT {
	b := w.b
	b.StartVector(4, len(v), 4)
	for i := len(v) - 1; i >= 0; i-- {
		b.PrependUOffsetT(v[i])
	}
	return b.EndVector(len(v))
}

// spec is the tensor spec: shape and layout (dtype, page, memory,
// alignment).
func (w fbWriter) spec(s *Spec) flatbuffers.UOffsetT {
	b := w.b
	shape := w.u32s(s.Shape)
	align := w.u32s(s.Alignment)
	b.StartObject(2)
	b.PrependUint16Slot(slotMemLayout, s.Memory.Layout.Wire(), 0)
	b.PrependUint16Slot(slotMemBuffer, s.Memory.Buffer.Wire(), 0)
	mem := b.EndObject()
	var page flatbuffers.UOffsetT
	if s.Layout == TileLayout {
		b.StartObject(3)
		b.PrependUint32Slot(slotTileH, uint32(s.Tile.H), 0)
		b.PrependUint32Slot(slotTileW, uint32(s.Tile.W), 0)
		b.PrependBoolSlot(slotTileT, s.TransposeTile, false)
		tile := b.EndObject()
		b.StartObject(1)
		b.PrependUOffsetTSlot(slotTilePageTile, tile, 0)
		page = b.EndObject()
	} else {
		b.StartObject(0)
		page = b.EndObject()
	}
	b.StartObject(5)
	b.PrependByteSlot(slotLayoutDType, s.DType.Wire(), 0)
	b.PrependByteSlot(slotLayoutPageType, byte(s.Layout), 0)
	b.PrependUOffsetTSlot(slotLayoutPage, page, 0)
	b.PrependUOffsetTSlot(slotLayoutMemory, mem, 0)
	b.PrependUOffsetTSlot(slotLayoutAlign, align, 0)
	layout := b.EndObject()
	b.StartObject(2)
	b.PrependUOffsetTSlot(slotSpecShape, shape, 0)
	b.PrependUOffsetTSlot(slotSpecLayout, layout, 0)
	return b.EndObject()
}

// shards is the vector of shards, each with its coordinate and its inline
// file storage.
func (w fbWriter) shards(shs []Shard) flatbuffers.UOffsetT {
	b := w.b
	out := make([]flatbuffers.UOffsetT, len(shs))
	for i, sh := range shs {
		c := w.coord(sh.Coord)
		// InlineFileStorage is a struct referenced by the union offset:
		// 16 bytes, 8-aligned, fields prepended last first.
		b.Prep(8, inlineStorageSize)
		b.PrependUint64(sh.Size)
		b.PrependUint64(sh.Offset)
		st := b.Offset()
		b.StartObject(3)
		b.PrependByteSlot(slotShardBufType, bufferInlineFile, 0)
		b.PrependUOffsetTSlot(slotShardBuf, st, 0)
		b.PrependUOffsetTSlot(slotShardCoord, c, 0)
		out[i] = b.EndObject()
	}
	return w.offsets(out)
}

// topology is the distribution: its shape, placements and mesh
// coordinates.
func (w fbWriter) topology(t *Topology) flatbuffers.UOffsetT {
	b := w.b
	dist := w.meshShape(t.DistributionShape)
	places := make([]flatbuffers.UOffsetT, len(t.Placements))
	for i, p := range t.Placements {
		b.StartObject(2)
		if p.Kind == ShardDim {
			b.PrependByteSlot(slotPlaceType, 1, 0)
			b.PrependInt32Slot(slotPlaceDim, p.Dim, 0)
		}
		places[i] = b.EndObject()
	}
	placeVec := w.offsets(places)
	coords := make([]flatbuffers.UOffsetT, len(t.MeshCoords))
	for i, c := range t.MeshCoords {
		coords[i] = w.coord(c)
	}
	coordVec := w.offsets(coords)
	b.StartObject(3)
	b.PrependUOffsetTSlot(slotTopoShape, dist, 0)
	b.PrependUOffsetTSlot(slotTopoPlace, placeVec, 0)
	b.PrependUOffsetTSlot(slotTopoCoords, coordVec, 0)
	return b.EndObject()
}

// The verifier. It applies the rules of the flatbuffers verifier to a
// Tensor buffer: the root offset and every table, vtable, vector and struct
// lie inside the buffer and are aligned to their size relative to its start
// (check_alignment on), offsets are positive, vtables are well formed,
// required fields are present, union types are known, and nesting and table
// counts stay within the verifier's default limits. Only after Verify
// succeeds do the accessors below read the buffer.

const (
	maxDepth  = 64
	maxTables = 1000000
)

type verifier struct {
	buf    []byte
	depth  int
	tables int
}

type fbTable struct {
	pos, vt, vsize, tsize int
	name                  string
}

func (v *verifier) errf(format string, args ...any) error {
	return fmt.Errorf("%w: flatbuffer: %s", ErrFormat, fmt.Sprintf(format, args...))
}

func (v *verifier) in(pos, n int) bool {
	return pos >= 0 && n >= 0 && pos <= len(v.buf) && n <= len(v.buf)-pos
}

func (v *verifier) u16(pos int) int { return int(binary.LittleEndian.Uint16(v.buf[pos:])) }
func (v *verifier) u32(pos int) uint32 {
	return binary.LittleEndian.Uint32(v.buf[pos:])
}

// table checks the table at pos and its vtable.
func (v *verifier) table(pos int, name string) (fbTable, error) {
	if v.depth++; v.depth > maxDepth {
		return fbTable{}, v.errf("%s: nesting deeper than %d", name, maxDepth)
	}
	if v.tables++; v.tables > maxTables {
		return fbTable{}, v.errf("more than %d tables", maxTables)
	}
	if pos%4 != 0 || !v.in(pos, 4) {
		return fbTable{}, v.errf("%s at %d: table offset out of bounds or not 4-aligned", name, pos)
	}
	vt := pos - int(int32(v.u32(pos)))
	if vt%2 != 0 || !v.in(vt, 4) {
		return fbTable{}, v.errf("%s at %d: vtable at %d out of bounds or not 2-aligned", name, pos, vt)
	}
	vsize, tsize := v.u16(vt), v.u16(vt+2)
	if vsize < 4 || vsize%2 != 0 || !v.in(vt, vsize) {
		return fbTable{}, v.errf("%s at %d: bad vtable size %d", name, pos, vsize)
	}
	if tsize < 4 || !v.in(pos, tsize) {
		return fbTable{}, v.errf("%s at %d: table size %d out of bounds", name, pos, tsize)
	}
	return fbTable{pos: pos, vt: vt, vsize: vsize, tsize: tsize, name: name}, nil
}

func (v *verifier) leave() { v.depth-- }

// field returns the offset of a field within the table, 0 when absent.
func (v *verifier) field(t fbTable, slot int) int {
	e := 4 + 2*slot
	if e+2 > t.vsize {
		return 0
	}
	return v.u16(t.vt + e)
}

// scalar checks a scalar field of size n; ok is false when it is absent.
func (v *verifier) scalar(t fbTable, slot, n int, what string) (pos int, ok bool, err error) {
	off := v.field(t, slot)
	if off == 0 {
		return 0, false, nil
	}
	pos = t.pos + off
	if off+n > t.tsize || pos%n != 0 || !v.in(pos, n) {
		return 0, false, v.errf("%s.%s: field out of its table or misaligned", t.name, what)
	}
	return pos, true, nil
}

// ref checks an offset field and returns its target.
func (v *verifier) ref(t fbTable, slot int, what string, required bool) (int, bool, error) {
	pos, ok, err := v.scalar(t, slot, 4, what)
	if err != nil {
		return 0, false, err
	}
	if !ok {
		if required {
			return 0, false, v.errf("%s: required field %s missing", t.name, what)
		}
		return 0, false, nil
	}
	o := v.u32(pos)
	if o == 0 || o > math.MaxInt32 {
		return 0, false, v.errf("%s.%s: bad offset %d", t.name, what, o)
	}
	target := pos + int(o)
	if !v.in(target, 1) {
		return 0, false, v.errf("%s.%s: offset points outside the buffer", t.name, what)
	}
	return target, true, nil
}

// vector checks a vector of n-byte elements at pos and returns its length.
func (v *verifier) vector(pos, elem int, what string) (int, error) {
	if pos%4 != 0 || !v.in(pos, 4) {
		return 0, v.errf("%s: vector length out of bounds or not 4-aligned", what)
	}
	n := int(v.u32(pos))
	if n > (len(v.buf)-pos-4)/elem {
		return 0, v.errf("%s: vector of %d elements runs past the buffer", what, n)
	}
	return n, nil
}

// u32Vector checks an optional or required [uint32] field.
func (v *verifier) u32Vector(t fbTable, slot int, what string, required bool) error {
	p, ok, err := v.ref(t, slot, what, required)
	if err != nil || !ok {
		return err
	}
	_, err = v.vector(p, 4, t.name+"."+what)
	return err
}

// tableVector checks a vector of tables, each with check.
func (v *verifier) tableVector(t fbTable, slot int, what string, required bool, check func(pos int) error) error {
	p, ok, err := v.ref(t, slot, what, required)
	if err != nil || !ok {
		return err
	}
	n, err := v.vector(p, 4, t.name+"."+what)
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		e := p + 4 + 4*i
		o := v.u32(e)
		if o == 0 || o > math.MaxInt32 || !v.in(e+int(o), 1) {
			return v.errf("%s.%s[%d]: bad offset", t.name, what, i)
		}
		if err := check(e + int(o)); err != nil {
			return err
		}
	}
	return nil
}

// subTable checks an optional or required table field with check.
func (v *verifier) subTable(t fbTable, slot int, what string, required bool, check func(pos int) error) error {
	p, ok, err := v.ref(t, slot, what, required)
	if err != nil || !ok {
		return err
	}
	return check(p)
}

func (v *verifier) tensor(pos int) error {
	t, err := v.table(pos, "Tensor")
	if err != nil {
		return err
	}
	defer v.leave()
	if err := v.subTable(t, slotTensorSpec, "tensor_spec", true, v.spec); err != nil {
		return err
	}
	if err := v.subTable(t, slotTensorMesh, "mesh_shape", true, v.meshShape("MeshShape")); err != nil {
		return err
	}
	if err := v.tableVector(t, slotTensorShards, "shards", true, v.shard); err != nil {
		return err
	}
	return v.subTable(t, slotTensorTopology, "tensor_topology", false, v.topology)
}

func (v *verifier) spec(pos int) error {
	t, err := v.table(pos, "TensorSpec")
	if err != nil {
		return err
	}
	defer v.leave()
	if err := v.u32Vector(t, slotSpecShape, "shape", true); err != nil {
		return err
	}
	return v.subTable(t, slotSpecLayout, "tensor_layout", true, v.layout)
}

func (v *verifier) layout(pos int) error {
	t, err := v.table(pos, "TensorLayout")
	if err != nil {
		return err
	}
	defer v.leave()
	if _, _, err := v.scalar(t, slotLayoutDType, 1, "data_type"); err != nil {
		return err
	}
	pt, ok, err := v.scalar(t, slotLayoutPageType, 1, "page_config_type")
	if err != nil {
		return err
	}
	kind := 0
	if ok {
		kind = int(v.buf[pt])
	}
	switch kind {
	case pageRowMajor:
		err = v.subTable(t, slotLayoutPage, "page_config", true, v.emptyTable("RowMajorPageConfig"))
	case pageTile:
		err = v.subTable(t, slotLayoutPage, "page_config", true, v.tilePage)
	case 0:
		err = v.errf("TensorLayout: required field page_config missing")
	default:
		err = v.errf("TensorLayout: unknown page_config type %d", kind)
	}
	if err != nil {
		return err
	}
	if err := v.subTable(t, slotLayoutMemory, "memory_config", true, v.memory); err != nil {
		return err
	}
	return v.u32Vector(t, slotLayoutAlign, "alignment", true)
}

func (v *verifier) tilePage(pos int) error {
	t, err := v.table(pos, "TilePageConfig")
	if err != nil {
		return err
	}
	defer v.leave()
	return v.subTable(t, slotTilePageTile, "tile", true, func(pos int) error {
		t, err := v.table(pos, "Tile")
		if err != nil {
			return err
		}
		defer v.leave()
		for _, f := range []struct {
			slot, n int
			name    string
		}{{slotTileH, 4, "tile_shape_h"}, {slotTileW, 4, "tile_shape_w"}, {slotTileT, 1, "transpose_tile"}} {
			if _, _, err := v.scalar(t, f.slot, f.n, f.name); err != nil {
				return err
			}
		}
		return nil
	})
}

// emptyTable checks a table whose fields this schema does not list.
func (v *verifier) emptyTable(name string) func(int) error {
	return func(pos int) error {
		_, err := v.table(pos, name)
		v.leave()
		return err
	}
}

func (v *verifier) memory(pos int) error {
	t, err := v.table(pos, "MemoryConfig")
	if err != nil {
		return err
	}
	defer v.leave()
	if _, _, err := v.scalar(t, slotMemLayout, 2, "memory_layout"); err != nil {
		return err
	}
	if _, _, err := v.scalar(t, slotMemBuffer, 2, "buffer_type"); err != nil {
		return err
	}
	if err := v.subTable(t, slotMemShard, "shard_spec", false, v.emptyTable("ShardSpec")); err != nil {
		return err
	}
	if err := v.subTable(t, slotMemND, "nd_shard_spec", false, v.emptyTable("NdShardSpec")); err != nil {
		return err
	}
	_, _, err = v.scalar(t, slotMemNDFlag, 1, "created_with_nd_shard_spec")
	return err
}

func (v *verifier) meshShape(name string) func(int) error {
	return func(pos int) error {
		t, err := v.table(pos, name)
		if err != nil {
			return err
		}
		defer v.leave()
		return v.u32Vector(t, slotMeshDims, "dimensions", false)
	}
}

func (v *verifier) coord(pos int) error {
	t, err := v.table(pos, "MeshCoordinate")
	if err != nil {
		return err
	}
	defer v.leave()
	return v.u32Vector(t, slotCoordVal, "values", false)
}

func (v *verifier) shard(pos int) error {
	t, err := v.table(pos, "TensorShard")
	if err != nil {
		return err
	}
	defer v.leave()
	bt, ok, err := v.scalar(t, slotShardBufType, 1, "buffer_type")
	if err != nil {
		return err
	}
	if !ok || v.buf[bt] == 0 {
		return v.errf("TensorShard: required field buffer missing")
	}
	if v.buf[bt] != bufferInlineFile {
		return v.errf("TensorShard: buffer type %d (only InlineFileStorage, 1, is loadable)", v.buf[bt])
	}
	p, _, err := v.ref(t, slotShardBuf, "buffer", true)
	if err != nil {
		return err
	}
	if p%8 != 0 || !v.in(p, inlineStorageSize) {
		return v.errf("TensorShard.buffer: InlineFileStorage out of bounds or not 8-aligned")
	}
	return v.subTable(t, slotShardCoord, "mesh_coordinate", true, v.coord)
}

func (v *verifier) topology(pos int) error {
	t, err := v.table(pos, "TensorTopology")
	if err != nil {
		return err
	}
	defer v.leave()
	if err := v.subTable(t, slotTopoShape, "distribution_shape", false, v.meshShape("MeshShape")); err != nil {
		return err
	}
	if err := v.tableVector(t, slotTopoPlace, "placements", false, func(pos int) error {
		t, err := v.table(pos, "MeshMapperPlacement")
		if err != nil {
			return err
		}
		defer v.leave()
		if _, _, err := v.scalar(t, slotPlaceType, 1, "type"); err != nil {
			return err
		}
		_, _, err = v.scalar(t, slotPlaceDim, 4, "tensor_dim")
		return err
	}); err != nil {
		return err
	}
	return v.tableVector(t, slotTopoCoords, "mesh_coords", false, v.coord)
}

// VerifyFlatBuffer checks that fb is a well-formed Tensor flatbuffer by the
// rules of the flatbuffers verifier (bounds, alignment, vtables, required
// fields, union types). Trailing zero padding after the flatbuffer is
// allowed, as the upstream loader verifies exactly header_size bytes.
func VerifyFlatBuffer(fb []byte) error {
	v := &verifier{buf: fb}
	if len(fb) > maxFlatBuffer {
		return v.errf("%d bytes, more than the verifier's limit", len(fb))
	}
	if len(fb) < 8 {
		return v.errf("%d bytes, too short for a root table", len(fb))
	}
	root := int(v.u32(0))
	if root == 0 || root > math.MaxInt32 || !v.in(root, 4) {
		return v.errf("root offset %d out of bounds", root)
	}
	return v.tensor(root)
}

// The accessors: run only over verified buffers.

type acc struct{ t flatbuffers.Table }

func tableAt(buf []byte, pos flatbuffers.UOffsetT) acc {
	return acc{flatbuffers.Table{Bytes: buf, Pos: pos}}
}

func (a acc) off(slot int) flatbuffers.UOffsetT {
	return flatbuffers.UOffsetT(a.t.Offset(flatbuffers.VOffsetT(4 + 2*slot)))
}

func (a acc) has(slot int) bool { return a.off(slot) != 0 }

func (a acc) sub(slot int) (acc, bool) {
	o := a.off(slot)
	if o == 0 {
		return acc{}, false
	}
	return tableAt(a.t.Bytes, a.t.Indirect(a.t.Pos+o)), true
}

func (a acc) u8(slot int, def uint8) uint8 {
	if o := a.off(slot); o != 0 {
		return a.t.GetUint8(a.t.Pos + o)
	}
	return def
}

func (a acc) u16(slot int, def uint16) uint16 {
	if o := a.off(slot); o != 0 {
		return a.t.GetUint16(a.t.Pos + o)
	}
	return def
}

func (a acc) u32(slot int, def uint32) uint32 {
	if o := a.off(slot); o != 0 {
		return a.t.GetUint32(a.t.Pos + o)
	}
	return def
}

func (a acc) i32(slot int, def int32) int32 {
	if o := a.off(slot); o != 0 {
		return a.t.GetInt32(a.t.Pos + o)
	}
	return def
}

func (a acc) boolean(slot int) bool {
	if o := a.off(slot); o != 0 {
		return a.t.GetBool(a.t.Pos + o)
	}
	return false
}

func (a acc) u32s(slot int) []uint32 {
	o := a.off(slot)
	if o == 0 {
		return nil
	}
	n := a.t.VectorLen(o)
	start := a.t.Vector(o)
	out := make([]uint32, n)
	for i := range out {
		out[i] = a.t.GetUint32(start + flatbuffers.UOffsetT(4*i))
	}
	return out
}

func (a acc) tables(slot int) []acc {
	o := a.off(slot)
	if o == 0 {
		return nil
	}
	n := a.t.VectorLen(o)
	start := a.t.Vector(o)
	out := make([]acc, n)
	for i := range out {
		e := start + flatbuffers.UOffsetT(4*i)
		out[i] = tableAt(a.t.Bytes, a.t.Indirect(e))
	}
	return out
}

// parseFlatBuffer verifies fb and decodes it into a Header.
func parseFlatBuffer(fb []byte) (*Header, error) {
	if err := VerifyFlatBuffer(fb); err != nil {
		return nil, err
	}
	root := tableAt(fb, flatbuffers.GetUOffsetT(fb))
	h := &Header{}
	spec, _ := root.sub(slotTensorSpec)
	h.Spec.Shape = spec.u32s(slotSpecShape)
	lay, _ := spec.sub(slotSpecLayout)
	dt, ok := dataTypeFromWire(lay.u8(slotLayoutDType, 0))
	if !ok {
		return nil, fmt.Errorf("%w: data type %d", ErrUnsupported, lay.u8(slotLayoutDType, 0))
	}
	h.Spec.DType = dt
	page, _ := lay.sub(slotLayoutPage)
	switch lay.u8(slotLayoutPageType, 0) {
	case pageTile:
		h.Spec.Layout = TileLayout
		tile, _ := page.sub(slotTilePageTile)
		th, tw := tile.u32(slotTileH, 0), tile.u32(slotTileW, 0)
		if th > 1024 || tw > 1024 {
			return nil, fmt.Errorf("%w: tile %dx%d", ErrUnsupported, th, tw)
		}
		h.Spec.Tile.H, h.Spec.Tile.W = int(th), int(tw)
		h.Spec.TransposeTile = tile.boolean(slotTileT)
	default:
		h.Spec.Layout = RowMajor
	}
	mem, _ := lay.sub(slotLayoutMemory)
	ml, ok := memoryLayoutFromWire(mem.u16(slotMemLayout, 0))
	if !ok {
		return nil, fmt.Errorf("%w: memory layout %d", ErrUnsupported, mem.u16(slotMemLayout, 0))
	}
	bt := mem.u16(slotMemBuffer, 0)
	if bt > 4 {
		return nil, fmt.Errorf("%w: buffer type %d", ErrUnsupported, bt)
	}
	h.Spec.Memory = MemoryConfig{Layout: ml, Buffer: BufferType(bt) + 1,
		Sharded: mem.has(slotMemShard) || mem.has(slotMemND)}
	h.Spec.Alignment = lay.u32s(slotLayoutAlign)

	mesh, _ := root.sub(slotTensorMesh)
	h.MeshShape = mesh.u32s(slotMeshDims)
	for _, s := range root.tables(slotTensorShards) {
		st := s.t.Indirect(s.t.Pos + s.off(slotShardBuf))
		c, _ := s.sub(slotShardCoord)
		h.Shards = append(h.Shards, Shard{
			Offset: s.t.GetUint64(st),
			Size:   s.t.GetUint64(st + 8),
			Coord:  c.u32s(slotCoordVal),
		})
	}
	if topo, ok := root.sub(slotTensorTopology); ok {
		t := &Topology{}
		if d, ok := topo.sub(slotTopoShape); ok {
			t.DistributionShape = d.u32s(slotMeshDims)
		}
		for _, p := range topo.tables(slotTopoPlace) {
			kind := Replicate
			switch p.u8(slotPlaceType, 0) {
			case 0:
			case 1:
				kind = ShardDim
			default:
				return nil, fmt.Errorf("%w: placement type %d", ErrUnsupported, p.u8(slotPlaceType, 0))
			}
			t.Placements = append(t.Placements, Placement{Kind: kind, Dim: p.i32(slotPlaceDim, 0)})
		}
		for _, c := range topo.tables(slotTopoCoords) {
			t.MeshCoords = append(t.MeshCoords, c.u32s(slotCoordVal))
		}
		h.Topology = t
	}
	return h, nil
}
