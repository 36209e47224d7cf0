package bfp

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// caseFile is one parsed conformance case (*.bfpv).
type caseFile struct {
	name                 string
	format               Format
	rows, cols           int
	paddedRows, paddedCs int
	tile                 Tile
	faceH, faceW         int
	expAlign             int
	tiles, words         int
	flags                uint32
	input                []float32
	packed               []byte
	unpacked             []uint32
}

func readCase(t *testing.T, path string) *caseFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 64 {
		t.Fatalf("%s: short header", path)
	}
	h := make([]uint32, 16)
	for i := range h {
		h[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	if h[0] != 0x56504642 || h[1] != 1 {
		t.Fatalf("%s: bad magic/version %#x %d", path, h[0], h[1])
	}
	c := &caseFile{name: path, rows: int(h[3]), cols: int(h[4]), paddedRows: int(h[5]), paddedCs: int(h[6]),
		tile: Tile{int(h[7]), int(h[8])}, faceH: int(h[9]), faceW: int(h[10]), expAlign: int(h[11]),
		tiles: int(h[12]), words: int(h[13]), flags: h[14]}
	switch h[2] {
	case 8:
		c.format = BFP8
	case 4:
		c.format = BFP4
	case 2:
		c.format = BFP2
	default:
		t.Fatalf("%s: bits %d", path, h[2])
	}
	if h[15] != 0 {
		t.Fatalf("%s: pad_bits %#x, only +0.0 padding is modelled", path, h[15])
	}
	n := c.rows * c.cols
	want := 64 + 4*n + 4*c.words + 4*n
	if len(b) != want {
		t.Fatalf("%s: size %d, header implies %d", path, len(b), want)
	}
	p := b[64:]
	c.input = make([]float32, n)
	for i := range c.input {
		c.input[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
	}
	p = p[4*n:]
	c.packed = p[:4*c.words]
	p = p[4*c.words:]
	c.unpacked = make([]uint32, n)
	for i := range c.unpacked {
		c.unpacked[i] = binary.LittleEndian.Uint32(p[4*i:])
	}
	return c
}

type manifestCase struct {
	File   string `json:"file"`
	Format string `json:"format"`
	Name   string `json:"name"`
	Rows   int    `json:"rows"`
	Cols   int    `json:"cols"`
	Tile   [2]int `json:"tile"`
	Face   [2]int `json:"face"`
	Tiles  int    `json:"tiles"`
	Words  int    `json:"words"`
}

func loadManifest(t *testing.T) (string, []manifestCase) {
	dir := testdata.Dir(t, "bfp")
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Version int            `json:"version"`
		Cases   []manifestCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Cases) == 0 {
		t.Fatal("manifest lists no cases")
	}
	return dir, m.Cases
}

func TestConformanceCases(t *testing.T) {
	dir, cases := loadManifest(t)
	// Every case file on disk must be in the manifest, so none is skipped.
	onDisk := 0
	for _, sub := range []string{"bfp8_b", "bfp4_b", "bfp2_b"} {
		files, _ := filepath.Glob(filepath.Join(dir, sub, "*.bfpv"))
		onDisk += len(files)
	}
	if onDisk != len(cases) {
		t.Errorf("%d case files on disk, %d in manifest", onDisk, len(cases))
	}
	passed := 0
	for _, mc := range cases {
		t.Run(mc.File, func(t *testing.T) {
			c := readCase(t, filepath.Join(dir, mc.File))
			f, err := ParseFormat(mc.Format)
			if err != nil || f != c.format {
				t.Fatalf("manifest format %q (%v) vs header %v", mc.Format, err, c.format)
			}
			if c.rows != mc.Rows || c.cols != mc.Cols || c.tile != (Tile{mc.Tile[0], mc.Tile[1]}) || c.words != mc.Words || c.tiles != mc.Tiles {
				t.Fatalf("header disagrees with manifest")
			}
			checkGeometry(t, c)
			got, err := Pack(c.format, c.tile, c.input, c.rows, c.cols)
			if err != nil {
				t.Fatal(err)
			}
			if d := firstDiff(got, c.packed); d >= 0 {
				t.Errorf("Pack: %d bytes, want %d; first difference at byte %d (got %#02x want %#02x)",
					len(got), len(c.packed), d, at(got, d), at(c.packed, d))
			}
			// Allocation-free variant into a dirty buffer.
			buf := make([]byte, len(c.packed))
			for i := range buf {
				buf[i] = 0xA5
			}
			if err := PackInto(buf, c.format, c.tile, c.input, c.rows, c.cols); err != nil {
				t.Fatal(err)
			}
			if d := firstDiff(buf, c.packed); d >= 0 {
				t.Errorf("PackInto into a dirty buffer differs at byte %d", d)
			}
			if err := ParallelPackInto(buf, c.format, c.tile, c.input, c.rows, c.cols, 3); err != nil {
				t.Fatal(err)
			}
			if d := firstDiff(buf, c.packed); d >= 0 {
				t.Errorf("ParallelPackInto differs at byte %d", d)
			}
			// The pure-Go kernels, whatever the build, must give the same bytes.
			goPacked := make([]byte, len(c.packed))
			packRange(packRowGo, goPacked, c.format, c.tile, c.input, c.rows, c.cols, 0, c.paddedRows/c.tile.H)
			if d := firstDiff(goPacked, c.packed); d >= 0 {
				t.Errorf("pure-Go pack kernel differs at byte %d", d)
			}
			goVals := make([]float32, c.rows*c.cols)
			unpackRange(unpackRowGo, goVals, c.format, c.tile, c.packed, c.rows, c.cols, 0, c.paddedRows/c.tile.H)
			for i, v := range goVals {
				if math.Float32bits(v) != c.unpacked[i] {
					t.Fatalf("pure-Go unpack kernel: element %d differs", i)
				}
			}
			un, err := Unpack(c.format, c.tile, c.packed, c.rows, c.cols)
			if err != nil {
				t.Fatal(err)
			}
			bad := 0
			for i, v := range un {
				if math.Float32bits(v) != c.unpacked[i] {
					if bad < 5 {
						t.Errorf("Unpack element %d (row %d col %d): %#08x, want %#08x",
							i, i/c.cols, i%c.cols, math.Float32bits(v), c.unpacked[i])
					}
					bad++
				}
			}
			if bad > 0 {
				t.Errorf("Unpack: %d of %d elements differ", bad, len(un))
			}
			fl := make([]float32, c.rows*c.cols)
			if err := ParallelUnpackInto(fl, c.format, c.tile, c.packed, c.rows, c.cols, 3); err != nil {
				t.Fatal(err)
			}
			for i, v := range fl {
				if math.Float32bits(v) != c.unpacked[i] {
					t.Fatalf("ParallelUnpackInto element %d differs", i)
				}
			}
			if !t.Failed() {
				passed++
			}
		})
	}
	t.Logf("%d of %d conformance cases pass byte for byte", passed, len(cases))
}

func checkGeometry(t *testing.T, c *caseFile) {
	t.Helper()
	tr, tc := TileGrid(c.tile, c.rows, c.cols)
	if tr*c.tile.H != c.paddedRows || tc*c.tile.W != c.paddedCs || tr*tc != c.tiles {
		t.Errorf("tile grid %dx%d, header padded %dx%d tiles %d", tr, tc, c.paddedRows, c.paddedCs, c.tiles)
	}
	if c.tile.FaceH() != c.faceH || c.faceW != FaceW || c.expAlign != ExponentAlign {
		t.Errorf("face %dx%d align %d, header %dx%d align %d", c.tile.FaceH(), FaceW, ExponentAlign, c.faceH, c.faceW, c.expAlign)
	}
	n, err := PackedSize(c.format, c.tile, c.rows, c.cols)
	if err != nil || n != 4*c.words {
		t.Errorf("PackedSize = %d, %v; header words %d", n, err, c.words)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

func at(b []byte, i int) byte {
	if i < len(b) {
		return b[i]
	}
	return 0
}

func TestDecodeTables(t *testing.T) {
	dir := testdata.Dir(t, "bfp")
	for _, f := range Formats() {
		t.Run(f.String(), func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(dir, "decode", fmt.Sprintf("bfp%d_b.u32", f.Bits())))
			if err != nil {
				t.Fatal(err)
			}
			nc := 1 << f.Bits()
			if len(b) != 4*256*nc {
				t.Fatalf("table has %d bytes, want %d", len(b), 4*256*nc)
			}
			bad := 0
			for e := range 256 {
				for code := range nc {
					want := binary.LittleEndian.Uint32(b[4*(e*nc+code):])
					got := math.Float32bits(f.Decode(uint8(code), uint8(e)))
					if got != want {
						if bad < 5 {
							t.Errorf("Decode(%#x, %d) = %#08x, want %#08x", code, e, got, want)
						}
						bad++
					}
				}
			}
			// The same table through the tile unpacker: a 1x16 tile with
			// exponent E and all 16 elements one code at a time.
			bad2 := 0
			tile := make([]byte, TileBytes(f, Tile1x16))
			for e := range 256 {
				for code := range nc {
					clear(tile)
					tile[0] = uint8(e)
					for k := range 16 {
						bit := k * f.Bits()
						tile[16+bit/8] |= uint8(code << (bit % 8))
					}
					vals, err := Unpack(f, Tile1x16, tile, 1, 16)
					if err != nil {
						t.Fatal(err)
					}
					want := binary.LittleEndian.Uint32(b[4*(e*nc+code):])
					for _, v := range vals {
						if math.Float32bits(v) != want {
							bad2++
							break
						}
					}
				}
			}
			if bad2 > 0 {
				t.Errorf("Unpack disagrees with the decode table for %d (E, code) pairs", bad2)
			}
			t.Logf("%s: %d decode entries checked, %d mismatches (Decode), %d (Unpack)", f, 256*nc, bad, bad2)
		})
	}
}

func TestElementTables(t *testing.T) {
	dir := testdata.Dir(t, "bfp")
	for _, f := range Formats() {
		t.Run(f.String(), func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(dir, "elements", fmt.Sprintf("bfp%d_b.enc", f.Bits())))
			if err != nil {
				t.Fatal(err)
			}
			if len(b)%12 != 0 || len(b) == 0 {
				t.Fatalf("table size %d is not a positive multiple of 12", len(b))
			}
			n := len(b) / 12
			bad, badFast, badNearest := 0, 0, 0
			w := uint(f.MantissaBits())
			for i := range n {
				in := binary.LittleEndian.Uint32(b[12*i:])
				e := binary.LittleEndian.Uint32(b[12*i+4:])
				want := binary.LittleEndian.Uint32(b[12*i+8:])
				if e > 255 || want >= 1<<f.Bits() {
					t.Fatalf("record %d out of range: shared %d code %#x", i, e, want)
				}
				x := math.Float32frombits(in)
				got := f.Encode(x, uint8(e))
				if uint32(got) != want {
					if bad < 5 {
						t.Errorf("Encode(%#08x, %d) = %#x, want %#x", in, e, got, want)
					}
					bad++
				}
				if ex := in >> 23 & 0xff; ex <= e {
					if encodeFast(in, e, w) != want {
						badFast++
					}
				}
				if nb, wb := math.Float32bits(f.Nearest(x, uint8(e))), math.Float32bits(f.Decode(uint8(want), uint8(e))); nb != wb {
					badNearest++
				}
			}
			if badFast > 0 || badNearest > 0 {
				t.Errorf("branch-free encoder mismatches: %d, Nearest mismatches: %d", badFast, badNearest)
			}
			t.Logf("%s: %d element records checked, %d mismatches", f, n, bad)
		})
	}
}

// TestSharedDataChecksums verifies the conformance data against its
// SHA256SUMS, so a damaged copy is reported as such rather than as a
// packing bug. Only data files are checked: the prose README's listed sum
// does not match the README as distributed, which does not affect the data.
func TestSharedDataChecksums(t *testing.T) {
	dir := testdata.Dir(t, "bfp")
	f, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("malformed line %q", sc.Text())
		}
		if strings.HasSuffix(name, ".md") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			t.Error(err)
			continue
		}
		h := sha256.Sum256(b)
		if hex.EncodeToString(h[:]) != sum {
			t.Errorf("%s: checksum mismatch", name)
		}
		n++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("SHA256SUMS lists no files")
	}
}
