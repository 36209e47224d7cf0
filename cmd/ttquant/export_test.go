package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

// TestExportTTNNCommand: export ttnn, verify --ttnn and inspect on a
// .tensorbin, end to end on the tiny model, with the shipped example map.
func TestExportTTNNCommand(t *testing.T) {
	src := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Write(src, testmodel.Tiny(), testmodel.SingleFile); err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(t.TempDir(), "native")
	if code, _, errs := runCLI(t, "convert", "--model", src, "--out", ckpt, "--quiet"); code != exitOK {
		t.Fatalf("convert: status %d\n%s", code, errs)
	}
	names := filepath.Join("..", "..", "manifest", "ttnn", "names", "qwen36-moe.example.json")
	out := filepath.Join(t.TempDir(), "ttnn")
	code, stdout, errs := runCLI(t, "export", "ttnn", ckpt, "--out", out, "--names", names, "--json")
	var r exportResult
	if code != exitOK || json.Unmarshal([]byte(stdout), &r) != nil || r.SchemaVersion != schemaVersion || r.Files == 0 || r.Tensors == 0 {
		t.Fatalf("export: status %d\n%s\n%s", code, stdout, errs)
	}
	if !strings.Contains(errs, "exported ") {
		t.Errorf("no progress on stderr:\n%s", errs)
	}
	if code, stdout, _ := runCLI(t, "verify", "--ttnn", out, ckpt); code != exitOK || !strings.Contains(stdout, "checked against the checkpoint") {
		t.Fatalf("verify --ttnn: status %d\n%s", code, stdout)
	}
	file := filepath.Join(out, "output.weight_dtype_BFLOAT8_B_layout_TILE.tensorbin")
	code, stdout, errs = runCLI(t, "inspect", file)
	if code != exitOK || !strings.Contains(stdout, "BFLOAT8_B TILE tile 32x32") || !strings.Contains(stdout, ": ok") {
		t.Fatalf("inspect: status %d\n%s\n%s", code, stdout, errs)
	}
	code, stdout, _ = runCLI(t, "inspect", file, "--json")
	var doc tensorbinDoc
	if code != exitOK || json.Unmarshal([]byte(stdout), &doc) != nil || doc.Check != "ok" || !doc.Aligned64 || doc.DType != "BFLOAT8_B" {
		t.Fatalf("inspect --json: status %d\n%s", code, stdout)
	}

	// A truncated payload: inspect shows the header and fails the size
	// check; verify --ttnn fails.
	data, _ := os.ReadFile(file)
	if err := os.WriteFile(file, data[:len(data)-64], 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, errs = runCLI(t, "inspect", file)
	if code != exitVerifyKO || !strings.Contains(stdout, "spec ") || !strings.Contains(errs, "past the data region") {
		t.Errorf("inspect of a truncated file: status %d\n%s\n%s", code, stdout, errs)
	}
	if code, stdout, _ := runCLI(t, "verify", "--ttnn", out); code != exitVerifyKO || !strings.Contains(stdout, "FAIL") {
		t.Errorf("verify --ttnn of a damaged export: status %d\n%s", code, stdout)
	}

	for _, args := range [][]string{
		{"export"},
		{"export", "onnx", ckpt},
		{"export", "ttnn", ckpt, "--out", out},
		{"export", "ttnn", ckpt, "--names", names},
		{"export", "ttnn", "--out", out, "--names", names},
		{"export", "ttnn", ckpt, "--out", out, "--names", names, "--mesh", "0x2"},
		{"export", "ttnn", ckpt, "--out", out, "--names", names, "--mesh", "2x2x2"},
		{"export", "ttnn", ckpt, "--out", out, "--names", names, "--memory-config", "block-sharded"},
		{"verify", "--ttnn", out, "a", "b"},
	} {
		if code, _, _ := runCLI(t, args...); code != exitUsage {
			t.Errorf("%v: status %d, want %d", args, code, exitUsage)
		}
	}
	// The same export again keeps the files that check and rewrites the
	// damaged one; then it keeps every file.
	code, stdout, errs = runCLI(t, "export", "ttnn", ckpt, "--out", out, "--names", names, "--quiet", "--json")
	var again exportResult
	if code != exitOK || json.Unmarshal([]byte(stdout), &again) != nil || again.Kept != r.Files-1 || again.Files != r.Files {
		t.Errorf("the same export over a damaged one: status %d, kept %d of %d files\n%s\n%s", code, again.Kept, r.Files, stdout, errs)
	}
	if code, stdout, _ := runCLI(t, "export", "ttnn", ckpt, "--out", out, "--names", names, "--quiet"); code != exitOK || !strings.Contains(stdout, "already exported") {
		t.Errorf("an identical re-export: status %d\n%s", code, stdout)
	}
	if code, _, _ := runCLI(t, "verify", "--ttnn", out, ckpt); code != exitOK {
		t.Errorf("verify after the repeated export: status %d", code)
	}
	// Another export (another mesh) is not written over this one without
	// --overwrite.
	if code, _, errs := runCLI(t, "export", "ttnn", ckpt, "--out", out, "--names", names, "--quiet", "--mesh", "1x2"); code != exitError || !strings.Contains(errs, "--overwrite") {
		t.Errorf("another export over an earlier one: status %d\n%s", code, errs)
	}
	if code, _, errs := runCLI(t, "export", "ttnn", ckpt, "--out", out, "--names", names, "--quiet", "--mesh", "1x2", "--overwrite"); code != exitOK {
		t.Errorf("export --overwrite: status %d\n%s", code, errs)
	}
	if code, _, _ := runCLI(t, "verify", "--ttnn", out, ckpt); code != exitOK {
		t.Errorf("verify after --overwrite: status %d", code)
	}
}

func TestParseMesh(t *testing.T) {
	for s, want := range map[string][2]uint32{"1x1": {1, 1}, "2x4": {2, 4}, "8": {1, 8}, "1X32": {1, 32}} {
		got, err := parseMesh(s)
		if err != nil || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("%s: %v %v", s, got, err)
		}
	}
	for _, s := range []string{"", "x", "0x1", "1x-2", "2x2x2", "1x5000", "100x100", "a"} {
		if _, err := parseMesh(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

// TestExportBuiltinNameMap: --names takes the name of a map built into the
// binary, so an installed ttquant needs no source tree; it is the same map
// as the file in the repository (the same names_sha256). An unknown name
// is an error listing the built-in ones.
func TestExportBuiltinNameMap(t *testing.T) {
	src := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Write(src, testmodel.Tiny(), testmodel.SingleFile); err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(t.TempDir(), "native")
	if code, _, errs := runCLI(t, "convert", "--model", src, "--out", ckpt, "--quiet"); code != exitOK {
		t.Fatalf("convert: status %d\n%s", code, errs)
	}
	file := filepath.Join("..", "..", "manifest", "ttnn", "names", "qwen36-moe.example.json")
	byFile, byName := filepath.Join(t.TempDir(), "file"), filepath.Join(t.TempDir(), "name")
	if code, _, errs := runCLI(t, "export", "ttnn", ckpt, "--out", byFile, "--names", file, "--quiet"); code != exitOK {
		t.Fatalf("export --names FILE: status %d\n%s", code, errs)
	}
	if code, _, errs := runCLI(t, "export", "ttnn", ckpt, "--out", byName, "--names", "qwen36-moe.example", "--quiet"); code != exitOK {
		t.Fatalf("export --names qwen36-moe.example: status %d\n%s", code, errs)
	}
	a, _ := os.ReadFile(filepath.Join(byFile, "ttnn_export.json"))
	b, _ := os.ReadFile(filepath.Join(byName, "ttnn_export.json"))
	if len(a) == 0 || string(a) != string(b) {
		t.Errorf("the built-in map's export differs from the file's")
	}
	code, _, errs := runCLI(t, "export", "ttnn", ckpt, "--out", filepath.Join(t.TempDir(), "x"), "--names", "no-such-map", "--quiet")
	if code != exitUsage || !strings.Contains(errs, "qwen36-moe.example") {
		t.Errorf("--names no-such-map: status %d\n%s", code, errs)
	}
	if code, out, _ := runCLI(t, "export", "ttnn", "-h"); code != exitOK || !strings.Contains(out, "qwen36-moe.example") {
		t.Errorf("export ttnn -h does not name the built-in maps:\n%s", out)
	}
}

// TestDefaultBuildExportsForTTMetal: a default build of the built-in model
// (convert, preset qwen36-35b-a3b) exports to ttnn with the built-in map
// with no refusal: every tensor is written, every BFP file transposed, the
// [in, out] layout tt-metal's linear reads, copied from the stored bytes.
// The same build on the input axis (--axis input) is refused before
// anything is written, naming the axis to build with. An --axis that is
// not an axis is a usage error of every command that takes a plan, before
// any work.
func TestDefaultBuildExportsForTTMetal(t *testing.T) {
	root, model := builtinModel(t)
	ckpt := filepath.Join(root, "native")
	if code, _, errs := runCLI(t, "convert", "--model", model, "--out", ckpt, "--quiet"); code != exitOK {
		t.Fatalf("convert: status %d\n%s", code, errs)
	}
	out := filepath.Join(root, "ttnn")
	code, stdout, errs := runCLI(t, "export", "ttnn", ckpt, "--out", out, "--names", "qwen36-moe.example", "--quiet", "--json")
	var r exportResult
	if code != exitOK || json.Unmarshal([]byte(stdout), &r) != nil {
		t.Fatalf("export of the default build: status %d\n%s\n%s", code, stdout, errs)
	}
	man, err := os.ReadFile(filepath.Join(ckpt, "native_manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Tensors []struct {
			Name, Format, Orientation string
		} `json:"tensors"`
	}
	if err := json.Unmarshal(man, &m); err != nil {
		t.Fatal(err)
	}
	nBFP := 0
	for _, tn := range m.Tensors {
		if strings.HasPrefix(tn.Format, "BFP") {
			nBFP++
			if tn.Orientation != "transposed" {
				t.Errorf("%s: %s stored %q by the default build", tn.Name, tn.Format, tn.Orientation)
			}
		}
	}
	if r.Tensors != len(m.Tensors) || nBFP == 0 {
		t.Fatalf("exported %d of %d tensors (%d BFP)", r.Tensors, len(m.Tensors), nBFP)
	}
	rec, err := os.ReadFile(filepath.Join(out, "ttnn_export.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Files []struct {
			Name, DType string
			Transpose   bool
			Sources     []json.RawMessage
		} `json:"files"`
	}
	if err := json.Unmarshal(rec, &doc); err != nil {
		t.Fatal(err)
	}
	bfpSources := 0
	for _, f := range doc.Files {
		if strings.HasPrefix(f.DType, "BFLOAT8_B") || strings.HasPrefix(f.DType, "BFLOAT4_B") {
			bfpSources += len(f.Sources)
			if !f.Transpose {
				t.Errorf("%s: not written transposed", f.Name)
			}
		}
	}
	if bfpSources != nBFP {
		t.Errorf("%d BFP tensors exported, the checkpoint has %d", bfpSources, nBFP)
	}
	if code, stdout, _ := runCLI(t, "verify", "--ttnn", out, ckpt); code != exitOK {
		t.Fatalf("verify --ttnn: status %d\n%s", code, stdout)
	}

	in := filepath.Join(root, "native-input")
	if code, _, errs := runCLI(t, "convert", "--model", model, "--out", in, "--axis", "input", "--quiet"); code != exitOK {
		t.Fatalf("convert --axis input: status %d\n%s", code, errs)
	}
	outIn := filepath.Join(root, "ttnn-input")
	if code, _, errs := runCLI(t, "export", "ttnn", in, "--out", outIn, "--names", "qwen36-moe.example", "--quiet"); code != exitError || !strings.Contains(errs, `orientation "row"`) || !strings.Contains(errs, "--axis output") {
		t.Errorf("export of the input-axis build: status %d\n%s", code, errs)
	}
	if _, err := os.Stat(outIn); !os.IsNotExist(err) {
		t.Errorf("the refused export wrote %s", outIn)
	}

	bad := filepath.Join(root, "bad")
	for _, args := range [][]string{
		{"convert", "--model", model, "--out", bad, "--axis", "rows"},
		{"gptq", "--model", model, "--out", bad, "--data", "calib=" + filepath.Join(model, "calib.jsonl"), "--axis", "columns"},
		{"plan", "--model", model, "--axis", "sideways"},
		{"calib", "quantize", "--model", model, "--store", filepath.Join(root, "no-store"), "--axis", "rows"},
	} {
		if code, _, errs := runCLI(t, args...); code != exitUsage || !strings.Contains(errs, "--axis") {
			t.Errorf("%s: status %d, stderr %q; want %d naming --axis", strings.Join(args, " "), code, errs, exitUsage)
		}
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Errorf("a bad --axis wrote %s", bad)
	}
}
