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

// TestSlurmArray runs a split build under a real single-node Slurm
// cluster, as docs/distributed.md does: the gptq --calib of the built-in
// model as a job array of three tasks (--array=0-2, each task this test
// binary running "gptq --shard auto"), then assemble as a job with
// --dependency=afterok on the array. Every task must have resolved --shard
// auto to its own worker (its log says which), and the assembled
// checkpoint must be the single-process build, byte for byte.
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
	id, err := c.Sbatch(ctx, "--array=0-2", "--cpus-per-task=1", "--output="+filepath.Join(logs, "array-%a.out"),
		script("array.sh", append(slices.Clone(args), "--out", out, "--shard", "auto")...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sbatch(ctx, "--wait", "--dependency=afterok:"+id, "--output="+filepath.Join(logs, "assemble.out"),
		script("assemble.sh", "assemble", out)); err != nil {
		for task := range 3 {
			data, _ := os.ReadFile(filepath.Join(logs, fmt.Sprintf("array-%d.out", task)))
			t.Logf("array task %d:\n%s", task, data)
		}
		t.Fatal(err)
	}
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
