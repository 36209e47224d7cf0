//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/slurmtest"
)

// TestSlurmArray runs split builds under a real single-node Slurm
// cluster, as docs/distributed.md does: the calibration store of the
// built-in model as a job array of three tasks (--array=0-2, each task
// this test binary running "calib build --shard auto"), its assembly as a
// job with --dependency=afterok on the array, then the gptq --calib of
// that store as another array depending on the assembly, and its
// assembly. Every task must have resolved --shard auto to its own worker
// (its log says which), and the assembled store and checkpoint must be the
// single-process ones, byte for byte.
func TestSlurmArray(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Slurm cluster")
	}
	c := slurmtest.Start(t)
	model, store := shardStore(t)
	args := []string{"gptq", "--model", model, "--calib", store, "--workers", "1", "--experts-per-file", "4"}
	whole := filepath.Join(t.TempDir(), "whole")
	if code, out, errs := runCLI(t, append(slices.Clone(args), "--out", whole, "--quiet")...); code != exitOK {
		t.Fatalf("single process: status %d\n%s\n%s", code, out, errs)
	}
	out := filepath.Join(c.Dir, "out")
	arrayStore := filepath.Join(c.Dir, "store")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// script is a job that runs this binary as ttquant with args.
	script := func(name string, args ...string) string {
		a, _ := json.Marshal(args)
		body := fmt.Sprintf("#!/bin/sh\nTTQUANT_TEST_MAIN='%s' TTQUANT_TEST_NODURABLE=1 exec %s -test.run='^$'\n", a, exe)
		p := filepath.Join(c.Dir, name)
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	logs := filepath.Join(c.Dir, "log")
	calibArgs := []string{"calib", "build", "--model", model, "--data", filepath.Join(model, "calib.jsonl"),
		"--sequences", "3", "--seq-len", "32", "--workers", "1", "--out", arrayStore, "--shard", "auto"}
	calibID, err := c.Sbatch(ctx, "--array=0-2", "--cpus-per-task=1", "--output="+filepath.Join(logs, "calib-%a.out"),
		script("calib.sh", calibArgs...))
	if err != nil {
		t.Fatal(err)
	}
	storeID, err := c.Sbatch(ctx, "--dependency=afterok:"+calibID, "--output="+filepath.Join(logs, "calib-assemble.out"),
		script("calib-assemble.sh", "assemble", arrayStore))
	if err != nil {
		t.Fatal(err)
	}
	gptqArgs := []string{"gptq", "--model", model, "--calib", arrayStore, "--workers", "1", "--experts-per-file", "4"}
	id, err := c.Sbatch(ctx, "--array=0-2", "--cpus-per-task=1", "--dependency=afterok:"+storeID, "--output="+filepath.Join(logs, "array-%a.out"),
		script("array.sh", append(gptqArgs, "--out", out, "--shard", "auto")...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sbatch(ctx, "--wait", "--dependency=afterok:"+id, "--output="+filepath.Join(logs, "assemble.out"),
		script("assemble.sh", "assemble", out)); err != nil {
		for _, name := range []string{"calib-0", "calib-1", "calib-2", "calib-assemble", "array-0", "array-1", "array-2"} {
			data, _ := os.ReadFile(filepath.Join(logs, name+".out"))
			t.Logf("%s:\n%s", name, data)
		}
		t.Fatal(err)
	}
	for task := range 3 {
		data, err := os.ReadFile(filepath.Join(logs, fmt.Sprintf("calib-%d.out", task)))
		if err != nil || !strings.Contains(string(data), fmt.Sprintf("worker      %d/3:", task)) {
			t.Errorf("store array task %d did not run worker %d/3 (%v):\n%s", task, task, err, data)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(logs, "calib-assemble.out")); !strings.Contains(string(data), "assembled") {
		t.Errorf("the store's assemble job did not assemble it:\n%s", data)
	}
	sameFiles(t, "the array's store", dirFiles(t, store), dirFiles(t, arrayStore))
	for task := range 3 {
		data, err := os.ReadFile(filepath.Join(logs, fmt.Sprintf("array-%d.out", task)))
		if err != nil || !strings.Contains(string(data), fmt.Sprintf("worker      %d/3:", task)) {
			t.Errorf("array task %d did not run worker %d/3 (%v):\n%s", task, task, err, data)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(logs, "assemble.out")); !strings.Contains(string(data), "identity") {
		t.Errorf("the assemble job printed no identity:\n%s", data)
	}
	sameFiles(t, "the array's checkpoint", dirFiles(t, whole), dirFiles(t, out))
}
