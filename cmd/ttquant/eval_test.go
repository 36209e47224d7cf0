package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/internal/testdata"
)

func TestEvalUsageErrors(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	data := filepath.Join(model, "eval-dev.jsonl")
	ok := []string{"eval", "--model", model, "--data", data, "--eval-fraction", "1", "--eval-sequences", "1", "--quiet"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"eval", "--data", data, "--eval-sequences", "1", "x"}, "--model"},
		{ok, "no checkpoint"},
		{append(ok[:len(ok):len(ok)], "--numerics", "gpu", "x"), "--numerics"},
		{append(ok[:len(ok):len(ok)], "--numerics", "device:HiFi5", "x"), "--numerics"},
		{append(ok[:len(ok):len(ok)], "--numerics", "device:", "x"), "--numerics"},
		{append(ok[:len(ok):len(ok)], "--numerics", "devices", "x"), "--numerics"},
		{append(ok[:len(ok):len(ok)], "--kv-cache", "f16", "x"), "--kv-cache"},
		{append(ok[:len(ok):len(ok)], "--workers", "-1", "x"), "--workers"},
		{append(ok[:len(ok):len(ok)], "--labels", "a,b", "x"), "--labels"},
		{append(ok[:len(ok):len(ok)], "--labels", "self", "x"), "--labels"},
		{append(ok[:len(ok):len(ok)], "--sequences", "4", "x"), "--calib-data"},
		{append(ok[:len(ok):len(ok)], "--calib-data", data, "x"), "--sequences"},
		{append(ok[:len(ok):len(ok)], "--calib-data", data, "--sequences", "2", "--calib-fraction", "1", "x"), "--calib-fraction"},
		{append(ok[:len(ok):len(ok)], "--eval-fraction", "1.5", "x"), "--eval-fraction"},
		{append(ok[:len(ok):len(ok)], "--seq-len", "256", "x"), "--seq-len"},
		{append(ok[:len(ok):len(ok)], "--calib-fraction", "0.2", "x"), "--calib-fraction"},
		{append(ok[:len(ok):len(ok)], "--eval-mode", "window", "x"), "--eval-mode"},
		// Without --eval-sequences every record is its own window: the
		// flags that shape sequences do not apply.
		{[]string{"eval", "--model", model, "--data", data, "--eval-mode", "record", "x"}, "--eval-sequences"},
		{append(ok[:len(ok):len(ok)], "--max-overlap", "1", "x"), "--max-overlap"},
		{[]string{"eval", "--model", model, "--eval-sequences", "1", "x"}, "--data"},
		// A split evaluation's flags, by the harness's rules, named as
		// flags.
		{append(ok[:len(ok):len(ok)], "--shard", "0/3", "x"), "--shard 0/3 needs --parts"},
		{append(ok[:len(ok):len(ok)], "--parts", "p", "x"), "--parts is for the workers of a split evaluation (--shard i/N)"},
		{append(ok[:len(ok):len(ok)], "--shard", "1/3", "--parts", "p", "--assemble", "p", "x"), "--assemble merges the workers' parts; give it without --shard"},
		{append(ok[:len(ok):len(ok)], "--shard", "1/3", "--parts", "p", "--svg", "x.svg", "x"), "--svg pictures the merged table"},
		{[]string{"eval", "--bogus"}, ""},
	} {
		code, _, errs := runCLI(t, c.args...)
		if code != exitUsage || !strings.Contains(errs, c.want) {
			t.Errorf("%q: status %d, stderr %q; want %d naming %q", c.args[1:], code, errs, exitUsage, c.want)
		}
	}
	// -h prints the flags on stdout and exits 0, as for every subcommand.
	if code, out, _ := runCLI(t, "eval", "-h"); code != exitOK || !strings.Contains(out, "-calib-data SPEC") || !strings.Contains(out, "-numerics") {
		t.Errorf("-h: status %d, stdout %q", code, out)
	}
}

// TestEvalCheckpoints converts the trained model losslessly (every tensor
// kept as stored) and with the 35B preset (BFP4 experts, BFP8 dense), and
// evaluates both on one 128-token window: the lossless checkpoint gives
// ΔPPL 0, top-1 1 and KL 0 exactly; the quantized one a small positive KL.
func TestEvalCheckpoints(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	dir := t.TempDir()
	plan := filepath.Join(dir, "lossless.json")
	if err := os.WriteFile(plan, []byte(`{"plan_version": 1, "name": "lossless", "rules": [{"pattern": "*", "format": "AS_IS", "method": "none"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	lossless, rtn := filepath.Join(dir, "lossless"), filepath.Join(dir, "rtn")
	for _, args := range [][]string{{"--out", lossless, "--plan", plan}, {"--out", rtn}} {
		if code, _, errs := runCLI(t, append([]string{"convert", "--model", model, "--quiet"}, args...)...); code != exitOK {
			t.Fatalf("convert %v: status %d, stderr %s", args, code, errs)
		}
	}
	common := []string{"eval", "--model", model, "--data", "dev=" + filepath.Join(model, "eval-dev.jsonl"), "--eval-fraction", "1",
		"--eval-sequences", "1", "--eval-seq-len", "128", "--labels", "lossless,RTN"}
	code, out, errs := runCLI(t, append(common, "--json", lossless, rtn)...)
	if code != exitOK {
		t.Fatalf("eval: status %d, stderr %s", code, errs)
	}
	if !strings.Contains(errs, "ETA") {
		t.Errorf("no progress line with an ETA on stderr: %q", errs)
	}
	var doc struct {
		SchemaVersion int `json:"schema_version"`
		Candidates    []struct {
			Label    string `json:"label"`
			Identity struct {
				Identity string `json:"identity"`
			} `json:"identity"`
			Rows []struct {
				Corpus  string   `json:"corpus"`
				Tokens  int64    `json:"tokens"`
				RefPPL  *float64 `json:"ref_ppl"`
				CandPPL *float64 `json:"cand_ppl"`
				Delta   *float64 `json:"delta_ppl_percent"`
				Top1    *float64 `json:"top1_agreement"`
				MeanKL  *float64 `json:"mean_kl"`
				P99KL   *float64 `json:"p99_kl"`
			} `json:"rows"`
		} `json:"candidates"`
		Data struct {
			Provenance struct {
				Sources []struct {
					Files []struct {
						SHA256 string `json:"sha256"`
					} `json:"files"`
				} `json:"sources"`
			} `json:"provenance"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if doc.SchemaVersion != 1 || len(doc.Candidates) != 2 || len(doc.Data.Provenance.Sources) != 1 || doc.Data.Provenance.Sources[0].Files[0].SHA256 == "" {
		t.Fatalf("--json document: %+v", doc)
	}
	for i, c := range doc.Candidates {
		if len(c.Identity.Identity) != 64 {
			t.Errorf("%s: identity %q", c.Label, c.Identity.Identity)
		}
		for _, r := range c.Rows {
			if r.Tokens != 127 || r.Delta == nil || r.Top1 == nil || r.MeanKL == nil || r.P99KL == nil {
				t.Fatalf("%s %s: row %+v", c.Label, r.Corpus, r)
			}
			if i == 0 && (*r.Delta != 0 || *r.Top1 != 1 || *r.MeanKL != 0 || *r.P99KL != 0) {
				t.Errorf("lossless %s: ΔPPL %v, top-1 %v, mean KL %v, p99 KL %v; want 0, 1, 0, 0 exactly", r.Corpus, *r.Delta, *r.Top1, *r.MeanKL, *r.P99KL)
			}
			if i == 1 && !(*r.MeanKL > 0 && *r.MeanKL < 0.1 && *r.Top1 > 0.8) {
				t.Errorf("RTN %s: mean KL %v, top-1 %v; want a small positive KL", r.Corpus, *r.MeanKL, *r.Top1)
			}
		}
	}
	// A checkpoint evaluated against another source is refused.
	other := filepath.Join(dir, "other")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(model, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "tokenizer_config.json" {
			b = append(b, ' ')
		}
		if err := os.WriteFile(filepath.Join(other, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bad := append([]string{"eval", "--model", other}, common[3:]...)
	if code, _, errs := runCLI(t, append(bad, "--quiet", lossless, rtn)...); code != exitError || !strings.Contains(errs, "was not built from") || !strings.Contains(errs, "tokenizer_config.json") {
		t.Errorf("other source: status %d, stderr %q", code, errs)
	}

	// Markdown, reading the weights per window (--stream): the same numbers.
	all := doc.Candidates[1].Rows[len(doc.Candidates[1].Rows)-1]
	row := fmt.Sprintf("| **all** | 127 | %s → %s | %s | %s | %s | %s |", eval.FormatPPL(*all.RefPPL), eval.FormatPPL(*all.CandPPL),
		eval.FormatDelta(*all.Delta), eval.FormatTop1(*all.Top1), eval.FormatKL(*all.MeanKL), eval.FormatKL(*all.P99KL))
	code, out, errs = runCLI(t, append(common, "--quiet", "--stream", lossless, rtn)...)
	if code != exitOK || !strings.Contains(out, "### Comparison") || !strings.Contains(out, row) || errs != "" {
		t.Errorf("Markdown: status %d, stdout %s, stderr %q; want the row %s", code, out, errs, row)
	}
}

// TestEvalDeviceNumerics evaluates the trained model's RTN checkpoint (the
// 35B preset's rules) on one 64-token window in float32 and with device
// numerics: the device runs differ from the float32 run, but only slightly
// (their mean KL within a factor of two of the float32 run's, top-1 within
// 0.05), the result records the numerics, and the source evaluated against
// itself stays exact.
func TestEvalDeviceNumerics(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	rtn := filepath.Join(t.TempDir(), "rtn")
	if code, _, errs := runCLI(t, "convert", "--model", model, "--quiet", "--out", rtn); code != exitOK {
		t.Fatalf("convert: status %d, stderr %s", code, errs)
	}
	type row struct {
		Corpus string  `json:"corpus"`
		Top1   float64 `json:"top1_agreement"`
		MeanKL float64 `json:"mean_kl"`
		Delta  float64 `json:"delta_ppl_percent"`
	}
	type doc struct {
		Candidates []struct {
			Label    string `json:"label"`
			Numerics string `json:"numerics"`
			Rows     []row  `json:"rows"`
		} `json:"candidates"`
		Settings struct {
			Numerics string `json:"numerics"`
			KVCache  string `json:"kv_cache"`
		} `json:"settings"`
	}
	run := func(extra ...string) doc {
		args := append([]string{"eval", "--model", model, "--data", "dev=" + filepath.Join(model, "eval-dev.jsonl"), "--eval-fraction", "1",
			"--eval-sequences", "1", "--eval-seq-len", "64", "--labels", "RTN", "--self", "--quiet", "--json"}, extra...)
		code, out, errs := runCLI(t, append(args, rtn)...)
		if code != exitOK {
			t.Fatalf("eval %v: status %d, stderr %s", extra, code, errs)
		}
		var d doc
		if err := json.Unmarshal([]byte(out), &d); err != nil || len(d.Candidates) != 2 {
			t.Fatalf("eval %v: %v\n%s", extra, err, out)
		}
		for _, r := range d.Candidates[1].Rows {
			if d.Candidates[1].Label != "self" || r.MeanKL != 0 || r.Top1 != 1 || r.Delta != 0 {
				t.Errorf("eval %v: self %s: %+v", extra, r.Corpus, r)
			}
		}
		return d
	}
	cpu := run()
	base := cpu.Candidates[0].Rows[len(cpu.Candidates[0].Rows)-1]
	if cpu.Candidates[0].Numerics != "cpu-fp32" || cpu.Settings.Numerics != "cpu-fp32" || cpu.Settings.KVCache != "f32" {
		t.Errorf("cpu run records %q, settings %+v", cpu.Candidates[0].Numerics, cpu.Settings)
	}
	for _, c := range []struct{ numerics, kv, want string }{
		{"device:LoFi", "f32", "device:LoFi ("},
		{"device", "bfp8", "device:HiFi2 ("},
	} {
		d := run("--numerics", c.numerics, "--kv-cache", c.kv)
		got := d.Candidates[0].Rows[len(d.Candidates[0].Rows)-1]
		t.Logf("%s, kv %s: mean KL %.5f (float32 %.5f), top-1 %.3f (%.3f), ΔPPL %+.2f%% (%+.2f%%)", c.numerics, c.kv, got.MeanKL, base.MeanKL, got.Top1, base.Top1, got.Delta, base.Delta)
		if !strings.HasPrefix(d.Candidates[0].Numerics, c.want) || d.Settings.Numerics != d.Candidates[0].Numerics || d.Settings.KVCache != c.kv ||
			strings.Contains(d.Candidates[0].Numerics, "kv bfp8") != (c.kv == "bfp8") {
			t.Errorf("%s: candidate numerics %q, settings %+v", c.numerics, d.Candidates[0].Numerics, d.Settings)
		}
		if got.MeanKL == base.MeanKL || got.MeanKL > 2*base.MeanKL || got.MeanKL < base.MeanKL/2 || math.Abs(got.Top1-base.Top1) > 0.05 {
			t.Errorf("%s: mean KL %g, top-1 %g; float32 run %g, %g: want a small difference", c.numerics, got.MeanKL, got.Top1, base.MeanKL, base.Top1)
		}
	}
}
