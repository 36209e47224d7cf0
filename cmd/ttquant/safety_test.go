package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/testmodel"
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
	code, _, errs = runCLI(t, "gptq", "--model", model, "--calib", store, "--out", out, "--quiet")
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
