package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/safetensors"
)

// tinyModel writes the built-in tiny model into a fresh directory.
func tinyModel(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Write(src, testmodel.Tiny(), testmodel.Default); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestConvertRefusedWhileDirectoryLocked: a second writer of an output
// directory fails at once, naming the holder, and leaves it alone.
func TestConvertRefusedWhileDirectoryLocked(t *testing.T) {
	src := tinyModel(t)
	out := filepath.Join(t.TempDir(), "out")
	lk, err := fslock.Acquire(out)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release()
	t0 := time.Now()
	code, _, errs := runCLI(t, "convert", "--model", src, "--out", out, "--quiet")
	if d := time.Since(t0); d > time.Second {
		t.Errorf("refusal took %v", d)
	}
	if code != exitError || !strings.Contains(errs, fmt.Sprintf("pid %d (", os.Getpid())) {
		t.Fatalf("convert into a locked directory: status %d, stderr %q; want status 1 naming pid %d", code, errs, os.Getpid())
	}
	ents, _ := os.ReadDir(out)
	if len(ents) != 1 || ents[0].Name() != fslock.Name {
		t.Errorf("the refused run touched the directory: %v", ents)
	}
}

// synthStore writes a small synthetic calibration store for model.
func synthStore(t *testing.T, model string) string {
	t.Helper()
	store := filepath.Join(t.TempDir(), "store")
	if code, _, errs := runCLI(t, "calib", "synth", "--model", model, "--out", store, "--sequences", "4", "--seq-len", "32"); code != exitOK {
		t.Fatalf("calib synth: status %d\n%s", code, errs)
	}
	return store
}

// TestBadShardFoundUpFront: a truncated shard of the last layer fails
// calib stats, and stops gptq before anything is written.
func TestBadShardFoundUpFront(t *testing.T) {
	model := tinyModel(t)
	store := synthStore(t, model)
	shards, _ := filepath.Glob(filepath.Join(store, "layer004.mlp.*.safetensors"))
	if len(shards) == 0 {
		t.Fatal("no layer 4 MoE shard in the synthetic store")
	}
	victim := shards[len(shards)-1]
	raw, err := os.ReadFile(victim)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(victim, raw[:len(raw)-10], 0o644)
	code, _, errs := runCLI(t, "calib", "stats", store)
	if code != exitError || !strings.Contains(errs, filepath.Base(victim)) {
		t.Errorf("calib stats with a truncated shard: status %d, stderr %q", code, errs)
	}
	out := filepath.Join(t.TempDir(), "out")
	code, _, errs = runCLI(t, "gptq", "--model", model, "--calib", store, "--out", out, "--quiet", "--allow-synthetic-calibration")
	if code != exitError || !strings.Contains(errs, filepath.Base(victim)) {
		t.Errorf("gptq with a truncated shard: status %d, stderr %q", code, errs)
	}
	if ents, err := os.ReadDir(out); err == nil {
		names := []string{}
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if len(names) > 0 {
			t.Errorf("gptq wrote %v before finding the bad shard", names)
		}
	}
}

// TestGPTQRefusesSyntheticStore: a store from calib synth records that it
// is synthetic; gptq refuses it with a usage error naming
// --allow-synthetic-calibration before writing anything, and builds a
// checkpoint that verifies when the flag is given.
func TestGPTQRefusesSyntheticStore(t *testing.T) {
	model := tinyModel(t)
	store := synthStore(t, model)
	code, stdout, errs := runCLI(t, "calib", "stats", store, "--json")
	if code != exitOK || !strings.Contains(stdout, `"synthetic": true`) {
		t.Errorf("calib stats --json does not report a synthetic store: status %d\n%s\n%s", code, stdout, errs)
	}
	out := filepath.Join(t.TempDir(), "out")
	code, _, errs = runCLI(t, "gptq", "--model", model, "--calib", store, "--out", out, "--quiet")
	if code != exitUsage || !strings.Contains(errs, "--allow-synthetic-calibration") || !strings.Contains(errs, "synthetic") {
		t.Errorf("gptq on a synthetic store: status %d, stderr %q", code, errs)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("the refused gptq created %s (%v)", out, err)
	}
	code, _, errs = runCLI(t, "gptq", "--model", model, "--calib", store, "--out", out, "--quiet", "--allow-synthetic-calibration")
	if code != exitOK {
		t.Fatalf("gptq --allow-synthetic-calibration: status %d\n%s", code, errs)
	}
	if code, _, errs := runCLI(t, "verify", out); code != exitOK {
		t.Errorf("verify: status %d\n%s", code, errs)
	}
}

// TestConvertNonFinite: a NaN in the source stops convert naming the
// tensor and index; --allow-nonfinite stores it with a warning and lists
// it in the JSON report.
func TestConvertNonFinite(t *testing.T) {
	src := tinyModel(t)
	m, err := safetensors.OpenModel(src)
	if err != nil {
		t.Fatal(err)
	}
	const name = "model.language_model.embed_tokens.weight"
	f, info, ok := m.Lookup(name)
	if !ok {
		t.Fatalf("no %s", name)
	}
	path, off := f.Path(), f.DataOffset()+info.Begin+2*5
	m.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off], b[off+1] = 0xc0, 0x7f // BF16 NaN at element [0 5]
	os.WriteFile(path, b, 0o644)

	out := filepath.Join(t.TempDir(), "out")
	code, _, errs := runCLI(t, "convert", "--model", src, "--out", out, "--quiet")
	if code != exitError || !strings.Contains(errs, name) || !strings.Contains(errs, "[0 5]") || !strings.Contains(errs, "NaN") {
		t.Fatalf("convert with a NaN: status %d, stderr %q", code, errs)
	}
	out2 := filepath.Join(t.TempDir(), "out2")
	code, stdout, errs := runCLI(t, "convert", "--model", src, "--out", out2, "--quiet", "--allow-nonfinite", "--json")
	if code != exitOK || !strings.Contains(errs, "WARNING: 1 tensors") {
		t.Fatalf("convert --allow-nonfinite: status %d, stderr %q", code, errs)
	}
	var rep struct {
		NonFinite []string `json:"nonfinite_tensors"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || len(rep.NonFinite) != 1 || rep.NonFinite[0] != name {
		t.Errorf("--json nonfinite_tensors = %v (%v)", rep.NonFinite, err)
	}
}

// TestGPTQAsymmetricFlag: --asymmetric reaches the manifest's options (so
// the identity) and the checkpoint verifies; without calibration rows it is
// a usage error.
func TestGPTQAsymmetricFlag(t *testing.T) {
	model := tinyModel(t)
	store := synthStore(t, model)
	out := filepath.Join(t.TempDir(), "out")
	code, _, errs := runCLI(t, "gptq", "--model", model, "--calib", store, "--out", out, "--quiet", "--allow-synthetic-calibration", "--asymmetric")
	if code != exitOK {
		t.Fatalf("gptq --asymmetric: status %d\n%s", code, errs)
	}
	data, err := os.ReadFile(filepath.Join(out, "native_manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"asymmetric": true`) {
		t.Error("the manifest does not record the asymmetric fit")
	}
	if code, _, errs := runCLI(t, "verify", out); code != exitOK {
		t.Errorf("verify: status %d\n%s", code, errs)
	}
	code, _, errs = runCLI(t, "gptq", "--model", model, "--out", filepath.Join(t.TempDir(), "o"), "--asymmetric")
	if code != exitUsage {
		t.Errorf("gptq --asymmetric without rows: status %d, stderr %q", code, errs)
	}
}

// TestBFPExponentFlag: --bfp-exponent reaches the manifest's options of
// convert (with and without a store built from text) and gptq, and each
// checkpoint verifies against the source.
func TestBFPExponentFlag(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	store := filepath.Join(t.TempDir(), "store")
	if code, _, errs := runCLI(t, "calib", "build", "--model", model, "--data", filepath.Join(model, "calib.jsonl"),
		"--out", store, "--sequences", "3", "--seq-len", "32", "--quiet"); code != exitOK {
		t.Fatalf("calib build: status %d\n%s", code, errs)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"convert", "--bfp-exponent", "ttmetal"}, "ttmetal"},
		{[]string{"convert", "--bfp-exponent", "search", "--calib", store}, "search"},
		{[]string{"gptq", "--bfp-exponent", "search", "--calib", store, "--layers", `model\.language_model\.layers\.1\.mlp\.experts\..*`}, "search"},
	} {
		out := filepath.Join(t.TempDir(), "out")
		args := append(append([]string(nil), c.args...), "--model", model, "--out", out, "--quiet")
		if code, _, errs := runCLI(t, args...); code != exitOK {
			t.Fatalf("%s: status %d\n%s", strings.Join(args, " "), code, errs)
		}
		data, err := os.ReadFile(filepath.Join(out, "native_manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), `"bfp_exponent": "`+c.want+`"`) {
			t.Errorf("%s: the manifest does not record the rule %s", strings.Join(args, " "), c.want)
		}
		if code, _, errs := runCLI(t, "verify", out, "--source", model); code != exitOK {
			t.Errorf("%s: verify: status %d\n%s", strings.Join(args, " "), code, errs)
		}
	}
}
