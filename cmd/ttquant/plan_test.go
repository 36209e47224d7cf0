package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

func TestTestModelAndPlanEveryVariant(t *testing.T) {
	for _, v := range []string{"default", "per-expert", "single-file", "qwen3-next"} {
		dir := filepath.Join(t.TempDir(), v)
		if code, _, errs := runCLI(t, "testmodel", "--out", dir, "--variant", v); code != exitOK {
			t.Fatalf("testmodel %s: status %d: %s", v, code, errs)
		}
		code, out, errs := runCLI(t, "plan", "--model", dir)
		if code != exitOK {
			t.Fatalf("plan on %s: status %d: %s", v, code, errs)
		}
		for _, want := range []string{"plan qwen36-35b-a3b", "BFP4_b", "10 grouped expert files", "predicted checkpoint"} {
			if !strings.Contains(out, want) {
				t.Errorf("plan on %s: output lacks %q:\n%s", v, want, out)
			}
		}
		for _, preset := range []string{"qwen3-27b-dense", "qwen3-9b-dense"} {
			if code, _, errs := runCLI(t, "plan", "--model", dir, "--preset", preset); code != exitOK {
				t.Errorf("plan --preset %s on %s: status %d: %s", preset, v, code, errs)
			}
		}
	}
}

func TestPlanRefusesFP8(t *testing.T) {
	dir := t.TempDir()
	if code, _, errs := runCLI(t, "testmodel", "--out", dir, "--variant", "fp8"); code != exitOK {
		t.Fatalf("testmodel fp8: %d %s", code, errs)
	}
	code, out, errs := runCLI(t, "plan", "--model", dir)
	if code != exitError || out != "" || !strings.Contains(errs, "already quantized") || !strings.Contains(errs, "F8_E4M3") {
		t.Errorf("plan on fp8: status %d, stdout %q, stderr %q", code, out, errs)
	}
}

type planJSON struct {
	SchemaVersion int   `json:"schema_version"`
	SourceTensors int   `json:"source_tensors"`
	StoredTensors int   `json:"stored_tensors"`
	StoredBytes   int64 `json:"stored_bytes"`
	ExpertFiles   int   `json:"expert_files"`
	TensorFiles   int   `json:"tensor_files"`
	Tensors       []struct {
		Name   string `json:"name"`
		Format string `json:"format"`
	} `json:"tensors"`
}

func TestPlanReplicaJSON(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "testmodel", "--out", dir, "--variant", "replica-35b", "--json")
	if code != exitOK {
		t.Fatalf("testmodel replica: %d %s", code, errs)
	}
	var tm testModelDoc
	if err := json.Unmarshal([]byte(out), &tm); err != nil || tm.Tensors != 712 || tm.DataBytes != 71010512512 {
		t.Fatalf("testmodel --json = %+v, %v", tm, err)
	}
	code, out, errs = runCLI(t, "plan", "--model", dir, "--json")
	if code != exitOK {
		t.Fatalf("plan replica: %d %s", code, errs)
	}
	var doc planJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SchemaVersion != schemaVersion || doc.SourceTensors != 712 || doc.StoredTensors != 21622 || len(doc.Tensors) != 21622 ||
		doc.ExpertFiles != 1312 || doc.TensorFiles != 1313 {
		t.Errorf("plan --json: %+v", struct{ A, B, C, D, E int }{doc.SourceTensors, doc.StoredTensors, len(doc.Tensors), doc.ExpertFiles, doc.TensorFiles})
	}
	if gb := float64(doc.StoredBytes) / 1e9; gb < 21.5 || gb > 21.9 {
		t.Errorf("predicted %.2f GB, published 21.7 GB", gb)
	}
}

func TestPlanFileRoundTrip(t *testing.T) {
	model := t.TempDir()
	if code, _, errs := runCLI(t, "testmodel", "--out", model); code != exitOK {
		t.Fatal(errs)
	}
	code, planText, errs := runCLI(t, "plan", "--preset", "qwen3-27b-dense", "--print-plan")
	if code != exitOK {
		t.Fatal(errs)
	}
	path := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(path, []byte(planText), 0o644); err != nil {
		t.Fatal(err)
	}
	_, a, _ := runCLI(t, "plan", "--model", model, "--preset", "qwen3-27b-dense", "--json")
	code, b, errs := runCLI(t, "plan", "--model", model, "--plan", path, "--json")
	if code != exitOK || a != b {
		t.Errorf("plan from --print-plan file differs from the preset (status %d, %s)", code, errs)
	}
}

func TestPlanUsageErrors(t *testing.T) {
	cases := [][]string{
		{"plan"},
		{"plan", "--model", "x", "--preset", "qwen36-35b-a3b", "--plan", "p.json"},
		{"plan", "--model", "x", "extra"},
		{"plan", "--model", "x", "--experts-per-file", "0"},
		{"testmodel"},
		{"testmodel", "--out", "x", "--variant", "fp16"},
	}
	for _, c := range cases {
		if code, _, _ := runCLI(t, c...); code != exitUsage {
			t.Errorf("%v: status %d, want %d", c, code, exitUsage)
		}
	}
	if code, _, errs := runCLI(t, "plan", "--model", t.TempDir(), "--preset", "nope"); code != exitUsage || !strings.Contains(errs, "unknown preset") {
		t.Errorf("unknown preset: %d %q", code, errs)
	}
	code, out, _ := runCLI(t, "plan", "--list-presets")
	if code != exitOK || !strings.Contains(out, "qwen36-35b-a3b") || !strings.Contains(out, "qwen3-9b-dense") {
		t.Errorf("--list-presets: %d %q", code, out)
	}
}

// BenchmarkPlanReplica runs `ttquant plan` on the 35B shape replica
// in-process (open the 16 shards, resolve, print); the target is < 2 s.
func BenchmarkPlanReplica(b *testing.B) {
	dir := b.TempDir()
	if err := testmodel.WriteReplica35B(dir); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"text", "json"} {
		b.Run(mode, func(b *testing.B) {
			args := []string{"plan", "--model", dir}
			if mode == "json" {
				args = append(args, "--json")
			}
			for i := 0; i < b.N; i++ {
				var out, errb bytes.Buffer
				if code := run(context.Background(), args, &out, &errb); code != exitOK {
					b.Fatalf("status %d: %s", code, errb.String())
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/plan")
		})
	}
}

// TestPlanRefusesContradictingConfig: plan checks config.json against the
// tensors' headers as a build does, and exits 1 naming the disagreement,
// instead of printing a plan a build would then refuse.
func TestPlanRefusesContradictingConfig(t *testing.T) {
	_, model := builtinModel(t)
	cfgPath := filepath.Join(model, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI(t, "plan", "--model", model); code != exitOK {
		t.Fatalf("plan on the built-in model: status %d: %s", code, errs)
	}
	bad := bytes.Replace(raw, []byte(`"moe_intermediate_size": 128`), []byte(`"moe_intermediate_size": 96`), 1)
	if bytes.Equal(bad, raw) {
		t.Fatal("config.json has no moe_intermediate_size = 128 to change")
	}
	if err := os.WriteFile(cfgPath, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "plan", "--model", model)
	if code != exitError || out != "" || !strings.Contains(errs, "implies [16 192 128]") || !strings.Contains(errs, "config.json") {
		t.Errorf("plan with a contradicting config.json: status %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestOneUnitSystem: sizes are printed in binary units (KiB, MiB, GiB)
// everywhere; plan printed decimal MB and kB for the same sizes that
// convert and gptq print in MiB.
func TestOneUnitSystem(t *testing.T) {
	_, model := builtinModel(t)
	code, out, errs := runCLI(t, "plan", "--model", model)
	if code != exitOK {
		t.Fatalf("plan: status %d: %s", code, errs)
	}
	for _, decimal := range []string{" kB", " MB", " GB"} {
		if strings.Contains(out, decimal) {
			t.Errorf("plan prints decimal%s:\n%s", decimal, out)
		}
	}
	if !strings.Contains(out, " MiB") || !strings.Contains(out, " KiB") {
		t.Errorf("plan prints no MiB/KiB sizes:\n%s", out)
	}
}
