package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/model/builtin"
)

// TestGPTQDryRunSequential: gptq --dry-run with --data sizes the work from
// --sequences and --seq-len (tokens, routed rows, forward passes, fits,
// scratch disk), and refuses, as the real run would, a model without
// tokenizer.json.
func TestGPTQDryRunSequential(t *testing.T) {
	root, model := builtinModel(t)
	data := "calib=" + filepath.Join(model, builtin.CalibText)
	work := func(seqs, seqLen string) map[string]any {
		t.Helper()
		code, so, se := runCLI(t, "gptq", "--model", model, "--data", data, "--layers", "experts", "--held-out", "2", "--asymmetric",
			"--sequences", seqs, "--seq-len", seqLen, "--dry-run", "--estimate", "0", "--json", "--out", filepath.Join(root, "never"))
		if code != exitOK {
			t.Fatalf("dry run: status %d\n%s\n%s", code, so, se)
		}
		var doc struct {
			Work struct {
				Sequential map[string]any `json:"sequential"`
			} `json:"work"`
		}
		if err := json.Unmarshal([]byte(so), &doc); err != nil || doc.Work.Sequential == nil {
			t.Fatalf("dry run --json: %v\n%s", err, so)
		}
		return doc.Work.Sequential
	}
	a, b := work("16", "256"), work("32", "512")
	// The built-in model: hidden 128, top-4 routing, 4 trunk layers and one
	// MTP layer.
	if a["tokens"].(float64) != 16*256 || a["routed_rows_per_layer"].(float64) != 14*256*4 || a["forward_token_layers"].(float64) != 5*2*16*256 ||
		a["scratch_bytes"].(float64) != 2*2*16*256*128*4 || a["fits"].(float64) == 0 {
		t.Errorf("16 × 256: %v", a)
	}
	if b["tokens"].(float64) != 4*a["tokens"].(float64) || b["scratch_bytes"].(float64) != 4*a["scratch_bytes"].(float64) {
		t.Errorf("32 × 512 is not four times 16 × 256: %v vs %v", b, a)
	}
	if _, err := os.Stat(filepath.Join(root, "never")); err == nil {
		t.Error("the dry run created the output directory")
	}
	// The disk a real run needs (the scratch streams and the checkpoint)
	// beside the free space where --out would be.
	if a["disk_bytes"] == nil || a["disk_bytes"].(float64) <= a["scratch_bytes"].(float64) || a["free_bytes"] == nil || a["free_bytes"].(float64) <= 0 {
		t.Errorf("16 × 256: no disk needed beyond the scratch, or no free space: %v", a)
	}
	code, so, _ := runCLI(t, "gptq", "--model", model, "--data", data, "--layers", "experts", "--sequences", "16", "--seq-len", "256",
		"--dry-run", "--estimate", "0", "--out", filepath.Join(root, "never"))
	if code != exitOK || !strings.Contains(so, "free on the file system of") {
		t.Errorf("dry run text: status %d, no free space reported:\n%s", code, so)
	}

	if err := os.Remove(filepath.Join(model, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	code, _, se := runCLI(t, "gptq", "--model", model, "--data", data, "--layers", "experts", "--dry-run", "--estimate", "0", "--out", filepath.Join(root, "never"))
	if code != exitError || !strings.Contains(se, "tokenizer.json") {
		t.Errorf("dry run without tokenizer.json: status %d, %s", code, se)
	}
}
