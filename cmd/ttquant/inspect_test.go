package main

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/model/builtin"
	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/safetensors"
)

func TestInspectFileAndShards(t *testing.T) {
	dir := t.TempDir()
	one := filepath.Join(dir, "model-00001-of-00002.safetensors")
	two := filepath.Join(dir, "model-00002-of-00002.safetensors")
	if err := safetensors.WriteFile(one, []safetensors.Tensor{
		{Name: "embed.weight", DType: safetensors.BF16, Shape: []int64{4, 2}, Data: make([]byte, 16)},
		{Name: "norm.weight", DType: safetensors.F32, Shape: []int64{2}, Data: make([]byte, 8)},
	}, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(two, []safetensors.Tensor{
		{Name: "lm_head.weight", DType: safetensors.BF16, Shape: []int64{4, 2}, Data: make([]byte, 16)},
	}, nil); err != nil {
		t.Fatal(err)
	}
	x, err := safetensors.BuildIndex(dir, []string{filepath.Base(one), filepath.Base(two)})
	if err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteIndex(filepath.Join(dir, safetensors.IndexFileName), x); err != nil {
		t.Fatal(err)
	}

	code, out, errs := runCLI(t, "inspect", one)
	if code != exitOK {
		t.Fatalf("inspect file: status %d, stderr %s", code, errs)
	}
	for _, want := range []string{"embed.weight", "BF16", "[4,2]", "16", "model-00001-of-00002.safetensors", "2 tensors, 24 bytes in 1 file(s)", `format="pt"`} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect file output lacks %q:\n%s", want, out)
		}
	}

	for _, p := range []string{dir, filepath.Join(dir, safetensors.IndexFileName)} {
		code, out, errs = runCLI(t, "inspect", p, "--json")
		if code != exitOK {
			t.Fatalf("inspect %s: status %d, stderr %s", p, code, errs)
		}
		var doc inspectDoc
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		if doc.SchemaVersion != schemaVersion || doc.Totals == nil || doc.Totals.Tensors != 3 || doc.Totals.Bytes != 40 ||
			doc.Totals.Files != 2 || doc.Totals.ByDType["BF16"] != 32 {
			t.Errorf("inspect %s --json: %+v totals %+v", p, doc, doc.Totals)
		}
		if len(doc.Tensors) != 3 || doc.Tensors[1].Name != "lm_head.weight" || doc.Tensors[1].Shard != "model-00002-of-00002.safetensors" {
			t.Errorf("tensors %+v", doc.Tensors)
		}
	}
}

func TestInspectBadFile(t *testing.T) {
	dir := testdata.Dir(t, "safetensors")
	bad := filepath.Join(dir, "invalid", "e_off_gap.safetensors")
	code, out, errs := runCLI(t, "inspect", bad)
	if code != exitError || out != "" {
		t.Errorf("bad file: status %d, stdout %q", code, out)
	}
	if !strings.Contains(errs, "InvalidOffset") || !strings.Contains(errs, "e_off_gap.safetensors") {
		t.Errorf("stderr does not give the error kind and file: %q", errs)
	}
	code, out, _ = runCLI(t, "inspect", "--json", bad)
	var doc inspectDoc
	if code != exitError || json.Unmarshal([]byte(out), &doc) != nil || doc.ErrorKind != "InvalidOffset" {
		t.Errorf("bad file --json: status %d, output %q", code, out)
	}
}

func TestInspectUsage(t *testing.T) {
	if code, _, _ := runCLI(t, "inspect"); code != exitUsage {
		t.Errorf("no path: status %d", code)
	}
	if code, _, _ := runCLI(t, "inspect", "a", "b"); code != exitUsage {
		t.Errorf("two paths: status %d", code)
	}
	missing := filepath.Join(t.TempDir(), "none.safetensors")
	if code, _, errs := runCLI(t, "inspect", missing); code != exitError || !strings.Contains(errs, "none.safetensors") {
		t.Errorf("missing file: status %d, stderr %q", code, errs)
	}
}

// TestInspectHugeDimension: a dimension above 2⁶³−1 (legal in a tensor
// with no elements) is printed exactly, in the table and in JSON.
func TestInspectHugeDimension(t *testing.T) {
	hdr := []byte(`{"huge":{"dtype":"F32","shape":[18446744073709551615,0],"data_offsets":[0,0]}}`)
	for len(hdr)%8 != 0 {
		hdr = append(hdr, ' ')
	}
	file := make([]byte, 8, 8+len(hdr))
	binary.LittleEndian.PutUint64(file, uint64(len(hdr)))
	file = append(file, hdr...)
	path := filepath.Join(t.TempDir(), "huge.safetensors")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "inspect", path)
	if code != exitOK || !strings.Contains(out, "[18446744073709551615,0]") {
		t.Fatalf("inspect: status %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, _ = runCLI(t, "inspect", "--json", path)
	if code != exitOK || !strings.Contains(out, "18446744073709551615") || strings.Contains(out, "-1") {
		t.Fatalf("inspect --json: status %d, stdout %q", code, out)
	}
}

// TestInspectCheckpoint: inspect of a native checkpoint directory shows
// each tensor as the checkpoint means it (stored format, logical shape,
// the plan rule that chose it, the method) and the calibration summary,
// instead of the raw U8 blobs of its safetensors files.
func TestInspectCheckpoint(t *testing.T) {
	root, model := builtinModel(t)
	ckpt := filepath.Join(root, "ckpt")
	if code, _, errs := runCLI(t, "gptq", "--model", model, "--data", "calib="+filepath.Join(model, builtin.CalibText), "--sequences", "4", "--seq-len", "64",
		"--held-out", "1", "--out", ckpt, "--quiet"); code != exitOK {
		t.Fatalf("gptq: status %d\n%s", code, errs)
	}
	code, out, errs := runCLI(t, "inspect", ckpt)
	if code != exitOK {
		t.Fatalf("inspect: status %d\n%s", code, errs)
	}
	if strings.Contains(out, "U8") {
		t.Errorf("inspect of a checkpoint lists raw U8 blobs:\n%s", out)
	}
	for _, want := range []string{"identity", "plan qwen36-35b-a3b", "calibration  sequential: 4 sequences, 256 tokens (1 held out)",
		"text calib (jsonl)", "AS_IS(BF16)"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	// The preset's axis is output (the layout tt-metal's linear reads).
	expert := regexp.MustCompile(`(?m)^mtp\.layers\.0\.mlp\.experts\.15\.down_proj +BFP4_b +\[128 128\] +6 \S+ +gptq/output `)
	if !expert.MatchString(out) {
		t.Errorf("no line with the expert's format, logical shape, rule and method:\n%s", out)
	}
	code, out, _ = runCLI(t, "inspect", ckpt, "--json")
	var doc struct {
		SchemaVersion int    `json:"schema_version"`
		Identity      string `json:"identity"`
		Calibration   struct {
			Mode      string `json:"mode"`
			Sequences int    `json:"sequences"`
		} `json:"calibration"`
		Tensors []struct {
			Name    string  `json:"name"`
			Format  string  `json:"format"`
			Shape   []int64 `json:"shape"`
			Rule    int     `json:"rule"`
			Pattern string  `json:"pattern"`
			Method  string  `json:"method"`
		} `json:"tensors"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &doc) != nil || doc.SchemaVersion != schemaVersion || len(doc.Identity) != 64 ||
		doc.Calibration.Mode != "sequential" || doc.Calibration.Sequences != 4 || len(doc.Tensors) != 241 {
		t.Fatalf("inspect --json: status %d\n%.2000s", code, out)
	}
	for _, tn := range doc.Tensors {
		if tn.Format == "" || len(tn.Shape) == 0 || tn.Rule < 1 || tn.Pattern == "" || tn.Method == "" {
			t.Errorf("tensor %+v: want format, shape, rule, pattern and method", tn)
			break
		}
	}
}
