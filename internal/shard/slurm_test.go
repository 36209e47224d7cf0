//go:build linux

package shard

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/slurmtest"
)

// helperOut names the directory the re-executed test binary writes its
// worker to, when it runs as a Slurm array task.
const helperOut = "TTQUANT_SHARD_HELPER_OUT"

// TestSlurmArrayHelper is the array task's body: it does nothing in a
// normal run; under sbatch it resolves --shard auto from the environment
// Slurm gave it and writes the result to a file named by the task id.
func TestSlurmArrayHelper(t *testing.T) {
	dir := os.Getenv(helperOut)
	if dir == "" {
		return
	}
	s, err := Parse("auto", 0, os.Getenv)
	line := s.String()
	if err != nil {
		line = "error: " + err.Error()
	}
	if err := os.WriteFile(filepath.Join(dir, "task-"+os.Getenv(EnvSlurmID)), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSlurmArray submits a job array of three tasks to a real single-node
// Slurm cluster and checks that each task resolves "--shard auto" to a
// different worker of three, then that a job submitted with
// --dependency=afterok on the array runs after it (the assemble step of
// docs/distributed.md).
func TestSlurmArray(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Slurm cluster")
	}
	c := slurmtest.Start(t)
	out := filepath.Join(c.Dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	script := fmt.Sprintf("#!/bin/sh\n%s=%s exec %s -test.run='^TestSlurmArrayHelper$' -test.count=1\n", helperOut, out, exe)
	job := filepath.Join(c.Dir, "array.sh")
	if err := os.WriteFile(job, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := c.Sbatch(ctx, "--array=0-2", "--cpus-per-task=1", "--output="+filepath.Join(c.Dir, "log", "array-%a.out"), job)
	if err != nil {
		t.Fatal(err)
	}
	done := filepath.Join(out, "assembled")
	if _, err := c.Sbatch(ctx, "--wait", "--dependency=afterok:"+id, "--output=/dev/null",
		"--wrap", fmt.Sprintf("ls %s | grep -c '^task-' > %s", out, done)); err != nil {
		t.Fatal(err)
	}
	var got []string
	for task := range 3 {
		data, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("task-%d", task)))
		if err != nil {
			t.Fatalf("array task %d wrote nothing: %v\n%s", task, err, c.Logs())
		}
		got = append(got, string(data))
	}
	if want := []string{"0/3", "1/3", "2/3"}; !slices.Equal(got, want) {
		t.Errorf("array tasks resolved --shard auto to %v, want %v", got, want)
	}
	count, err := os.ReadFile(done)
	if err != nil || strings.TrimSpace(string(count)) != "3" {
		t.Errorf("the afterok job saw %q task files (%v), want 3: it ran before the array finished", count, err)
	}
}
