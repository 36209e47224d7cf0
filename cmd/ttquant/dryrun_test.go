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

// TestCalibBuildDryRun: calib build --dry-run writes nothing and gives the
// sequences, tokens, sites and activation bytes the real build writes,
// and with --shard the share each worker then reports, with a memory
// estimate that falls with the worker's tokens.
func TestCalibBuildDryRun(t *testing.T) {
	_, model := builtinModel(t)
	args := storeArgs(model)
	out := filepath.Join(t.TempDir(), "store")
	dry := func(extra ...string) calibDryRunDoc {
		t.Helper()
		code, stdout, errs := runCLI(t, append(append(append([]string{}, args...), "--out", out, "--dry-run", "--json"), extra...)...)
		if code != exitOK {
			t.Fatalf("calib build --dry-run: status %d\n%s", code, errs)
		}
		var doc calibDryRunDoc
		if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("the dry run created %s: %v", out, err)
		}
		return doc
	}
	doc := dry()
	w := doc.Work
	if !doc.DryRun || doc.SchemaVersion != schemaVersion || w.Shards != nil {
		t.Fatalf("dry run document %+v", doc)
	}
	code, stdout, errs := runCLI(t, append(append([]string{}, args...), "--out", out, "--json")...)
	if code != exitOK {
		t.Fatalf("calib build: status %d\n%s", code, errs)
	}
	var built calibBuildDoc
	if err := json.Unmarshal([]byte(stdout), &built); err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, s := range built.Sites {
		bytes += s.Tokens * int64(s.Cols) * 2
	}
	p := built.Provenance
	if w.Sequences != p.Sequences || w.Tokens != p.Tokens || w.Sites != len(built.Sites) || w.StoreBytes != bytes || w.MTPLayers != built.MTPLayers {
		t.Errorf("dry run: %d sequences, %d tokens, %d sites, %d bytes, %d MTP layers; the build: %d, %d, %d, %d, %d",
			w.Sequences, w.Tokens, w.Sites, w.StoreBytes, w.MTPLayers, p.Sequences, p.Tokens, len(built.Sites), bytes, built.MTPLayers)
	}
	out = filepath.Join(t.TempDir(), "split")
	sw := dry("--shard", "1/3").Work.Shards
	if sw == nil || sw.Workers != 3 || sw.Worker != 1 || len(sw.Shares) != 3 {
		t.Fatalf("dry run of worker 1/3: %+v", sw)
	}
	var tokens int64
	for _, s := range sw.Shares {
		tokens += s.Tokens
		if s.MemoryBytes >= w.MemoryBytes || s.MemoryBytes > sw.MaxMemoryBytes {
			t.Errorf("worker %d's memory %d: one process's %d, the largest worker's %d", s.Worker, s.MemoryBytes, w.MemoryBytes, sw.MaxMemoryBytes)
		}
	}
	if tokens != w.Tokens {
		t.Errorf("the workers' tokens sum to %d, the build has %d", tokens, w.Tokens)
	}
	code, stdout, errs = runCLI(t, append(append([]string{}, args...), "--out", out, "--shard", "1/3", "--json")...)
	if code != exitOK {
		t.Fatalf("worker 1/3: status %d\n%s", code, errs)
	}
	var wd calibWorkerDoc
	if err := json.Unmarshal([]byte(stdout), &wd); err != nil {
		t.Fatal(err)
	}
	if me := sw.Shares[1]; me.Units != wd.Units || me.WorkerUnits != wd.WorkerUnits || me.Sequences != wd.Sequences || me.Tokens != wd.Tokens {
		t.Errorf("dry run of worker 1/3: %+v; the worker did %+v", me.Split, wd)
	}
	code, stdout, _ = runCLI(t, append(append([]string{}, args...), "--dry-run", "--shard", "2/3")...)
	if code != exitOK || !strings.Contains(stdout, "memory per node  worker 2 about") || !strings.Contains(stdout, "units over 3 workers") {
		t.Errorf("text dry run: status %d\n%s", code, stdout)
	}
}
