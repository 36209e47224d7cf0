//go:build unix

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// selectShardArgs is a select of the trained MoE model with measured
// weights on eight held-out windows, writing the plan to out.
func selectShardArgs(model, store, out string) []string {
	return []string{"select", "--model", model, "--calib", store, "--out", out, "--quiet", "--weights", "measure",
		"--eval-sequences", "8", "--eval-seq-len", "24", "--budget", "5MB", "--workers", "1"}
}

// selectShardInputs are the model, its store and the sensitivity file and
// plan one process measures and selects.
func selectShardInputs(t *testing.T) (model, store string, sens, plan []byte) {
	t.Helper()
	model = testdata.Dir(t, "models", "tiny-qwen36-trained")
	store = selectStore(t, model, "3")
	dir := t.TempDir()
	if code, _, errs := runCLI(t, selectShardArgs(model, store, filepath.Join(dir, "p.json"))...); code != exitOK {
		t.Fatalf("select: status %d\n%s", code, errs)
	}
	sens, _ = os.ReadFile(filepath.Join(dir, "p.sensitivity.json"))
	plan, _ = os.ReadFile(filepath.Join(dir, "p.json"))
	return model, store, sens, plan
}

// assembleOK runs assemble on dir and returns its output, failing unless
// it succeeds and says want.
func assembleOK(t *testing.T, dir, want string) string {
	t.Helper()
	code, out, errs := runCLI(t, "assemble", dir)
	if code != exitOK || !strings.Contains(out, want) {
		t.Fatalf("assemble %s: status %d, stdout %q (want %q)\n%s", dir, code, out, want, errs)
	}
	return out
}

// splitMeasurement runs the two stages of a split measurement with n
// workers at once in each (the measurement builds, then, once assembled,
// the single changes) and leaves the workers' records unmerged; it
// returns the worker arguments.
func splitMeasurement(t *testing.T, n int, model, store, dir string) []string {
	t.Helper()
	args := append(selectShardArgs(model, store, filepath.Join(dir, "p.json")), "--parts", filepath.Join(dir, "parts"))
	runWorkers(t, n, args)
	assembleOK(t, filepath.Join(dir, "parts"), "run the "+fmt.Sprint(n)+" workers again")
	runWorkers(t, n, args)
	return args
}

// TestSelectShardByteIdentical: select --weights measure split over 1, 3
// and 7 worker processes run at once (the measurement builds, their
// assembly, the single-change evaluations, their assembly) writes the
// sensitivity file one process writes, byte for byte; select without
// --shard then reads it and writes the same plan.
func TestSelectShardByteIdentical(t *testing.T) {
	model, store, wantSens, wantPlan := selectShardInputs(t)
	for _, n := range []int{1, 3, 7} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			dir := t.TempDir()
			parts := filepath.Join(dir, "parts")
			args := append(selectShardArgs(model, store, filepath.Join(dir, "p.json")), "--parts", parts)
			if n == 1 {
				// The only worker assembles at once.
				runWorkers(t, 1, args)
			} else {
				splitMeasurement(t, n, model, store, dir)
				assembleOK(t, parts, fmt.Sprintf("16 single changes from %d workers", n))
			}
			got, _ := os.ReadFile(filepath.Join(dir, "p.sensitivity.json"))
			if len(got) == 0 || !bytes.Equal(got, wantSens) {
				t.Fatalf("%d workers: the sensitivity file (%d bytes) differs from one process's (%d bytes)", n, len(got), len(wantSens))
			}
			assembleOK(t, parts, "already assembled")
			code, out, errs := runCLI(t, append(selectShardArgs(model, store, filepath.Join(dir, "p.json")), "--json")...)
			if code != exitOK || !strings.Contains(out, `"measured": false`) {
				t.Fatalf("select after the split measurement: status %d\n%s", code, errs)
			}
			if p, _ := os.ReadFile(filepath.Join(dir, "p.json")); !bytes.Equal(p, wantPlan) {
				t.Errorf("%d workers: the plan differs from one process's", n)
			}
		})
	}
}

// TestAssembleMeasurementRefuses: the merge of the single changes names a
// missing worker, a missing change, a duplicated change, a worker of
// another measurement, a truncated record and one with an unknown field,
// and writes nothing; a worker of another count and --shard with --data
// are refused.
func TestAssembleMeasurementRefuses(t *testing.T) {
	model, store, _, _ := selectShardInputs(t)
	dir := t.TempDir()
	args := splitMeasurement(t, 3, model, store, dir)
	parts := filepath.Join(dir, "parts")
	rec := func(d string, i int) string { return filepath.Join(d, fmt.Sprintf("changes-%05d-of-00003.json", i)) }
	edit := func(t *testing.T, path string, f func(r map[string]json.RawMessage)) {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var r map[string]json.RawMessage
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		f(r)
		data, _ = json.Marshal(r)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	results := func(r map[string]json.RawMessage) []json.RawMessage {
		var out []json.RawMessage
		json.Unmarshal(r["results"], &out)
		return out
	}
	cases := []struct {
		name   string
		damage func(t *testing.T, d string)
		want   []string
	}{
		{"missing worker", func(t *testing.T, d string) { os.Remove(rec(d, 1)) }, []string{"worker 1/3 has not run"}},
		{"missing change", func(t *testing.T, d string) {
			edit(t, rec(d, 1), func(r map[string]json.RawMessage) { r["results"], _ = json.Marshal(results(r)[1:]) })
		}, []string{"is missing", "worker 1/3"}},
		{"duplicated change", func(t *testing.T, d string) {
			var extra json.RawMessage
			edit(t, rec(d, 0), func(r map[string]json.RawMessage) { extra = results(r)[0] })
			edit(t, rec(d, 2), func(r map[string]json.RawMessage) { r["results"], _ = json.Marshal(append(results(r), extra)) })
		}, []string{"is produced by worker 0/3 and by worker 2/3"}},
		{"other measurement", func(t *testing.T, d string) {
			edit(t, rec(d, 2), func(r map[string]json.RawMessage) { r["measurement_sha256"] = json.RawMessage(`"00"`) })
		}, []string{"worker 2/3's changes are of another evaluation", "measurement"}},
		{"truncated record", func(t *testing.T, d string) {
			if err := os.Truncate(rec(d, 1), 40); err != nil {
				t.Fatal(err)
			}
		}, []string{"changes-00001-of-00003.json", "truncated or damaged"}},
		{"unknown field", func(t *testing.T, d string) { addUnknownField(t, rec(d, 1)) },
			[]string{"changes-00001-of-00003.json", `unknown field "from_a_later_version"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := filepath.Join(t.TempDir(), "parts")
			if err := os.CopyFS(d, os.DirFS(parts)); err != nil {
				t.Fatal(err)
			}
			c.damage(t, d)
			before := dirFiles(t, d)
			code, out, errs := runCLI(t, "assemble", d)
			if code != exitError {
				t.Fatalf("assemble: status %d, want %d\n%s\n%s", code, exitError, out, errs)
			}
			for _, w := range c.want {
				if !strings.Contains(errs, w) {
					t.Errorf("assemble's error %q does not say %q", errs, w)
				}
			}
			sameFiles(t, "after the refusal", before, dirFiles(t, d))
			if _, err := os.Stat(filepath.Join(dir, "p.sensitivity.json")); err == nil {
				t.Fatal("a refused assembly wrote the sensitivity file")
			}
		})
	}
	before := dirFiles(t, parts)
	if code, _, errs := runCLI(t, append(slices.Clone(args), "--shard", "1/4")...); code != exitError || !strings.Contains(errs, "worker count") {
		t.Errorf("worker 1/4 in a measurement of 3 workers: status %d, stderr %q", code, errs)
	}
	if code, _, errs := runCLI(t, "select", "--model", model, "--data", filepath.Join(model, "calib.jsonl"), "--out", filepath.Join(dir, "q.json"), "--budget", "5MB", "--shard", "0/2", "--parts", parts); code != exitUsage || !strings.Contains(errs, "stay on one machine") {
		t.Errorf("--shard with --data: status %d, stderr %q", code, errs)
	}
	sameFiles(t, "after the refused workers", before, dirFiles(t, parts))
}

// TestSelectShardWorkerKilled: a worker of the single-change evaluations
// stopped by SIGKILL or SIGTERM after its first window is refused by the
// assembly as unfinished, run again, and the assembled sensitivity file is
// one process's, byte for byte.
func TestSelectShardWorkerKilled(t *testing.T) {
	model, store, wantSens, _ := selectShardInputs(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			parts := filepath.Join(dir, "parts")
			args := append(selectShardArgs(model, store, filepath.Join(dir, "p.json")), "--parts", parts)
			at := func(i int) []string { return append(slices.Clone(args), "--shard", fmt.Sprintf("%d/3", i)) }
			runWorkers(t, 3, args)
			assembleOK(t, parts, "run the 3 workers again")
			for _, i := range []int{0, 2} {
				if code, out, errs := runCLI(t, at(i)...); code != exitOK {
					t.Fatalf("worker %d/3: status %d\n%s\n%s", i, code, out, errs)
				}
			}
			// Worker 1, with its progress on stderr, is stopped once it has
			// scored its first window.
			verbose := slices.DeleteFunc(at(1), func(a string) bool { return a == "--quiet" })
			c := worker(t, verbose)
			c.Stderr = nil
			pipe, err := c.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			var log strings.Builder
			stopped := false
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				sc := bufio.NewScanner(pipe)
				for sc.Scan() {
					log.WriteString(sc.Text() + "\n")
					if !stopped && strings.Contains(sc.Text(), "weights: window 1/8") {
						c.Process.Signal(sig)
						stopped = true
					}
				}
			}()
			wg.Wait()
			c.Wait()
			if !stopped || c.ProcessState.Success() {
				t.Fatalf("worker 1/3 was not stopped mid-evaluation (stopped %v, %v):\n%s", stopped, c.ProcessState, log.String())
			}
			if code, _, errs := runCLI(t, "assemble", parts); code == exitOK || !strings.Contains(errs, "worker 1/3 has not finished") {
				t.Errorf("assemble with worker 1/3 stopped: status %d, stderr %q", code, errs)
			}
			if code, out, errs := runCLI(t, at(1)...); code != exitOK || !strings.Contains(out, "single changes scored\n") {
				t.Fatalf("worker 1/3 again: status %d\n%s\n%s", code, out, errs)
			}
			assembleOK(t, parts, "16 single changes from 3 workers")
			if got, _ := os.ReadFile(filepath.Join(dir, "p.sensitivity.json")); !bytes.Equal(got, wantSens) {
				t.Errorf("after the rerun the sensitivity file (%d bytes) differs from one process's (%d bytes)", len(got), len(wantSens))
			}
		})
	}
}
