package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOutOfRangeFlags: every numeric flag out of its range is a usage
// error (exit 2) naming the flag, reported before anything is read or
// written: the output directory stays absent. The model and store paths do
// not exist, so a check that ran after opening them would fail differently.
func TestOutOfRangeFlags(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	model := filepath.Join(dir, "no-model")
	store := filepath.Join(dir, "no-store")
	gptqArgs := []string{"gptq", "--model", model, "--calib", store, "--out", out}
	convertArgs := []string{"convert", "--model", model, "--out", out}
	quantArgs := []string{"calib", "quantize", "--model", model, "--store", store}
	selectArgs := []string{"select", "--model", model, "--calib", store, "--out", out}
	cases := []struct {
		args []string
		flag string
	}{
		{append(gptqArgs, "--percdamp", "-1"), "--percdamp"},
		{append(selectArgs, "--bpw", "0.1"), "--bpw"},
		{append(selectArgs, "--bpw", "NaN"), "--bpw"},
		{append(selectArgs, "--budget", "-5GB"), "--budget"},
		{append(selectArgs, "--token-bytes", "0"), "--token-bytes"},
		{append(selectArgs, "--budget", "5GB", "--weights", "attn_out=-1"), "--weights"},
		{append(selectArgs, "--budget", "5GB", "--weights", "lm=2"), "--weights"},
		{append(gptqArgs, "--percdamp", "NaN"), "--percdamp"},
		{append(gptqArgs, "--percdamp", "2"), "--percdamp"},
		{append(gptqArgs, "--block-size", "0"), "--block-size"},
		{append(gptqArgs, "--block-size", "-5"), "--block-size"},
		{append(gptqArgs, "--block-size", "100000"), "--block-size"},
		{append(gptqArgs, "--workers", "-3"), "--workers"},
		{append(gptqArgs, "--workers", "0"), "--workers"},
		{append(gptqArgs, "--held-out", "-1"), "--held-out"},
		{append(gptqArgs, "--experts-per-file", "0"), "--experts-per-file"},
		{append(gptqArgs, "--dense-shard-bytes", "-1"), "--dense-shard-bytes"},
		{append(gptqArgs, "--estimate", "-1s"), "--estimate"},
		{append(gptqArgs, "--parent", "xyz"), "--parent"},
		{append(gptqArgs, "--allow-short"), "--allow-short"},
		{[]string{"gptq", "--model", model, "--data", "calib=x.jsonl", "--calib", store, "--out", out}, "--data"},
		{append(convertArgs, "--workers", "-3"), "--workers"},
		{append(convertArgs, "--experts-per-file", "-1"), "--experts-per-file"},
		{append(convertArgs, "--dense-shard-bytes", "0"), "--dense-shard-bytes"},
		{append(convertArgs, "--shard", "3/3"), "--shard"},
		{append(convertArgs, "--shard", "1of3"), "--shard"},
		{append(gptqArgs, "--shard", "-1/3"), "--shard"},
		{append(gptqArgs, "--shard", "0/0"), "--shard"},
		{append(gptqArgs, "--shard", "auto", "--shard-count", "-2"), "--shard-count"},
		{append(gptqArgs, "--shard", "1/3", "--shard-count", "3"), "--shard-count"},
		{append(gptqArgs, "--shard-count", "3"), "--shard-count"},
		{[]string{"gptq", "--model", model, "--data", "calib=x.jsonl", "--out", out, "--shard", "0/2"}, "sequential"},
		{append(quantArgs, "--percdamp", "-1"), "--percdamp"},
		{append(quantArgs, "--block-size", "0"), "--block-size"},
		{append(quantArgs, "--workers", "-3"), "--workers"},
		{append(quantArgs, "--min-tokens", "-2"), "--min-tokens"},
		{append(quantArgs, "--held-out", "-1"), "--held-out"},
		{append(gptqArgs, "--bfp-exponent", "min"), "--bfp-exponent"},
		{append(convertArgs, "--bfp-exponent", "emax-1"), "--bfp-exponent"},
		{append(quantArgs, "--bfp-exponent", ""), "--bfp-exponent"},
		{[]string{"gptq", "--model", model, "--data", "calib=x.jsonl", "--out", out, "--bfp-exponent", "maximum"}, "--bfp-exponent"},
		{[]string{"calib", "synth", "--model", model, "--out", out, "--sequences", "0"}, "--sequences"},
		{[]string{"calib", "synth", "--model", model, "--out", out, "--seq-len", "-1"}, "--seq-len"},
		{[]string{"demo", "--out", out, "--workers", "-3"}, "--workers"},
		{[]string{"run", "--model", model, "--tokens", "1", "--workers", "0"}, "--workers"},
		{[]string{"tokenize", "--model", model, "--jsonl", "--workers", "0"}, "--workers"},
		{[]string{"data", "--model", model, "--data", "x=a.txt", "--out", out, "--workers", "5000"}, "--workers"},
		{[]string{"eval", "--model", model, "--data", "x=a.txt", "--workers", "0", "ckpt"}, "--workers"},
		{[]string{"export", "ttnn", "ckpt", "--out", out, "--names", "m.json", "--workers", "0"}, "--workers"},
		{[]string{"demo", "--out", out, "--sequences", "1"}, "--sequences"},
		{[]string{"demo", "--out", out, "--seq-len", "0"}, "--seq-len"},
		{[]string{"demo", "--out", out, "--held-out", "48"}, "--held-out"},
		{[]string{"demo", "--out", out, "--eval-sequences", "0"}, "--eval-sequences"},
		{[]string{"demo", "--out", out, "--held-out", "0"}, "--held-out"},
		{[]string{"plan", "--model", model, "--experts-per-file", "0"}, "--experts-per-file"},
		{[]string{"plan", "--model", model, "--dense-shard-bytes", "0"}, "--dense-shard-bytes"},
		{[]string{"verify", out, "--workers", "0"}, "--workers"},
		{[]string{"compare", "--reference", model, "--candidate", model, "--chunk", "0"}, "--chunk"},
		{[]string{"emulate", "check", "--checkpoint", model, "--dump", model, "--limit", "-1"}, "--limit"},
	}
	for _, c := range cases {
		code, _, errs := runCLI(t, c.args...)
		if code != exitUsage || !strings.Contains(errs, c.flag) {
			t.Errorf("%s: status %d, stderr %q; want %d naming %s", strings.Join(c.args, " "), code, errs, exitUsage, c.flag)
		}
		if strings.Contains(c.flag, "percdamp") || strings.Contains(c.flag, "block-size") {
			if !strings.Contains(errs, " to ") {
				t.Errorf("%s: stderr %q does not state the accepted range", strings.Join(c.args, " "), errs)
			}
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("%s: %s was created", strings.Join(c.args, " "), out)
		}
	}
}

// TestHelpMatchesBehaviour: the commands that build a calibration set
// (gptq, calib build) show no evaluation-set flags they would ignore, and
// do not offer --sequences 0, which they refuse.
func TestHelpMatchesBehaviour(t *testing.T) {
	for _, cmd := range [][]string{{"gptq"}, {"calib", "build"}} {
		code, out, _ := runCLI(t, append(cmd, "-h")...)
		if code != exitOK {
			t.Fatalf("%v -h: status %d", cmd, code)
		}
		for _, unused := range []string{"-eval-sequences", "-eval-seq-len", "-eval-mode", "-eval-short", "0: none"} {
			if strings.Contains(out, unused) {
				t.Errorf("%v -h shows %q:\n%s", cmd, unused, out)
			}
		}
		if !strings.Contains(out, "-eval-fraction") || !strings.Contains(out, "-sequences") {
			t.Errorf("%v -h lacks --sequences or --eval-fraction:\n%s", cmd, out)
		}
		code, _, errs := runCLI(t, append(cmd, "--model", "m", "--data", "x=a.txt", "--out", "o", "--eval-sequences", "4")...)
		if code != exitUsage || !strings.Contains(errs, "eval-sequences") {
			t.Errorf("%v --eval-sequences: status %d, stderr %q", cmd, code, errs)
		}
	}
	// eval scores every record as its own window without --eval-sequences,
	// and its --sequences describes --calib-data's set.
	if code, out, _ := runCLI(t, "eval", "-h"); code != exitOK || strings.Contains(out, "0: none") || !strings.Contains(out, "0: every record its own window") {
		t.Errorf("eval -h: status %d:\n%s", code, out)
	}
	code, out, _ := runCLI(t, "data", "-h")
	if code != exitOK || !strings.Contains(out, "-eval-sequences") || !strings.Contains(out, "0: none") {
		t.Errorf("data -h: status %d:\n%s", code, out)
	}
}

// TestExponentRuleRefusals: an exponent rule asked of a plan without BFP
// tensors, and convert's calibration store without the weighted rule, are
// usage errors before anything is written; the valid rule with a store
// builds and verifies.
func TestExponentRuleRefusals(t *testing.T) {
	root, model := builtinModel(t)
	planFile := filepath.Join(root, "bf16.json")
	if err := os.WriteFile(planFile, []byte(`{"plan_version": 1, "name": "bf16", "rules": [{"pattern": "*", "format": "BF16"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "out")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"convert", "--model", model, "--out", out, "--plan", planFile, "--bfp-exponent", "search"}, "stores no tensor in a BFP format"},
		{[]string{"gptq", "--model", model, "--out", out, "--plan", planFile, "--data", "calib=" + filepath.Join(model, "calib.jsonl"), "--bfp-exponent", "ttmetal"}, "stores no tensor in a BFP format"},
		{[]string{"convert", "--model", model, "--out", out, "--calib", filepath.Join(root, "store"), "--bfp-exponent", "ttmetal"}, "--bfp-exponent search"},
		{[]string{"convert", "--model", model, "--out", out, "--calib", filepath.Join(root, "store")}, "--bfp-exponent search"},
	} {
		code, _, errs := runCLI(t, c.args...)
		if code != exitUsage || !strings.Contains(errs, c.want) {
			t.Errorf("%s: status %d, stderr %q; want %d with %q", strings.Join(c.args, " "), code, errs, exitUsage, c.want)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("%s: %s was created", strings.Join(c.args, " "), out)
		}
	}
}
