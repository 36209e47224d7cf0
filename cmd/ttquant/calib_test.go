package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/testmodel"
)

func TestCalibCommands(t *testing.T) {
	model := filepath.Join(t.TempDir(), "tiny")
	if err := testmodel.Write(model, testmodel.Tiny(), testmodel.Default); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(t.TempDir(), "store")
	code, out, errs := runCLI(t, "calib", "synth", "--model", model, "--out", store, "--sequences", "8", "--seq-len", "128")
	if code != exitOK || !strings.Contains(out, "15 sites") {
		t.Fatalf("calib synth: status %d\nstdout %s\nstderr %s", code, out, errs)
	}
	// Flags after the positional argument.
	code, out, errs = runCLI(t, "calib", "stats", store, "--model", model, "--json")
	if code != exitOK {
		t.Fatalf("calib stats: status %d\n%s", code, errs)
	}
	var doc struct {
		SchemaVersion int `json:"schema_version"`
		Provenance    struct {
			Model  string `json:"model"`
			Tokens int64  `json:"tokens"`
		} `json:"provenance"`
		Sites   []struct{ Layer int } `json:"sites"`
		Routing []struct {
			Layer   int     `json:"layer"`
			Counts  []int64 `json:"counts"`
			Starved []int   `json:"starved"`
		} `json:"routing"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("calib stats --json: %v\n%s", err, out)
	}
	if doc.SchemaVersion != schemaVersion || doc.Provenance.Model != "synthetic" || doc.Provenance.Tokens != 1024 ||
		len(doc.Sites) != 15 || len(doc.Routing) != 5 || doc.Routing[4].Layer != 4 || len(doc.Routing[2].Counts) != 16 || doc.Routing[2].Starved == nil {
		t.Errorf("calib stats --json: %+v", doc)
	}
	var sum int64
	for _, c := range doc.Routing[0].Counts {
		sum += c
	}
	if sum != 1024*4 {
		t.Errorf("layer 0 routes %d token-expert pairs, want %d", sum, 1024*4)
	}
	code, out, _ = runCLI(t, "calib", "stats", store, "--model", model)
	if code != exitOK || !strings.Contains(out, "layer 3 routing") || !strings.Contains(out, "mlp") {
		t.Errorf("calib stats text: status %d\n%s", code, out)
	}

	code, out, errs = runCLI(t, "calib", "quantize", "--model", model, "--store", store, "--layers", "3", "--workers", "2", "--json")
	if code != exitOK {
		t.Fatalf("calib quantize: status %d\n%s", code, errs)
	}
	var q struct {
		SchemaVersion int `json:"schema_version"`
		Layers        []struct {
			Layer   int `json:"layer"`
			Experts []struct {
				Expert int `json:"expert"`
			} `json:"experts"`
			HeldOut struct {
				Tokens int     `json:"tokens"`
				Ratio  float64 `json:"ratio"`
			} `json:"held_out"`
		} `json:"layers"`
	}
	if err := json.Unmarshal([]byte(out), &q); err != nil {
		t.Fatalf("calib quantize --json: %v\n%s", err, out)
	}
	// One GPTQ layer keeps the test fast in purego builds; the RTN run
	// below takes a list, with the MTP layer (4, tensors mtp.layers.0.*).
	if q.SchemaVersion != schemaVersion || len(q.Layers) != 1 {
		t.Fatalf("calib quantize: %+v", q)
	}
	for i, l := range q.Layers {
		if l.Layer != []int{3}[i] || len(l.Experts) != 16 || l.HeldOut.Tokens != 256 || l.HeldOut.Ratio <= 0 || l.HeldOut.Ratio > 0.8 {
			t.Errorf("calib quantize layer %d: %+v", l.Layer, l)
		}
	}
	for _, bad := range []string{"9", "1,x", "-1"} {
		if code, _, _ := runCLI(t, "calib", "quantize", "--model", model, "--store", store, "--layers", bad); code != exitUsage {
			t.Errorf("--layers %s: status %d, want %d", bad, code, exitUsage)
		}
	}
	code, out, _ = runCLI(t, "calib", "quantize", "--model", model, "--store", store, "--layers", "0,4", "--method", "rtn")
	if code != exitOK || !strings.Contains(out, "layer 0: BFP4_b output-axis, method rtn") || !strings.Contains(out, "layer 4: BFP4_b output-axis, method rtn") || !strings.Contains(out, "ratio 1.000") {
		t.Errorf("calib quantize text: status %d\n%s", code, out)
	}
}

func TestCalibUsage(t *testing.T) {
	for _, args := range [][]string{
		{"calib"},
		{"calib", "frobnicate"},
		{"calib", "stats"},
		{"calib", "stats", "a", "b"},
		{"calib", "synth", "--out", "x"},
		{"calib", "quantize", "--model", "m"},
		{"calib", "quantize", "--model", "m", "--store", "s", "--starved", "never"},
	} {
		if code, _, _ := runCLI(t, args...); code != exitUsage {
			t.Errorf("%q: status %d, want %d", args, code, exitUsage)
		}
	}
	code, _, errs := runCLI(t, "calib", "stats", filepath.Join(t.TempDir(), "none"))
	if code != exitError || !strings.Contains(errs, "calibration.json") {
		t.Errorf("missing store: status %d, stderr %q", code, errs)
	}
}

// TestCalibBuildThenGPTQ: calib build writes a store from the trained
// model's calibration text; gptq accepts it without
// --allow-synthetic-calibration, and the checkpoint verifies against the
// source.
func TestCalibBuildThenGPTQ(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	store := filepath.Join(t.TempDir(), "store")
	code, out, errs := runCLI(t, "calib", "build", "--model", model, "--data", filepath.Join(model, "calib.jsonl"),
		"--out", store, "--sequences", "3", "--seq-len", "32", "--quiet")
	if code != exitOK || !strings.Contains(out, "15 sites of 5 layers (4 trunk, 1 MTP), 3 sequences, 96 tokens") {
		t.Fatalf("calib build: status %d\nstdout %s\nstderr %s", code, out, errs)
	}
	code, out, errs = runCLI(t, "calib", "stats", store, "--json")
	if code != exitOK || strings.Contains(out, `"synthetic"`) || !strings.Contains(out, "calib.jsonl") {
		t.Errorf("calib stats of a text store: status %d\n%s\n%s", code, out, errs)
	}
	// calib quantize --layers all covers the layers with MoE inputs: the
	// trunk's and the MTP layer's (its rows split by sequence like the
	// others).
	code, out, errs = runCLI(t, "calib", "quantize", "--model", model, "--store", store, "--held-out", "1", "--json")
	if code != exitOK || strings.Count(out, `"held_out"`) != 5 {
		t.Errorf("calib quantize on a text store: status %d\n%s\n%s", code, out, errs)
	}
	dst := filepath.Join(t.TempDir(), "native")
	code, out, errs = runCLI(t, "gptq", "--model", model, "--calib", store, "--out", dst, "--held-out", "1", "--quiet")
	if code != exitOK {
		t.Fatalf("gptq on a text store: status %d\n%s\n%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "verify", dst, "--source", model); code != exitOK {
		t.Errorf("verify: status %d\n%s\n%s", code, out, errs)
	}
	// Bad options are usage errors naming the flag.
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"calib", "build", "--model", model, "--out", store}, "--data"},
		{[]string{"calib", "build", "--model", model, "--data", filepath.Join(model, "calib.jsonl"), "--out", store, "--sequences", "0"}, "--sequences"},
		{[]string{"calib", "build", "--model", model, "--data", filepath.Join(model, "calib.jsonl"), "--out", store, "--dtype", "F16"}, "--dtype"},
	} {
		if code, _, errs := runCLI(t, c.args...); code != exitUsage || !strings.Contains(errs, c.flag) {
			t.Errorf("%v: status %d, stderr %q", c.args, code, errs)
		}
	}
}

// TestCalibBuildShortText: text shorter than --sequences × --seq-len is an
// error naming the numbers and the flag; with --allow-short the build
// proceeds and --json says how many tokens were asked for.
func TestCalibBuildShortText(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	data := filepath.Join(t.TempDir(), "short.jsonl")
	var recs []string
	for i := 0; i < 6; i++ {
		recs = append(recs, fmt.Sprintf(`{"corpus": "prose", "text": "record %d: a few words of text to calibrate on"}`, i))
	}
	if err := os.WriteFile(data, []byte(strings.Join(recs, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(t.TempDir(), "store")
	args := []string{"calib", "build", "--model", model, "--data", data, "--out", store, "--sequences", "8", "--seq-len", "32", "--eval-fraction", "0.01", "--quiet"}
	code, _, errs := runCLI(t, args...)
	if code != exitError || !strings.Contains(errs, "8 sequences × 32 tokens = 256 tokens") || !strings.Contains(errs, "--allow-short") {
		t.Fatalf("short text: status %d, stderr %q", code, errs)
	}
	code, out, errs := runCLI(t, append(args, "--allow-short", "--json")...)
	if code != exitOK {
		t.Fatalf("--allow-short: status %d\n%s\n%s", code, out, errs)
	}
	var doc struct {
		SchemaVersion int   `json:"schema_version"`
		AskedTokens   int64 `json:"asked_tokens"`
		MTPLayers     int   `json:"mtp_layers"`
		Provenance    struct {
			Tokens int64 `json:"tokens"`
		} `json:"provenance"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if doc.SchemaVersion != schemaVersion || doc.AskedTokens != 256 || doc.Provenance.Tokens == 0 || doc.Provenance.Tokens >= 256 || doc.MTPLayers != 1 {
		t.Errorf("--json document %+v", doc)
	}
}
