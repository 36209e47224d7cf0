package ttnn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"
	"github.com/google/go-cmp/cmp"

	"github.com/ttquant/ttquant/bfp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// goldenValues returns deterministic values for a rows×cols matrix: a
// spread of magnitudes and signs, with some exact zeros and one outlier per
// 16-value group, so that exponents and mantissas both vary.
func goldenValues(rows, cols int) []float32 {
	v := make([]float32, rows*cols)
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			i := r*cols + c
			x := float32(math.Sin(float64(i)*0.37)) * float32(math.Ldexp(1, (r%7)-3))
			if i%11 == 0 {
				x = 0
			}
			if c%16 == 5 {
				x *= 9
			}
			v[i] = x
		}
	}
	return v
}

// goldenBFP is how the golden files are made (see testdata/README.md): a
// 2-D matrix packed by bfp.Pack in the given format with 32×32 tiles, its
// shape not a multiple of the tile so that padding is exercised, written by
// Marshal for a 1×1 mesh in DRAM interleaved.
func goldenBFP(t *testing.T, f bfp.Format, dt DataType, rows, cols int) []byte {
	t.Helper()
	packed, err := bfp.Pack(f, bfp.Tile32x32, goldenValues(rows, cols), rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Shape: []uint32{uint32(rows), uint32(cols)}, DType: dt, Layout: TileLayout, Tile: bfp.Tile32x32, Memory: DRAMInterleaved}
	b, err := Marshal(spec, nil, packed)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGoldenFiles(t *testing.T) {
	for _, g := range []struct {
		name       string
		f          bfp.Format
		dt         DataType
		rows, cols int
	}{
		{"golden_bfp8_40x48_dtype_BFLOAT8_B_layout_TILE.tensorbin", bfp.BFP8, BFloat8B, 40, 48},
		{"golden_bfp4_40x48_dtype_BFLOAT4_B_layout_TILE.tensorbin", bfp.BFP4, BFloat4B, 40, 48},
	} {
		t.Run(g.name, func(t *testing.T) {
			got := goldenBFP(t, g.f, g.dt, g.rows, g.cols)
			path := filepath.Join("testdata", g.name)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: written bytes differ from the golden file (%d vs %d bytes)", path, len(got), len(want))
			}
			f, payload, err := Parse(want)
			if err != nil {
				t.Fatal(err)
			}
			if f.DataStart%DataAlign != 0 || !f.Aligned() {
				t.Errorf("data region at %d not %d-aligned", f.DataStart, DataAlign)
			}
			// 2×2 tiles (40×48 padded to 64×64).
			if want := 4 * bfp.TileBytes(g.f, bfp.Tile32x32); len(payload) != want {
				t.Errorf("payload %d bytes, want %d", len(payload), want)
			}
			vals, err := bfp.Unpack(g.f, bfp.Tile32x32, payload, g.rows, g.cols)
			if err != nil {
				t.Fatal(err)
			}
			q, _ := bfp.Quantize(g.f, bfp.Tile32x32, goldenValues(g.rows, g.cols), g.rows, g.cols)
			if !slices.Equal(vals, q) {
				t.Error("golden payload does not decode to the quantized values")
			}
		})
	}
}

func testSpecs() []Spec {
	return []Spec{
		{Shape: []uint32{64, 96}, DType: BFloat8B, Layout: TileLayout, Tile: bfp.Tile32x32, Memory: DRAMInterleaved},
		{Shape: []uint32{3, 40, 70}, DType: BFloat4B, Layout: TileLayout, Tile: bfp.Tile32x32, Memory: L1Interleaved},
		{Shape: []uint32{1, 2, 16, 48}, DType: BFloat8B, Layout: TileLayout, Tile: bfp.Tile16x32, Memory: DRAMInterleaved},
		{Shape: []uint32{5, 33}, DType: BFloat16, Layout: TileLayout, Tile: bfp.Tile32x32, Memory: DRAMInterleaved},
		{Shape: []uint32{7}, DType: BFloat16, Layout: RowMajor, Memory: DRAMInterleaved},
		{Shape: []uint32{4, 1, 3}, DType: Float32, Layout: RowMajor, Memory: L1Interleaved},
		{Shape: []uint32{9, 17}, DType: Float32, Layout: TileLayout, Tile: bfp.Tile32x16, Memory: DRAMInterleaved},
		{Shape: []uint32{6}, DType: UInt32, Layout: RowMajor, Memory: DRAMInterleaved},
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	for _, mesh := range [][]uint32{nil, {1, 1}, {2, 4}, {8}} {
		for _, spec := range testSpecs() {
			n, err := spec.PayloadSize()
			if err != nil {
				t.Fatalf("%v: %v", spec, err)
			}
			payload := make([]byte, n)
			for i := range payload {
				payload[i] = byte(i*7 + 3)
			}
			data, err := Marshal(spec, mesh, payload)
			if err != nil {
				t.Fatalf("%v %v: %v", spec.Shape, mesh, err)
			}
			if err := checkWholeFile(data); err != nil {
				t.Fatalf("%v %v: %v", spec.Shape, mesh, err)
			}
			f, got, err := Parse(data)
			if err != nil {
				t.Fatalf("%v %v: %v", spec.Shape, mesh, err)
			}
			if !bytes.Equal(got, payload) {
				t.Errorf("%v: payload changed", spec.Shape)
			}
			want := spec
			if want.Layout == TileLayout {
				want.Alignment = []uint32{uint32(spec.Tile.H), uint32(spec.Tile.W)}
			} else {
				want.Alignment = []uint32{1}
			}
			if d := cmp.Diff(want, f.Spec); d != "" {
				t.Errorf("%v: spec changed (-want +got):\n%s", spec.Shape, d)
			}
			wantMesh := mesh
			if wantMesh == nil {
				wantMesh = []uint32{1, 1}
			}
			if !slices.Equal(f.MeshShape, wantMesh) {
				t.Errorf("mesh %v, want %v", f.MeshShape, wantMesh)
			}
			devices := 1
			for _, d := range wantMesh {
				devices *= int(d)
			}
			if len(f.Shards) != devices || f.Topology == nil || len(f.Topology.MeshCoords) != devices {
				t.Errorf("mesh %v: %d shards, topology %+v", wantMesh, len(f.Shards), f.Topology)
			}
			if int64(len(data)) != f.DataStart+n {
				t.Errorf("file of %d bytes, data at %d + %d: replicas must share one buffer", len(data), f.DataStart, n)
			}
		}
	}
}

// checkWholeFile applies the loader's checks to a whole file: 8-byte header
// length, the flatbuffers verifier over exactly header_size bytes, data
// region 8- (and here 64-) aligned, and the zero padding between the
// flatbuffer and the data region.
func checkWholeFile(data []byte) error {
	if len(data) < 8 {
		return errors.New("short file")
	}
	hs := binary.LittleEndian.Uint64(data)
	if 8+hs > uint64(len(data)) {
		return errors.New("header past the end")
	}
	fb := data[8 : 8+hs]
	if err := VerifyFlatBuffer(fb); err != nil {
		return err
	}
	if (8+hs)%DataAlign != 0 {
		return errors.New("data region not 64-aligned")
	}
	return nil
}

func TestSpecRejects(t *testing.T) {
	for _, c := range []struct {
		name string
		spec Spec
		want error
	}{
		{"rank 1 tile", Spec{Shape: []uint32{64}, DType: BFloat8B, Layout: TileLayout, Tile: bfp.Tile32x32}, ErrShape},
		{"zero dim", Spec{Shape: []uint32{0, 32}, DType: BFloat16, Layout: TileLayout, Tile: bfp.Tile32x32}, ErrShape},
		{"bad tile", Spec{Shape: []uint32{32, 32}, DType: BFloat8B, Layout: TileLayout, Tile: bfp.Tile{H: 24, W: 32}}, ErrShape},
		{"bfp row major", Spec{Shape: []uint32{32, 32}, DType: BFloat4B, Layout: RowMajor}, ErrShape},
		{"no dtype", Spec{Shape: []uint32{32, 32}, Layout: RowMajor}, ErrUnsupported},
		{"huge", Spec{Shape: []uint32{1 << 30, 1 << 30, 1 << 30}, DType: BFloat16, Layout: RowMajor}, ErrShape},
		{"alignment not covering tile", Spec{Shape: []uint32{32, 32}, DType: BFloat16, Layout: TileLayout, Tile: bfp.Tile32x32, Alignment: []uint32{16, 32}}, ErrFormat},
	} {
		if _, err := c.spec.PayloadSize(); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	spec := testSpecs()[0]
	if _, err := Marshal(spec, nil, make([]byte, 10)); !errors.Is(err, ErrShape) {
		t.Errorf("wrong payload size: %v", err)
	}
	if _, err := Marshal(spec, []uint32{0, 2}, nil); !errors.Is(err, ErrShape) {
		t.Errorf("zero mesh: %v", err)
	}
}

// TestVerifierMutations damages every byte of a valid header in turn: the
// reader must either refuse the file or decode a header that passes Check,
// and never panic.
func TestVerifierMutations(t *testing.T) {
	spec := testSpecs()[1]
	n, _ := spec.PayloadSize()
	data, err := Marshal(spec, []uint32{2, 2}, make([]byte, n))
	if err != nil {
		t.Fatal(err)
	}
	hs := int(binary.LittleEndian.Uint64(data))
	refused := 0
	for i := 0; i < 8+hs; i++ {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			d := slices.Clone(data)
			d[i] ^= x
			if _, _, err := Parse(d); err != nil {
				refused++
			}
		}
	}
	if refused == 0 {
		t.Fatal("no mutation refused")
	}
	for cut := 0; cut < len(data); cut += 7 {
		if _, _, err := Parse(data[:cut]); err == nil {
			t.Fatalf("file cut at %d accepted", cut)
		}
	}
}

// TestVerifierRequiredFields builds Tensor flatbuffers with one required
// part missing or misplaced and checks that the verifier names it.
func TestVerifierRequiredFields(t *testing.T) {
	good := buildFlatBuffer(mustHeader(t))
	if err := VerifyFlatBuffer(good); err != nil {
		t.Fatal(err)
	}
	// A root Tensor with no fields at all.
	b := flatbuffers.NewBuilder(64)
	b.StartObject(4)
	b.Finish(b.EndObject())
	if err := VerifyFlatBuffer(b.FinishedBytes()); !errors.Is(err, ErrFormat) {
		t.Errorf("empty Tensor accepted: %v", err)
	}
	// Tensor with a spec and mesh but no shards.
	b = flatbuffers.NewBuilder(64)
	b.StartObject(1)
	mesh := b.EndObject()
	b.StartObject(2)
	spec := b.EndObject()
	b.StartObject(4)
	b.PrependUOffsetTSlot(slotTensorSpec, spec, 0)
	b.PrependUOffsetTSlot(slotTensorMesh, mesh, 0)
	b.Finish(b.EndObject())
	if err := VerifyFlatBuffer(b.FinishedBytes()); err == nil {
		t.Error("Tensor without shards (and an empty spec) accepted")
	}
	// A root offset past the end.
	bad := slices.Clone(good)
	binary.LittleEndian.PutUint32(bad, uint32(len(bad)+4))
	if err := VerifyFlatBuffer(bad); !errors.Is(err, ErrFormat) {
		t.Errorf("root offset past the end: %v", err)
	}
	// A misaligned root (table offsets must be 4-aligned).
	bad = slices.Clone(good)
	binary.LittleEndian.PutUint32(bad, binary.LittleEndian.Uint32(bad)+2)
	if err := VerifyFlatBuffer(bad); !errors.Is(err, ErrFormat) {
		t.Errorf("misaligned root: %v", err)
	}
}

func mustHeader(t *testing.T) *Header {
	t.Helper()
	h, err := NewHeader(testSpecs()[0], []uint32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestTilize(t *testing.T) {
	for _, g := range []tileGeometry{
		{slices: 1, rows: 32, cols: 32, elem: 2, tile: bfp.Tile32x32},
		{slices: 3, rows: 5, cols: 33, elem: 2, tile: bfp.Tile32x32},
		{slices: 2, rows: 40, cols: 17, elem: 4, tile: bfp.Tile16x32},
		{slices: 1, rows: 9, cols: 40, elem: 4, tile: bfp.Tile32x16},
	} {
		src := make([]byte, g.slices*g.rows*g.cols*g.elem)
		for i := range src {
			src[i] = byte(i%251 + 1)
		}
		tiled, err := tilize(src, g)
		if err != nil {
			t.Fatal(err)
		}
		// Element (s, r, c) must be at its face position.
		t0 := g.tile
		tr, tc := bfp.TileGrid(t0, g.rows, g.cols)
		fh := t0.FaceH()
		for s := 0; s < g.slices; s++ {
			for r := 0; r < g.rows; r++ {
				for c := 0; c < g.cols; c++ {
					tile := (s*tr+r/t0.H)*tc + c/t0.W
					lr, lc := r%t0.H, c%t0.W
					face := (lr/fh)*(t0.W/16) + lc/16
					at := (tile*t0.H*t0.W + face*fh*16 + (lr%fh)*16 + lc%16) * g.elem
					from := ((s*g.rows+r)*g.cols + c) * g.elem
					if !bytes.Equal(tiled[at:at+g.elem], src[from:from+g.elem]) {
						t.Fatalf("%+v: element (%d,%d,%d) not at tiled byte %d", g, s, r, c, at)
					}
				}
			}
		}
		back, err := untilize(tiled, g)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, src) {
			t.Fatalf("%+v: untilize(tilize(x)) != x", g)
		}
		if g.rows%t0.H != 0 || g.cols%t0.W != 0 {
			tiled[len(tiled)-1] = 1
			if _, err := untilize(tiled, g); !errors.Is(err, ErrFormat) {
				t.Errorf("%+v: non-zero padding accepted: %v", g, err)
			}
		}
	}
}

func TestTransposeLast2(t *testing.T) {
	src := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12} // 2 slices of 2×3, elem 1
	got := transposeLast2(src, 2, 2, 3, 1)
	want := []byte{1, 4, 2, 5, 3, 6, 7, 10, 8, 11, 9, 12}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	if !bytes.Equal(transposeLast2(got, 2, 3, 2, 1), src) {
		t.Fatal("transpose twice is not the identity")
	}
}

// TestGoldenWalkThrough pins the byte positions docs/ttnn-export.md walks
// through, read straight from the file without the package's accessors.
func TestGoldenWalkThrough(t *testing.T) {
	d, err := os.ReadFile(filepath.Join("testdata", "golden_bfp8_40x48_dtype_BFLOAT8_B_layout_TILE.tensorbin"))
	if err != nil {
		t.Fatal(err)
	}
	u32 := func(at int) uint32 { return binary.LittleEndian.Uint32(d[at:]) }
	u64 := func(at int) uint64 { return binary.LittleEndian.Uint64(d[at:]) }
	checks := []struct {
		what      string
		got, want uint64
	}{
		{"header_size", u64(0), 376},
		{"root offset", uint64(u32(8)), 20},
		{"Tensor soffset", uint64(u32(28)), 12},
		{"InlineFileStorage.offset", u64(168), 0},
		{"InlineFileStorage.size", u64(176), 4352},
		{"TensorShard buffer_type", uint64(d[152+15]), 1},
		{"page_config_type", uint64(d[252+16]), 2},
		{"data_type", uint64(d[252+17]), 3},
		{"tile w", uint64(u32(296)), 32},
		{"tile h", uint64(u32(300)), 32},
		{"alignment length", uint64(u32(312)), 2},
		{"shape length", uint64(u32(324)), 2},
		{"shape[0]", uint64(u32(328)), 40},
		{"shape[1]", uint64(u32(332)), 48},
		{"file size", uint64(len(d)), 384 + 4352},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %d, the walk-through says %d", c.what, c.got, c.want)
		}
	}
	for i := 336; i < 384; i++ {
		if d[i] != 0 {
			t.Fatalf("padding byte %d is %#x", i, d[i])
		}
	}
}
