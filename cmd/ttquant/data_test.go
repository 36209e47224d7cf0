package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/text/dataset"
)

func TestDataCommand(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	data := filepath.Join(model, "calib.jsonl")
	out := filepath.Join(t.TempDir(), "seqs.jsonl")
	code, stdout, errs := runCLI(t, "data", "--model", model, "--data", data, "--sequences", "4", "--seq-len", "64",
		"--eval-sequences", "2", "--eval-mode", "record", "--eval-seq-len", "32", "--out", out, "--json", "--quiet")
	if code != exitOK {
		t.Fatalf("status %d, stderr %s", code, errs)
	}
	var doc dataDoc
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatal(err)
	}
	p := doc.Provenance
	if doc.SchemaVersion != schemaVersion || p.Calibration.Sequences != 4 || p.Calibration.Tokens != 256 || p.Evaluation.Sequences != 2 ||
		len(p.Sources) != 1 || len(p.Sources[0].Files[0].SHA256) != 64 {
		t.Fatalf("document %+v", doc)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	var lines []dataLine
	for n := 0; sc.Scan(); n++ {
		if n == 0 {
			continue // provenance
		}
		var l dataLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if len(lines) != 6 || lines[0].Set != "calibration" || len(lines[0].IDs) != 64 || len(lines[0].Mask) != 64 || lines[5].Set != "evaluation" {
		t.Fatalf("%d sequence lines: %+v", len(lines), lines)
	}
	var ids [][]int32
	for _, l := range lines[:4] {
		ids = append(ids, l.IDs)
	}
	if dataset.HashTokenIDs(ids) != p.Calibration.TokenIDsSHA256 {
		t.Error("the file's calibration ids do not hash to the provenance's token_ids_sha256")
	}

	spec := filepath.Join(t.TempDir(), "spec.json")
	os.WriteFile(spec, []byte(`{"sources":[{"kind":"jsonl","path":"`+data+`"}],"calibration":{"sequences":2,"seq_len":16}}`), 0o644)
	for _, c := range []struct {
		args   []string
		status int
		msg    string
	}{
		{[]string{"data", "--model", model}, exitUsage, "--data is required"},
		{[]string{"data", "--data", data}, exitUsage, "--model is required"},
		{[]string{"data", "--model", model, "--data", spec, "--seed", "3"}, exitUsage, "--seed cannot be used"},
		{[]string{"data", "--model", model, "--data", data, "--mode", "stream"}, exitUsage, "--mode \"stream\""},
		{[]string{"data", "--model", model, "--data", data, "--eval-fraction", "1"}, exitUsage, "--eval-fraction 1"},
		{[]string{"data", "--model", model, "--data", data, "--seq-len", "0"}, exitUsage, "--seq-len 0"},
		{[]string{"data", "--model", model, "--data", "x=" + filepath.Join(model, "none.jsonl"), "--quiet"}, exitError, "none.jsonl"},
		{[]string{"data", "--model", model, "--data", data, "--sequences", "100000", "--seq-len", "2048", "--quiet", "--out", out + ".2"}, exitError, "not enough text"},
	} {
		code, stdout, errs := runCLI(t, c.args...)
		if code != c.status || stdout != "" || !strings.Contains(errs, c.msg) {
			t.Errorf("%q: status %d, stdout %q, stderr %q; want %d and %q", c.args, code, stdout, errs, c.status, c.msg)
		}
	}
	if _, err := os.Stat(out + ".2"); !os.IsNotExist(err) {
		t.Errorf("a failed run left %s", out+".2")
	}
	code, stdout, errs = runCLI(t, "data", "--model", model, "--data", spec, "--quiet")
	if code != exitOK || !strings.Contains(stdout, "calibration: 2 sequences, 32 tokens") {
		t.Errorf("spec file: status %d, stdout %q, stderr %q", code, stdout, errs)
	}
}
