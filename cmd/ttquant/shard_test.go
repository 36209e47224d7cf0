//go:build unix

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
)

// shardStore writes the built-in model and a small calibration store of
// its text.
func shardStore(t *testing.T) (model, store string) {
	t.Helper()
	root, model := builtinModel(t)
	store = filepath.Join(root, "store")
	if code, out, errs := runCLI(t, "calib", "build", "--model", model, "--data", filepath.Join(model, "calib.jsonl"),
		"--out", store, "--sequences", "3", "--seq-len", "32", "--quiet"); code != exitOK {
		t.Fatalf("calib build: status %d\n%s\n%s", code, out, errs)
	}
	return model, store
}

// worker is a command line run in a child process (TestMain's
// TTQUANT_TEST_MAIN), signals included; env is added to its environment.
func worker(t *testing.T, args []string, env ...string) *exec.Cmd {
	t.Helper()
	a, _ := json.Marshal(args)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(exe, "-test.run=^$")
	c.Env = append(append(os.Environ(), "TTQUANT_TEST_MAIN="+string(a), "TTQUANT_TEST_NODURABLE=1"), env...)
	c.Stdout = new(bytes.Buffer)
	c.Stderr = new(bytes.Buffer)
	return c
}

// stopWorkerMidWrite runs worker args (one of three, index 1) with its
// writes slowed down, sends it sig once seen reports a half-written file
// (within 30 s, else the test fails), and checks what the stop leaves:
// after SIGTERM exit status 1 and a stderr that says the build resumes;
// after either, an assembly that refuses the unfinished worker.
func stopWorkerMidWrite(t *testing.T, args []string, sig syscall.Signal, dir string, seen func() bool, what string) {
	t.Helper()
	c := worker(t, args, "TTQUANT_TEST_SLOW_WRITES=1")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.Wait() }()
	mid := false
	for deadline := time.Now().Add(30 * time.Second); !mid && time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		mid = seen()
	}
	if !mid {
		c.Process.Kill()
		wg.Wait()
		t.Fatalf("worker 1/3 was never seen %s; stderr %s", what, c.Stderr)
	}
	c.Process.Signal(sig)
	wg.Wait()
	if code := c.ProcessState.ExitCode(); sig == syscall.SIGTERM && code != exitError {
		t.Errorf("after SIGTERM: status %d, want %d; stderr %s", code, exitError, c.Stderr)
	}
	if sig == syscall.SIGTERM && !strings.Contains(c.Stderr.(*bytes.Buffer).String(), "resume") {
		t.Errorf("after SIGTERM stderr does not say the build resumes: %s", c.Stderr)
	}
	if code, _, errs := runCLI(t, "assemble", dir); code == exitOK || !strings.Contains(errs, "worker 1/3 has not finished") {
		t.Errorf("assemble with worker 1/3 stopped: status %d, stderr %q", code, errs)
	}
}

// runWorkers runs the n workers of a split build at once, each as its own
// process, and fails the test unless every one succeeds.
func runWorkers(t *testing.T, n int, args []string) {
	t.Helper()
	cmds := make([]*exec.Cmd, n)
	for i := range cmds {
		cmds[i] = worker(t, append(slices.Clone(args), "--shard", fmt.Sprintf("%d/%d", i, n)))
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Errorf("worker %d/%d: %v\n%s", i, n, err, c.Stderr)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// dirFiles returns every regular file under dir by relative path.
func dirFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// addUnknownField adds a field no reader knows to the JSON record at path.
func addUnknownField(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]json.RawMessage
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	r["from_a_later_version"] = json.RawMessage("1")
	data, _ = json.Marshal(r)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// sameFiles fails unless got holds exactly want's files with want's bytes.
func sameFiles(t *testing.T, what string, want, got map[string][]byte) {
	t.Helper()
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s: %s missing", what, name)
		case !bytes.Equal(g, w):
			t.Errorf("%s: %s differs from the single-process build (%d bytes, want %d)", what, name, len(g), len(w))
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: %s is not in the single-process build", what, name)
		}
	}
}

// TestShardedBuildsByteIdentical: gptq --calib (with and without
// --asymmetric) and convert, split over 1, 3 and 7 worker processes run at
// once in one directory and assembled, leave the same bytes in every file
// as one process does.
func TestShardedBuildsByteIdentical(t *testing.T) {
	model, store := shardStore(t)
	common := []string{"--model", model, "--quiet", "--workers", "1", "--experts-per-file", "4"}
	cases := []struct {
		name    string
		args    []string
		workers []int
	}{
		{"gptq", append([]string{"gptq", "--calib", store}, common...), []int{1, 3, 7}},
		{"gptq-asymmetric", append([]string{"gptq", "--calib", store, "--asymmetric", "--layers", "all"}, common...), []int{3, 7}},
		{"gptq-held-out", append([]string{"gptq", "--calib", store, "--held-out", "1"}, common...), []int{3}},
		{"convert", append([]string{"convert", "--dense-shard-bytes", "300000"}, common...), []int{3, 7}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			whole := filepath.Join(t.TempDir(), "whole")
			if code, out, errs := runCLI(t, append(slices.Clone(c.args), "--out", whole)...); code != exitOK {
				t.Fatalf("single process: status %d\n%s\n%s", code, out, errs)
			}
			want := dirFiles(t, whole)
			for _, n := range c.workers {
				dir := filepath.Join(t.TempDir(), fmt.Sprintf("split-%d", n))
				runWorkers(t, n, append(slices.Clone(c.args), "--out", dir))
				// One worker of one is the whole build, manifest included;
				// assemble then leaves it as it is.
				if _, err := os.Stat(filepath.Join(dir, manifest.ManifestName)); (err == nil) != (n == 1) {
					t.Fatalf("%d workers: manifest before assemble: %v", n, err)
				}
				if code, out, errs := runCLI(t, "assemble", dir); code != exitOK {
					t.Fatalf("assemble of %d workers: status %d\n%s\n%s", n, code, out, errs)
				}
				sameFiles(t, fmt.Sprintf("%d workers", n), want, dirFiles(t, dir))
			}
		})
	}
}

// splitBuild runs the three workers of a split gptq build one after the
// other in this process and returns the directory, unassembled.
func splitBuild(t *testing.T, model, store string, extra ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "split")
	for i := range 3 {
		args := append([]string{"gptq", "--model", model, "--calib", store, "--out", dir, "--quiet", "--workers", "1",
			"--experts-per-file", "4", "--shard", fmt.Sprintf("%d/3", i)}, extra...)
		if code, out, errs := runCLI(t, args...); code != exitOK {
			t.Fatalf("worker %d/3: status %d\n%s\n%s", i, code, out, errs)
		}
	}
	return dir
}

// shardRecordPath is worker i of 3's record in dir.
func shardRecordPath(dir string, i int) string {
	return filepath.Join(dir, manifest.PartialDir, fmt.Sprintf("shard-%05d-of-%05d.json", i, 3))
}

// editRecords rewrites the list of finished files in a worker's record
// through f, leaving the rest of the record as it is.
func editRecords(t *testing.T, path string, f func([]json.RawMessage) []json.RawMessage) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]json.RawMessage
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	var recs []json.RawMessage
	if err := json.Unmarshal(r["records"], &recs); err != nil {
		t.Fatal(err)
	}
	r["records"], _ = json.Marshal(f(recs))
	data, _ = json.Marshal(r)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestAssembleRefuses: assemble names a missing worker, a missing unit, a
// duplicated unit, a unit of another plan, of another source and of other
// calibration data, and a truncated file, and writes nothing in each case.
func TestAssembleRefuses(t *testing.T) {
	model, store := shardStore(t)
	_, otherStore := shardStore(t) // the same text, so the same store: made different below
	if code, out, errs := runCLI(t, "calib", "build", "--model", model, "--data", filepath.Join(model, "calib.jsonl"),
		"--out", otherStore+"2", "--sequences", "2", "--seq-len", "32", "--quiet"); code != exitOK {
		t.Fatalf("calib build: status %d\n%s\n%s", code, out, errs)
	}
	pl, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		t.Fatal(err)
	}
	pl.Name = "another-plan"
	otherPlan := filepath.Join(t.TempDir(), "plan.json")
	data, _ := json.Marshal(pl)
	if err := os.WriteFile(otherPlan, data, 0o644); err != nil {
		t.Fatal(err)
	}
	otherModel := filepath.Join(t.TempDir(), "model")
	if err := os.CopyFS(otherModel, os.DirFS(model)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(otherModel, "generation_config.json"), []byte(`{"other": true}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// foreign copies worker 2's record and files from a build that differs
	// in one input.
	foreign := func(dir, from string) {
		t.Helper()
		os.Remove(shardRecordPath(dir, 2))
		if err := os.Rename(shardRecordPath(from, 2), shardRecordPath(dir, 2)); err != nil {
			t.Fatal(err)
		}
	}
	base := splitBuild(t, model, store)
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   []string
		status int
	}{
		{"missing worker", func(t *testing.T, dir string) { os.Remove(shardRecordPath(dir, 1)) }, []string{"worker 1/3 has not run"}, exitError},
		{"missing unit", func(t *testing.T, dir string) {
			editRecords(t, shardRecordPath(dir, 1), func(r []json.RawMessage) []json.RawMessage { return r[1:] })
		}, []string{"is missing", "worker 1/3"}, exitError},
		{"duplicated unit", func(t *testing.T, dir string) {
			var extra json.RawMessage
			editRecords(t, shardRecordPath(dir, 0), func(r []json.RawMessage) []json.RawMessage { extra = r[0]; return r })
			editRecords(t, shardRecordPath(dir, 2), func(r []json.RawMessage) []json.RawMessage { return append(r, extra) })
		}, []string{"is produced by worker 0/3 and by worker 2/3"}, exitError},
		{"other plan", func(t *testing.T, dir string) {
			foreign(dir, splitBuild(t, model, store, "--plan", otherPlan))
		}, []string{"worker 2/3's units are of another build", "plan"}, exitError},
		{"other source", func(t *testing.T, dir string) {
			foreign(dir, splitBuild(t, otherModel, store))
		}, []string{"worker 2/3's units are of another build", "source checkpoint"}, exitError},
		{"other data", func(t *testing.T, dir string) {
			foreign(dir, splitBuild(t, model, otherStore+"2"))
		}, []string{"worker 2/3's units are of another build", "calibration"}, exitError},
		{"truncated file", func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, "experts-l001-gate_up-g002.safetensors"), 1000); err != nil {
				t.Fatal(err)
			}
		}, []string{"layer 1 expert group 2", "experts-l001-gate_up-g002.safetensors", "1000 bytes", "truncated"}, exitVerifyKO},
		{"truncated part of a dense shard", func(t *testing.T, dir string) {
			p := filepath.Join(dir, manifest.PartialDir, "parts", "model.language_model.layers.0.linear_attn.out_proj.weight")
			if err := os.Truncate(p, 10); err != nil {
				t.Fatal(err)
			}
		}, []string{"dense shard dense-00001-of-00001.safetensors layer 0", "out_proj", "10 bytes", "truncated"}, exitVerifyKO},
		{"unknown field", func(t *testing.T, dir string) { addUnknownField(t, shardRecordPath(dir, 1)) },
			[]string{"shard-00001-of-00003.json", `unknown field "from_a_later_version"`}, exitError},
		{"missing part of a dense shard", func(t *testing.T, dir string) {
			for i := range 3 {
				data, _ := os.ReadFile(shardRecordPath(dir, i))
				var r map[string]json.RawMessage
				json.Unmarshal(data, &r)
				var parts []map[string]json.RawMessage
				json.Unmarshal(r["parts"], &parts)
				n := len(parts)
				parts = slices.DeleteFunc(parts, func(p map[string]json.RawMessage) bool {
					return string(p["tensor"]) == `"model.language_model.embed_tokens.weight"`
				})
				if len(parts) < n {
					r["parts"], _ = json.Marshal(parts)
					data, _ = json.Marshal(r)
					if err := os.WriteFile(shardRecordPath(dir, i), data, 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
			}
			t.Fatal("no worker produced model.language_model.embed_tokens.weight")
		}, []string{"unit dense shard dense-00001-of-00001.safetensors tensor model.language_model.embed_tokens.weight", "is missing"}, exitError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "split")
			if err := os.CopyFS(dir, os.DirFS(base)); err != nil {
				t.Fatal(err)
			}
			c.damage(t, dir)
			before := dirFiles(t, dir)
			code, out, errs := runCLI(t, "assemble", dir)
			if code != c.status {
				t.Fatalf("assemble: status %d, want %d\n%s\n%s", code, c.status, out, errs)
			}
			for _, w := range c.want {
				if !strings.Contains(errs, w) {
					t.Errorf("assemble's error %q does not say %q", errs, w)
				}
			}
			sameFiles(t, "after the refusal", before, dirFiles(t, dir))
		})
	}
}

// TestShardWorkerKilledMidUnit: a worker stopped by SIGKILL or SIGTERM
// while it writes an expert file is run again; it keeps its finished
// files, redoes the rest, and the assembled checkpoint is the
// single-process one, byte for byte.
func TestShardWorkerKilledMidUnit(t *testing.T) {
	model, store := shardStore(t)
	args := []string{"gptq", "--model", model, "--calib", store, "--quiet", "--workers", "1", "--experts-per-file", "4"}
	whole := filepath.Join(t.TempDir(), "whole")
	if code, out, errs := runCLI(t, append(slices.Clone(args), "--out", whole)...); code != exitOK {
		t.Fatalf("single process: status %d\n%s\n%s", code, out, errs)
	}
	want := dirFiles(t, whole)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "split")
			at := func(i int) []string {
				return append(slices.Clone(args), "--out", dir, "--shard", fmt.Sprintf("%d/3", i))
			}
			for _, i := range []int{0, 2} {
				if code, out, errs := runCLI(t, at(i)...); code != exitOK {
					t.Fatalf("worker %d/3: status %d\n%s\n%s", i, code, out, errs)
				}
			}
			// Worker 1, its writes slowed down, is stopped while an expert
			// file is half written.
			others, _ := filepath.Glob(filepath.Join(dir, "experts-*.safetensors"))
			stopWorkerMidWrite(t, at(1), sig, dir, func() bool {
				done, _ := filepath.Glob(filepath.Join(dir, "experts-*.safetensors"))
				ms, _ := filepath.Glob(filepath.Join(dir, "experts-*"+manifest.PartialSuffix))
				return len(ms) > 0 && len(done) > len(others)
			}, "writing an expert file")
			code, out, errs := runCLI(t, append(at(1), "--json")...)
			if code != exitOK {
				t.Fatalf("worker 1/3 again: status %d\n%s\n%s", code, out, errs)
			}
			var rep struct {
				Files, Kept int
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Kept == 0 || rep.Kept >= rep.Files {
				t.Errorf("the rerun kept %d of %d files (%v), want some but not all:\n%s", rep.Kept, rep.Files, err, out)
			}
			if code, out, errs := runCLI(t, "assemble", dir); code != exitOK {
				t.Fatalf("assemble: status %d\n%s\n%s", code, out, errs)
			}
			sameFiles(t, "after the rerun", want, dirFiles(t, dir))
		})
	}
}

// TestShardWorkerLocks: a second process given a running worker's index
// fails at once naming the holder; assemble refuses while a worker runs; a
// whole build refuses a directory of split workers; a worker run again on
// the assembled checkpoint changes nothing.
func TestShardWorkerLocks(t *testing.T) {
	model, store := shardStore(t)
	dir := splitBuild(t, model, store)
	before := dirFiles(t, dir)
	lk, err := fslock.AcquireNamed(filepath.Join(dir, manifest.PartialDir), "shard-00001-of-00003.lock")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"gptq", "--model", model, "--calib", store, "--out", dir, "--quiet", "--workers", "1", "--experts-per-file", "4"}
	if code, _, errs := runCLI(t, append(slices.Clone(args), "--shard", "1/3")...); code != exitError || !strings.Contains(errs, "is being written by") || !strings.Contains(errs, "shard-00001-of-00003.lock") {
		t.Errorf("second worker 1/3: status %d, stderr %q", code, errs)
	}
	if code, _, errs := runCLI(t, "assemble", dir); code != exitError || !strings.Contains(errs, "worker 1/3") {
		t.Errorf("assemble while worker 1/3 runs: status %d, stderr %q", code, errs)
	}
	lk.Release()
	if code, _, errs := runCLI(t, args...); code != exitError || !strings.Contains(errs, "split build") {
		t.Errorf("a whole build in the workers' directory: status %d, stderr %q", code, errs)
	}
	sameFiles(t, "after the refusals", before, dirFiles(t, dir))
	if code, out, errs := runCLI(t, "assemble", dir); code != exitOK {
		t.Fatalf("assemble: status %d\n%s\n%s", code, out, errs)
	}
	done := dirFiles(t, dir)
	if code, out, errs := runCLI(t, append(slices.Clone(args), "--shard", "2/3")...); code != exitOK || !strings.Contains(out, "already assembled") {
		t.Errorf("worker 2/3 on the assembled checkpoint: status %d\n%s\n%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "assemble", dir); code != exitOK || !strings.Contains(out, "identity") {
		t.Errorf("assemble again: status %d\n%s\n%s", code, out, errs)
	}
	sameFiles(t, "after the reruns", done, dirFiles(t, dir))
}

// TestEvalSplitBitIdentical: an evaluation split over 3 and 7 worker
// processes and merged with --assemble prints the table (JSON, every
// figure) of one process, byte for byte; the merge refuses a missing part,
// a truncated part and a part of another evaluation, naming it.
func TestEvalSplitBitIdentical(t *testing.T) {
	_, model := builtinModel(t)
	rtn := filepath.Join(t.TempDir(), "rtn")
	if code, _, errs := runCLI(t, "convert", "--model", model, "--out", rtn, "--quiet"); code != exitOK {
		t.Fatalf("convert: status %d\n%s", code, errs)
	}
	flags := func(seqLen string) []string {
		return []string{"eval", "--model", model, "--data", "dev=" + filepath.Join(model, "eval-dev.jsonl"), "--eval-fraction", "1",
			"--eval-sequences", "8", "--eval-seq-len", seqLen, "--quiet", "--workers", "1", "--json"}
	}
	code, want, errs := runCLI(t, append(flags("64"), rtn)...)
	if code != exitOK {
		t.Fatalf("eval: status %d\n%s", code, errs)
	}
	split := func(t *testing.T, n int, seqLen string) string {
		t.Helper()
		parts := filepath.Join(t.TempDir(), "parts")
		cmds := make([]*exec.Cmd, n)
		for i := range cmds {
			cmds[i] = worker(t, append(flags(seqLen), "--shard", fmt.Sprintf("%d/%d", i, n), "--parts", parts, rtn))
			if err := cmds[i].Start(); err != nil {
				t.Fatal(err)
			}
		}
		for i, c := range cmds {
			if err := c.Wait(); err != nil {
				t.Fatalf("worker %d/%d: %v\n%s", i, n, err, c.Stderr)
			}
		}
		return parts
	}
	for _, n := range []int{3, 7} {
		parts := split(t, n, "64")
		code, got, errs := runCLI(t, append(flags("64"), "--assemble", parts, rtn)...)
		if code != exitOK {
			t.Fatalf("merge of %d workers: status %d\n%s", n, code, errs)
		}
		if got != want {
			t.Errorf("the merge of %d workers differs from one process:\n%s\nwant\n%s", n, got, want)
		}
	}
	parts := split(t, 3, "64")
	other := split(t, 3, "48")
	for _, c := range []struct {
		name   string
		damage func(dir string)
		want   string
	}{
		{"missing part", func(dir string) { os.Remove(filepath.Join(dir, "eval-00001-of-00003.part")) }, "no part of worker 1/3"},
		{"truncated part", func(dir string) { os.Truncate(filepath.Join(dir, "eval-00002-of-00003.part"), 100) }, "eval-00002-of-00003.part"},
		{"another evaluation", func(dir string) {
			data, err := os.ReadFile(filepath.Join(other, "eval-00000-of-00003.part"))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, "eval-00000-of-00003.part"), data, 0o644)
		}, "another evaluation"},
	} {
		dir := filepath.Join(t.TempDir(), "parts")
		if err := os.CopyFS(dir, os.DirFS(parts)); err != nil {
			t.Fatal(err)
		}
		c.damage(dir)
		if code, _, errs := runCLI(t, append(flags("64"), "--assemble", dir, rtn)...); code == exitOK || !strings.Contains(errs, c.want) {
			t.Errorf("%s: status %d, stderr %q", c.name, code, errs)
		}
	}
}

// TestShardDryRunMemory: gptq --dry-run --shard i/N prints what memory
// worker i and every node need, and --json gives the same figures.
func TestShardDryRunMemory(t *testing.T) {
	_, model := builtinModel(t)
	args := []string{"gptq", "--model", model, "--calib", "unused", "--dry-run", "--estimate", "0", "--shard", "1/3", "--workers", "2"}
	code, out, errs := runCLI(t, args...)
	if code != exitOK || !strings.Contains(out, "memory per node  worker 1 about ") || !strings.Contains(out, "every node at most ") {
		t.Fatalf("dry run: status %d\n%s\n%s", code, out, errs)
	}
	code, out, errs = runCLI(t, append(args, "--json")...)
	if code != exitOK {
		t.Fatalf("dry run --json: status %d\n%s", code, errs)
	}
	var doc struct {
		Work struct {
			Shards struct {
				Worker          int    `json:"worker"`
				WorkerBytes     int64  `json:"worker_bytes"`
				WorkerBytesUnit string `json:"worker_bytes_unit"`
				MaxWorkerBytes  int64  `json:"max_worker_bytes"`
			} `json:"shards"`
		} `json:"work"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	s := doc.Work.Shards
	if s.Worker != 1 || s.WorkerBytes <= 0 || s.WorkerBytesUnit == "" || s.MaxWorkerBytes < s.WorkerBytes {
		t.Errorf("work.shards %+v: want worker 1's estimate, its unit, and the largest at least as large", s)
	}
}
