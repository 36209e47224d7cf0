package ttnn

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/build"
	mplan "github.com/ttquant/ttquant/manifest/plan"
)

var demo struct {
	once sync.Once
	dir  string
	err  error
}

// demoCheckpoint builds a checkpoint of the tiny Qwen3.6-MoE fixture with
// the qwen36-35b-a3b preset (BFP4_b experts, BFP8_b projections, lossless
// norms) once per test binary.
func demoCheckpoint(t *testing.T) *manifest.Checkpoint {
	t.Helper()
	demo.once.Do(func() {
		dir, err := os.MkdirTemp("", "ttnn-demo-")
		if err != nil {
			demo.err = err
			return
		}
		demo.dir = filepath.Join(dir, "ckpt")
		src := filepath.Join(dir, "model")
		if demo.err = testmodel.Write(src, testmodel.Tiny(), testmodel.Default); demo.err != nil {
			return
		}
		p, err := mplan.Preset(mplan.PresetQwen36MoE)
		if err != nil {
			demo.err = err
			return
		}
		_, demo.err = build.Convert(context.Background(), build.BuildOptions{Source: src, Out: demo.dir, Plan: p})
	})
	if demo.err != nil {
		t.Fatal(demo.err)
	}
	c, err := manifest.OpenCheckpoint(demo.dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestMain(m *testing.M) {
	code := m.Run()
	if demo.dir != "" {
		os.RemoveAll(filepath.Dir(demo.dir))
	}
	os.Exit(code)
}

func exampleMap(t *testing.T) *NameMap {
	t.Helper()
	m, err := LoadNameMap(filepath.Join("names", "qwen36-moe.example.json"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func parseMap(t *testing.T, s string) *NameMap {
	t.Helper()
	m, err := ParseNameMap([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestExportRoundTrip exports every tensor of the demo checkpoint with the
// example map and reads each file back: the header passes the flatbuffers
// verifier's rules with a 64-aligned data region, the spec is what the
// record says, and the payload is byte-identical to the checkpoint's packed
// tiles (BFP, stacked experts concatenated in order) or values (lossless).
func TestExportRoundTrip(t *testing.T) {
	c := demoCheckpoint(t)
	out := filepath.Join(t.TempDir(), "out")
	res, err := Export(context.Background(), c, exampleMap(t), Options{Out: out})
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]int{}
	var bfpFiles, stacked, lossless int
	for _, f := range res.Record.Files {
		data, err := os.ReadFile(filepath.Join(out, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkWholeFile(data); err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		tf, payload, err := Parse(data)
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		if tf.Spec.DType.String() != f.DType || tf.Spec.Layout.String() != f.Layout || !slices.Equal(tf.Spec.Shape, f.Shape) {
			t.Errorf("%s: header %v %s %s, record %v %s %s", f.Name, tf.Spec.Shape, tf.Spec.DType, tf.Spec.Layout, f.Shape, f.DType, f.Layout)
		}
		if !strings.HasSuffix(f.Name, "_dtype_"+f.DType+"_layout_"+f.Layout+".tensorbin") {
			t.Errorf("%s: not the as_tensor name", f.Name)
		}
		var want []byte
		for _, s := range f.Sources {
			b, err := c.ReadPacked(s.Tensor)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, b...)
			covered[s.Tensor]++
		}
		// The example map writes BFP in TILE and lossless tensors row
		// major, untransposed: the payload is the stored bytes as they are.
		if !bytes.Equal(payload, want) {
			t.Errorf("%s: payload differs from the checkpoint's bytes", f.Name)
		}
		if _, ok := tf.Spec.DType.BFP(); ok {
			// The preset's BFP matrices are packed [in, out] and the map
			// writes them so: the layout tt-metal's linear reads.
			if !f.Transpose {
				t.Errorf("%s: a BFP file of the default build not written transposed", f.Name)
			}
			for _, s := range f.Sources {
				if s.Orientation != manifest.OrientTransposed {
					t.Errorf("%s: source %s stored %q", f.Name, s.Tensor, s.Orientation)
				}
			}
			bfpFiles++
		} else {
			lossless++
		}
		if len(f.Sources) > 1 {
			stacked++
		}
	}
	names := c.Names()
	for _, n := range names {
		if covered[n] != 1 {
			t.Errorf("tensor %s exported %d times", n, covered[n])
		}
	}
	if bfpFiles == 0 || lossless == 0 || stacked == 0 {
		t.Errorf("export lacks a kind: %d BFP, %d lossless, %d stacked files", bfpFiles, lossless, stacked)
	}
	t.Logf("%d tensors in %d files (%d BFP, %d lossless, %d stacked), %d bytes", len(names), res.Files, bfpFiles, lossless, stacked, res.Bytes)

	rep, err := VerifyExport(context.Background(), out, VerifyOptions{Checkpoint: c})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Tensors != len(names) || rep.Files != res.Files {
		t.Fatalf("verify: ok=%v files=%d tensors=%d failures=%v", rep.OK, rep.Files, rep.Tensors, rep.Failures)
	}

	// Same inputs, same bytes.
	out2 := filepath.Join(t.TempDir(), "out")
	if _, err := Export(context.Background(), c, exampleMap(t), Options{Out: out2}); err != nil {
		t.Fatal(err)
	}
	for _, f := range append(res.Record.Files, RecordFile{Name: RecordName}) {
		a, _ := os.ReadFile(filepath.Join(out, f.Name))
		b, _ := os.ReadFile(filepath.Join(out2, f.Name))
		if !bytes.Equal(a, b) {
			t.Fatalf("%s differs between two exports", f.Name)
		}
	}
}

// TestExportInputAxisRefused: the same preset built on the input axis
// ([out, in] packing) cannot be written as the [in, out] files the example
// map asks for; the export is refused before anything is written, naming
// the axis to build with.
func TestExportInputAxisRefused(t *testing.T) {
	root := t.TempDir()
	src, dir := filepath.Join(root, "model"), filepath.Join(root, "ckpt")
	if err := testmodel.Write(src, testmodel.Tiny(), testmodel.Default); err != nil {
		t.Fatal(err)
	}
	p, err := mplan.Preset(mplan.PresetQwen36MoE)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithAxis(bfp.AxisInput); err != nil {
		t.Fatal(err)
	}
	if _, err := build.Convert(context.Background(), build.BuildOptions{Source: src, Out: dir, Plan: p}); err != nil {
		t.Fatal(err)
	}
	c, err := manifest.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "out")
	_, err = Export(context.Background(), c, exampleMap(t), Options{Out: out})
	if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), `orientation "row"`) || !strings.Contains(err.Error(), "--axis output") {
		t.Fatalf("export of an input-axis build: %v", err)
	}
	if _, serr := os.Stat(out); !errors.Is(serr, os.ErrNotExist) {
		t.Fatal("output written despite the refusal")
	}
}

// TestExportLayouts covers what the example map does not: lossless
// tensors tiled and transposed, a rank lift, L1 memory and a replicated
// 2×4 mesh; each payload decodes back to the checkpoint's values.
func TestExportLayouts(t *testing.T) {
	c := demoCheckpoint(t)
	m := parseMap(t, `{"format": "ttquant-ttnn-names", "version": 1, "rules": [
		{"match": "model\\.language_model\\.layers\\.(\\d+)\\.mlp\\.gate\\.weight", "name": "router.$1", "layout": "TILE", "transpose": true},
		{"match": "model\\.language_model\\.layers\\.(\\d+)\\.linear_attn\\.norm\\.weight", "name": "la_norm.$1", "layout": "TILE", "rank": 2},
		{"match": "model\\.language_model\\.layers\\.(\\d+)\\.input_layernorm\\.weight", "name": "norms", "layout": "TILE", "stack": {"index": "$1"}},
		{"match": "model\\.language_model\\.layers\\.(\\d+)\\.mlp\\.experts\\.(\\d+)\\.down_proj", "name": "l$1.w2", "stack": {"index": "$2"}, "transpose": true},
		{"match": ".*", "skip": true}]}`)
	out := t.TempDir()
	res, err := Export(context.Background(), c, m, Options{Out: out, Memory: L1Interleaved, Mesh: []uint32{2, 4}})
	if err != nil {
		t.Fatal(err)
	}
	byCache := map[string]RecordFile{}
	for _, f := range res.Record.Files {
		byCache[f.CacheName] = f
	}
	router := byCache["router.0"]
	if router.Layout != "TILE" || !slices.Equal(router.Shape, []uint32{256, 16}) || router.DType != "BFLOAT16" {
		t.Fatalf("router file %+v", router)
	}
	if f := byCache["la_norm.0"]; !slices.Equal(f.Shape, []uint32{1, 64}) || f.DType != "FLOAT32" {
		t.Fatalf("la_norm file %+v", f)
	}
	if f := byCache["norms"]; !slices.Equal(f.Shape, []uint32{4, 256}) || len(f.Sources) != 4 {
		t.Fatalf("stacked norms %+v", f)
	}
	if f := byCache["l0.w2"]; len(f.Sources) != 16 || f.Shape[0] != 16 {
		t.Fatalf("stacked experts %+v", f)
	}
	for _, f := range res.Record.Files {
		data, err := os.ReadFile(filepath.Join(out, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		tf, payload, err := Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		if len(tf.Shards) != 8 || tf.Spec.Memory != L1Interleaved || !slices.Equal(tf.MeshShape, []uint32{2, 4}) {
			t.Errorf("%s: %d shards, memory %s, mesh %v", f.Name, len(tf.Shards), tf.Spec.Memory, tf.MeshShape)
		}
		parts, err := decodePayload(f, tf.Spec, payload)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range f.Sources {
			b, _ := c.ReadPacked(s.Tensor)
			if !bytes.Equal(parts[i], b) {
				t.Errorf("%s: source %s does not decode back", f.Name, s.Tensor)
			}
		}
	}
	// The tiled, transposed router: element (r, c) of the [16, 256]
	// source is element (c, r) of the [256, 16] tensor, found at its face
	// position in the tile payload.
	data, _ := os.ReadFile(filepath.Join(out, router.Name))
	tf, payload, _ := Parse(data)
	src, _ := c.ReadPacked(router.Sources[0].Tensor)
	for _, rc := range [][2]int{{0, 0}, {3, 200}, {15, 255}, {7, 17}} {
		r, col := rc[1], rc[0] // position in the transposed matrix
		tileIdx := (r / 32) * 1
		lr, lc := r%32, col%32
		face := (lr/16)*2 + lc/16
		at := (tileIdx*1024 + face*256 + (lr%16)*16 + lc%16) * 2
		from := (rc[0]*256 + rc[1]) * 2
		if !bytes.Equal(payload[at:at+2], src[from:from+2]) {
			t.Errorf("router element %v not at tiled byte %d", rc, at)
		}
	}
	if tf.Spec.Tile.H != 32 {
		t.Fatal("router tile")
	}
	rep, err := VerifyExport(context.Background(), out, VerifyOptions{Checkpoint: c})
	if err != nil || !rep.OK {
		t.Fatalf("verify: %v %+v", err, rep)
	}
}

// TestExportRefusals: bad input is refused before anything is written.
func TestExportRefusals(t *testing.T) {
	c := demoCheckpoint(t)
	header := `{"format": "ttquant-ttnn-names", "version": 1, "rules": [`
	for _, tc := range []struct {
		name, rules string
		want        error
		say         string
	}{
		{"unknown tensor in the map", `{"match": "model\\.language_model\\.layers\\.0\\.no_such\\.weight", "name": "x"}, {"match": ".*", "name": "$0"}`, ErrNameMap, "matches no tensor"},
		{"tensor no rule matches", `{"match": "lm_head\\.weight", "name": "output"}`, ErrNameMap, "matches no rule"},
		{"shape ttnn cannot tile", `{"match": "model\\.language_model\\.norm\\.weight", "name": "norm", "layout": "TILE"}, {"match": ".*", "skip": true}`, ErrShape, "TILE layout needs rank 2"},
		{"BFP in row major", `{"match": "lm_head\\.weight", "name": "output", "layout": "ROW_MAJOR"}, {"match": ".*", "skip": true}`, ErrShape, "only in TILE"},
		{"BFP untransposed", `{"match": "lm_head\\.weight", "name": "output"}, {"match": ".*", "skip": true}`, ErrShape, "quantizing again"},
		{"two tensors one file", `{"match": "model\\.language_model\\.layers\\.\\d+\\.input_layernorm\\.weight", "name": "norm"}, {"match": ".*", "skip": true}`, ErrNameMap, "both map to"},
		{"stack of one layer's experts", `{"match": "model\\.language_model\\.layers\\.0\\.mlp\\.experts\\.(\\d+)\\.down_proj", "name": "w2", "stack": {"index": "$1"}, "transpose": true}, {"match": "model\\.language_model\\.layers\\.0\\.mlp\\.experts\\.(\\d+)\\.gate_up_proj", "skip": true}, {"match": ".*", "skip": true}`, nil, ""},
		{"wrong dtype", `{"match": "lm_head\\.weight", "name": "output", "dtype": "BFLOAT4_B"}, {"match": ".*", "skip": true}`, ErrNameMap, "the map asks for BFLOAT4_B"},
		{"escaping name", `{"match": "lm_head\\.weight", "name": "../output"}, {"match": ".*", "skip": true}`, ErrNameMap, "clean relative path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			_, err := Export(context.Background(), c, parseMap(t, header+tc.rules+`]}`), Options{Out: out})
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.say) {
				t.Fatalf("got %v, want %v mentioning %q", err, tc.want, tc.say)
			}
			if _, serr := os.Stat(out); !errors.Is(serr, os.ErrNotExist) {
				t.Fatalf("output written despite the refusal")
			}
		})
	}
}

// TestExportStackGap: a stack whose positions are not consecutive.
func TestExportStackGap(t *testing.T) {
	c := demoCheckpoint(t)
	m := parseMap(t, `{"format": "ttquant-ttnn-names", "version": 1, "rules": [
		{"match": "model\\.language_model\\.layers\\.0\\.mlp\\.experts\\.(\\d*[02468])\\.down_proj", "name": "w2", "stack": {"index": "$1"}, "transpose": true},
		{"match": ".*", "skip": true}]}`)
	out := filepath.Join(t.TempDir(), "out")
	if _, err := Export(context.Background(), c, m, Options{Out: out}); !errors.Is(err, ErrNameMap) || !strings.Contains(err.Error(), "not consecutive") {
		t.Fatalf("got %v", err)
	}
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(dst, 0o755)
	for _, e := range ents {
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		out.Close()
	}
}

// TestExportRefusesDamagedCheckpoint: a checkpoint whose data no longer
// matches its manifest is refused before anything is written.
func TestExportRefusesDamagedCheckpoint(t *testing.T) {
	good := demoCheckpoint(t)
	dir := filepath.Join(t.TempDir(), "ckpt")
	copyDir(t, good.Dir(), dir)
	e, _ := good.TensorInfo("lm_head.weight")
	path := filepath.Join(dir, e.File)
	data, _ := os.ReadFile(path)
	data[e.Offset+100] ^= 0x10
	os.WriteFile(path, data, 0o644)
	c, err := manifest.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, err := Export(context.Background(), c, exampleMap(t), Options{Out: out}); !errors.Is(err, ErrCheckpoint) {
		t.Fatalf("got %v, want ErrCheckpoint", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("output written for a damaged checkpoint")
	}
}

// TestExportOutputAndVerify: an earlier export is not replaced without
// Overwrite; VerifyExport finds a changed payload byte, a changed header,
// a missing file, a leftover temporary file and a record of another
// checkpoint.
func TestExportOutputAndVerify(t *testing.T) {
	c := demoCheckpoint(t)
	m := parseMap(t, `{"format": "ttquant-ttnn-names", "version": 1, "rules": [
		{"match": "lm_head\\.weight", "name": "output", "transpose": true},
		{"match": "model\\.language_model\\.norm\\.weight", "name": "norm"},
		{"match": "model\\.language_model\\.layers\\.0\\.mlp\\.gate\\.weight", "name": "router", "layout": "TILE"},
		{"match": ".*", "skip": true}]}`)
	out := t.TempDir()
	res, err := Export(context.Background(), c, m, Options{Out: out})
	if err != nil {
		t.Fatal(err)
	}
	// The same export again keeps every file; a different one (another
	// mesh) is refused without Overwrite.
	if again, err := Export(context.Background(), c, m, Options{Out: out}); err != nil || again.Kept != 3 || again.Files != 3 {
		t.Fatalf("the same export again: %v %+v", err, again)
	}
	if _, err := Export(context.Background(), c, m, Options{Out: out, Mesh: []uint32{1, 2}}); !errors.Is(err, ErrOutput) {
		t.Fatalf("a different export without overwrite: %v", err)
	}
	if _, err := Export(context.Background(), c, m, Options{Out: out, Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyExport(context.Background(), out, VerifyOptions{})
	if err != nil || !rep.OK || rep.Files != 3 {
		t.Fatalf("clean export: %v %+v", err, rep)
	}
	file := func(cache string) string {
		for _, f := range res.Record.Files {
			if f.CacheName == cache {
				return filepath.Join(out, f.Name)
			}
		}
		t.Fatalf("no file for %s", cache)
		return ""
	}
	damage := func(path string, at func(n int) int) func() {
		orig, _ := os.ReadFile(path)
		d := slices.Clone(orig)
		d[at(len(d))] ^= 0x01
		os.WriteFile(path, d, 0o644)
		return func() { os.WriteFile(path, orig, 0o644) }
	}
	expectFail := func(what, say string) {
		t.Helper()
		rep, err := VerifyExport(context.Background(), out, VerifyOptions{Checkpoint: c})
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK || !strings.Contains(rep.Failures[0].String(), say) {
			t.Fatalf("%s: ok=%v failures=%v", what, rep.OK, rep.Failures)
		}
	}
	undo := damage(file("output"), func(n int) int { return n - 5 })
	expectFail("payload byte", "sha256")
	undo()
	undo = damage(file("router"), func(int) int { return 20 })
	expectFail("header byte", "sha256")
	undo()
	os.WriteFile(filepath.Join(out, "x.tensorbin.partial"), []byte("x"), 0o644)
	expectFail("temporary file", "unfinished")
	os.Remove(filepath.Join(out, "x.tensorbin.partial"))
	orig, _ := os.ReadFile(file("norm"))
	os.Remove(file("norm"))
	expectFail("missing file", "no such file")
	os.WriteFile(file("norm"), orig, 0o644)

	// The record says it came from another checkpoint.
	rec, _ := os.ReadFile(filepath.Join(out, RecordName))
	other := bytes.Replace(rec, []byte(c.Identity()), []byte(strings.Repeat("0", 64)), 1)
	os.WriteFile(filepath.Join(out, RecordName), other, 0o644)
	expectFail("other checkpoint", "exported from checkpoint")
	os.WriteFile(filepath.Join(out, RecordName), rec, 0o644)

	if rep, err := VerifyExport(context.Background(), out, VerifyOptions{Checkpoint: c}); err != nil || !rep.OK {
		t.Fatalf("restored export: %v %+v", err, rep)
	}
	if _, err := VerifyExport(context.Background(), t.TempDir(), VerifyOptions{}); !errors.Is(err, ErrNotExport) {
		t.Fatalf("empty directory: %v", err)
	}
}

func TestNameMapErrors(t *testing.T) {
	for _, s := range []string{
		`{"format": "x", "version": 1, "rules": [{"match": "a", "name": "b"}]}`,
		`{"format": "ttquant-ttnn-names", "version": 2, "rules": [{"match": "a", "name": "b"}]}`,
		`{"format": "ttquant-ttnn-names", "version": 1, "rules": []}`,
		`{"format": "ttquant-ttnn-names", "version": 1, "rules": [{"match": "(", "name": "b"}]}`,
		`{"format": "ttquant-ttnn-names", "version": 1, "rules": [{"match": "a"}]}`,
		`{"format": "ttquant-ttnn-names", "version": 1, "rules": [{"match": "a", "name": "b", "colour": 1}]}`,
		`{"format": "ttquant-ttnn-names", "version": 1, "rules": [{"match": "a", "name": "b{group}"}]}`,
		`{"format": "ttquant-ttnn-names", "version": 1, "rules": [{"match": "a", "name": "b", "stack": {"index": "$1", "group_size": 4}}]}`,
		`{"format": "ttquant-ttnn-names", "version": 1, "rules": [{"match": "a", "name": "b", "layout": "TILED"}]}`,
		`{"format": "ttquant-ttnn-names", "version": 1, "rules": [{"match": "a", "skip": true, "name": "b"}]}`,
		`{"format": "ttquant-ttnn-names", "version": 1, "rules": [{"match": "a", "name": "b"}]} {}`,
	} {
		if _, err := ParseNameMap([]byte(s)); !errors.Is(err, ErrNameMap) {
			t.Errorf("%s: got %v", s, err)
		}
	}
	if FileName("layers.0.attention.wq", BFloat8B, TileLayout) != "layers.0.attention.wq_dtype_BFLOAT8_B_layout_TILE.tensorbin" {
		t.Error("FileName")
	}
}

func TestExportRefusesOutputInsideCheckpoint(t *testing.T) {
	c := demoCheckpoint(t)
	out := filepath.Join(c.Dir(), "ttnn")
	if _, err := Export(context.Background(), c, exampleMap(t), Options{Out: out}); !errors.Is(err, ErrOutput) {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("wrote into the checkpoint")
	}
	if inside(c.Dir()+"-ttnn", c.Dir()) || !inside(c.Dir(), c.Dir()) {
		t.Fatal("inside")
	}
}

// TestExportRefusesLockedDirectory: while another writer holds the output
// directory's lock, an export fails at once naming the holder and writes
// nothing; once the lock is released the same export succeeds.
func TestExportRefusesLockedDirectory(t *testing.T) {
	c := demoCheckpoint(t)
	out := t.TempDir()
	lk, err := fslock.Acquire(out)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Export(context.Background(), c, exampleMap(t), Options{Out: out})
	var held *fslock.HeldError
	if !errors.As(err, &held) || held.PID != os.Getpid() {
		t.Fatalf("export into a locked directory: %v", err)
	}
	ents, _ := os.ReadDir(out)
	if len(ents) != 1 || ents[0].Name() != fslock.Name {
		t.Fatalf("refused export left %v", ents)
	}
	lk.Release()
	if _, err := Export(context.Background(), c, exampleMap(t), Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, fslock.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the export left its lock file: %v", err)
	}
}

// TestExportOverwriteRemovesStale: an export over an earlier one removes
// the earlier files it does not write, so ttnn finds no stale cache file.
func TestExportOverwriteRemovesStale(t *testing.T) {
	c := demoCheckpoint(t)
	two := parseMap(t, `{"format": "ttquant-ttnn-names", "version": 1, "rules": [
		{"match": "lm_head\\.weight", "name": "output", "transpose": true},
		{"match": "model\\.language_model\\.norm\\.weight", "name": "norm"},
		{"match": ".*", "skip": true}]}`)
	one := parseMap(t, `{"format": "ttquant-ttnn-names", "version": 1, "rules": [
		{"match": "lm_head\\.weight", "name": "output", "transpose": true},
		{"match": ".*", "skip": true}]}`)
	out := t.TempDir()
	if _, err := Export(context.Background(), c, two, Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	unrelated := filepath.Join(out, "other_model_dtype_BFLOAT16_layout_TILE.tensorbin")
	os.WriteFile(unrelated, []byte("not ours"), 0o644)
	if _, err := Export(context.Background(), c, one, Options{Out: out, Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "norm_dtype_BFLOAT16_layout_ROW_MAJOR.tensorbin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale file kept: %v", err)
	}
	if _, err := os.Stat(unrelated); err != nil {
		t.Errorf("a file no export wrote was removed: %v", err)
	}
	rep, err := VerifyExport(context.Background(), out, VerifyOptions{Checkpoint: c})
	if err != nil || !rep.OK || rep.Files != 1 || !slices.Equal(rep.Unlisted, []string{filepath.Base(unrelated)}) {
		t.Fatalf("verify: %v %+v", err, rep)
	}
}

// TestExportResumes: an interrupted export leaves its finished files and a
// journal naming them; the same export then resumes, keeps them and
// writes the same bytes as an uninterrupted one; an identical re-export
// keeps every file and writes nothing.
func TestExportResumes(t *testing.T) {
	c := demoCheckpoint(t)
	m := exampleMap(t)
	ref := t.TempDir()
	full, err := Export(context.Background(), c, m, Options{Out: ref})
	if err != nil {
		t.Fatal(err)
	}
	if full.Files < 4 {
		t.Fatalf("the example map exports %d files; the test needs a few", full.Files)
	}
	out := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	stopAt := full.Files / 2
	_, err = Export(ctx, c, m, Options{Out: out, Progress: func(done, total int, file string) {
		if done == stopAt {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted export: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, RecordName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an interrupted export left a record: %v", err)
	}
	res, err := Export(context.Background(), c, m, Options{Out: out})
	if err != nil {
		t.Fatalf("resumed export: %v", err)
	}
	if res.Kept != stopAt || res.Files != full.Files {
		t.Errorf("resumed export kept %d of %d files, want %d", res.Kept, res.Files, stopAt)
	}
	want, _ := os.ReadFile(filepath.Join(ref, RecordName))
	got, _ := os.ReadFile(filepath.Join(out, RecordName))
	if !bytes.Equal(got, want) {
		t.Errorf("the resumed export's record differs from an uninterrupted one's")
	}
	if _, err := os.Stat(filepath.Join(out, JournalName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the finished export left its journal: %v", err)
	}
	rep, err := VerifyExport(context.Background(), out, VerifyOptions{Checkpoint: c})
	if err != nil || !rep.OK || len(rep.Unlisted) != 0 {
		t.Fatalf("verify the resumed export: %v %+v", err, rep)
	}
	fi, _ := os.Stat(filepath.Join(out, RecordName))
	again, err := Export(context.Background(), c, m, Options{Out: out})
	if err != nil || again.Kept != again.Files {
		t.Fatalf("identical re-export: %v %+v", err, again)
	}
	if fi2, _ := os.Stat(filepath.Join(out, RecordName)); !fi2.ModTime().Equal(fi.ModTime()) {
		t.Error("an identical re-export rewrote the record")
	}
}
