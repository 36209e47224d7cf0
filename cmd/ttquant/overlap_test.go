package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/model/builtin"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
)

// TestEvalRefusesCalibrationText: a checkpoint built with a relative
// --data path, evaluated from another directory on a file of which 5% is
// its calibration text, after the calibration file is gone: the
// fingerprint in the manifest is enough, and eval refuses, saying how much
// is shared, with what, and what allows it.
func TestEvalRefusesCalibrationText(t *testing.T) {
	root, model := builtinModel(t)
	work := filepath.Join(root, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	calib := filepath.Join(work, "texts.jsonl")
	if err := os.Rename(filepath.Join(model, builtin.CalibText), calib); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)
	if code, so, se := runCLI(t, "gptq", "--model", "../model", "--data", "calib=texts.jsonl", "--layers", "experts", "--sequences", "16", "--seq-len", "256",
		"--held-out", "2", "--quiet", "--workers", "2", "--out", "../ckpt"); code != exitOK {
		t.Fatalf("gptq: status %d\n%s\n%s", code, so, se)
	}

	// The evaluation file: eval-dev's first 8 records and, as 5% of its
	// tokens, a piece of the calibration set's text.
	tok, err := tokenizer.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := dataset.ParseSpec("calib=" + calib)
	if err != nil {
		t.Fatal(err)
	}
	cal, err := dataset.Build(spec, tok, dataset.Options{Seed: 1, Calibration: dataset.SetOptions{Sequences: 16, SeqLen: 256}})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := os.ReadFile(filepath.Join(model, builtin.EvalText))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(dev), "\n")[:8]
	evalTokens := 0
	for _, l := range lines {
		var r struct{ Text string }
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		evalTokens += len(tok.Encode(r.Text))
	}
	want := evalTokens * 5 / 95
	var ids []int
	for _, s := range cal.Calibration.Sequences {
		for _, id := range s.IDs {
			if len(ids) < want && int(id) != tok.EOS() {
				ids = append(ids, int(id))
			}
		}
	}
	text, err := tok.Decode(ids)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(map[string]string{"corpus": "code", "text": strings.ToValidUTF8(text, "")})
	evalFile := filepath.Join(root, "other", "held-back.jsonl")
	os.MkdirAll(filepath.Dir(evalFile), 0o755)
	if err := os.WriteFile(evalFile, []byte(strings.Join(lines, "")+string(rec)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(calib); err != nil {
		t.Fatal(err)
	}

	t.Chdir(filepath.Dir(evalFile))
	code, so, se := runCLI(t, "eval", "--model", "../model", "--data", "eval=held-back.jsonl", "--eval-fraction", "1", "--eval-sequences", "9",
		"--eval-mode", "record", "--eval-seq-len", "8192", "--quiet", "../ckpt")
	if code != exitError {
		t.Fatalf("eval on text repeating the calibration text: status %d\n%s\n%s", code, so, se)
	}
	t.Logf("eval: %s", se)
	for _, w := range []string{"% of the scored tokens", "shared with the calibration text", "the manifest of ckpt", "--allow-overlap", "--max-overlap"} {
		if !strings.Contains(se, w) {
			t.Errorf("the refusal does not say %q: %s", w, se)
		}
	}
}
