package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/model/builtin"
	"github.com/ttquant/ttquant/internal/testdata"
)

// readmeBlock returns the README's real-model commands: the lines of the
// shell block after "On a real model the same job is", as arguments.
func readmeBlock(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testdata.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "On a real model the same job is")
	if i < 0 {
		t.Fatal("README.md has no real-model block")
	}
	s = s[i:]
	lo := strings.Index(s, "```sh\n")
	hi := strings.Index(s[lo+6:], "```")
	var cmds [][]string
	for _, l := range strings.Split(s[lo+6:lo+6+hi], "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if f[0] != "ttquant" {
			t.Fatalf("README block line %q does not run ttquant", l)
		}
		cmds = append(cmds, f[1:])
	}
	return cmds
}

// TestREADMERealModelBlock runs README's real-model commands (gptq,
// verify, eval) on the built-in trained model, with the model directory
// and the two text files replaced by the built-in ones. gptq runs first as
// written with --dry-run (every flag accepted at the README's defaults),
// then with --sequences 16 --seq-len 256 added so the test is quick (the
// README's defaults, 128 × 2048 tokens, take minutes on this model);
// verify and eval run exactly as written.
func TestREADMERealModelBlock(t *testing.T) {
	cmds := readmeBlock(t)
	if len(cmds) != 3 || cmds[0][0] != "gptq" || cmds[1][0] != "verify" || cmds[2][0] != "eval" {
		t.Fatalf("README's real-model block is %q; want gptq, verify and eval", cmds)
	}
	root, model := builtinModel(t)
	// The held-back evaluation text: the first 6 records of eval-dev, a
	// file of its own.
	dev, err := os.ReadFile(filepath.Join(model, builtin.EvalText))
	if err != nil {
		t.Fatal(err)
	}
	held := strings.Join(strings.SplitAfter(string(dev), "\n")[:6], "")
	if err := os.WriteFile(filepath.Join(root, "held-back.jsonl"), []byte(held), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(model, builtin.CalibText), filepath.Join(root, "texts.jsonl")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(model, filepath.Join(root, "Qwen3.6-35B-A3B")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)

	gptq := append(cmds[0], "--quiet")
	if code, so, se := runCLI(t, append(gptq, "--dry-run", "--estimate", "0")...); code != exitOK {
		t.Fatalf("README's gptq --dry-run: status %d\n%s\n%s", code, so, se)
	}
	if code, so, se := runCLI(t, append(gptq, "--sequences", "16", "--seq-len", "256")...); code != exitOK {
		t.Fatalf("README's gptq: status %d\n%s\n%s", code, so, se)
	}
	code, so, se := runCLI(t, cmds[1]...)
	if code != exitOK || !strings.Contains(so, "OK") {
		t.Fatalf("README's verify: status %d\n%s\n%s", code, so, se)
	}
	code, so, se = runCLI(t, cmds[2]...)
	if code != exitOK {
		t.Fatalf("README's eval: status %d\n%s\n%s", code, so, se)
	}
	// Every record of the held-back file, whole.
	if !strings.Contains(so, "Scored: every record, each its own window") || strings.Contains(se, "warning") {
		t.Errorf("README's eval did not score the file whole without warnings:\n%s\n%s", so, se)
	}
	want := 0
	for _, w := range []string{"| **all** |"} {
		want += strings.Count(so, w)
	}
	if want == 0 {
		t.Errorf("README's eval prints no table:\n%s", so)
	}
}

// TestEvalHeldOutOfCalibrationFile: eval given the file a checkpoint was
// calibrated on, with no --eval-* flags, scores only the records the
// calibration split held out and says so; --eval-fraction 1 asks for
// every record, and the overlap check refuses it.
func TestEvalHeldOutOfCalibrationFile(t *testing.T) {
	root, model := builtinModel(t)
	b, err := os.ReadFile(filepath.Join(model, builtin.CalibText))
	if err != nil {
		t.Fatal(err)
	}
	texts := filepath.Join(root, "texts.jsonl")
	if err := os.WriteFile(texts, []byte(strings.Join(strings.SplitAfter(string(b), "\n")[:40], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(root, "ckpt")
	if code, so, se := runCLI(t, "gptq", "--model", model, "--data", "calib="+texts, "--layers", "experts", "--sequences", "12", "--seq-len", "256",
		"--quiet", "--out", ckpt); code != exitOK {
		t.Fatalf("gptq: status %d\n%s\n%s", code, so, se)
	}
	pic := filepath.Join(root, "eval.svg")
	code, so, se := runCLI(t, "eval", "--model", model, "--data", "calib="+texts, "--eval-seq-len", "512", "--quiet", "--json", "--svg", pic, ckpt)
	if code != exitOK {
		t.Fatalf("eval on the calibration file: status %d\n%s\n%s", code, so, se)
	}
	for _, w := range []string{"calibration split held out", "eval fraction 0.1, seed 1", `"shared_tokens": 0`} {
		if !strings.Contains(so, w) {
			t.Errorf("eval on the calibration file does not say %q:\n%.3000s", w, so)
		}
	}
	checkSVG(t, pic, "rect")
	code, _, se = runCLI(t, "eval", "--model", model, "--data", "calib="+texts, "--eval-fraction", "1", "--eval-seq-len", "512", "--quiet", ckpt)
	if code != exitError || !strings.Contains(se, "shared with the calibration text") {
		t.Errorf("eval on every record of the calibration file: status %d, %s", code, se)
	}
}
