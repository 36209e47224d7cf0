//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/model/walk"
)

// storeArgs is a calib build of the built-in model's text: eight
// sequences, so that seven workers each have one.
func storeArgs(model string, extra ...string) []string {
	return append([]string{"calib", "build", "--model", model, "--data", filepath.Join(model, "calib.jsonl"),
		"--sequences", "8", "--seq-len", "32", "--quiet", "--workers", "1"}, extra...)
}

// wholeStore is the store one process builds with args.
func wholeStore(t *testing.T, args []string) map[string][]byte {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "whole")
	if code, out, errs := runCLI(t, append(slices.Clone(args), "--out", dir)...); code != exitOK {
		t.Fatalf("calib build: status %d\n%s\n%s", code, out, errs)
	}
	return dirFiles(t, dir)
}

// TestShardedStoreByteIdentical: calib build split over 1, 3 and 7 worker
// processes run at once in one directory, then assembled, leaves the same
// bytes in every file (shards, sequences file, index) as one process does;
// so does a BF16 store's (the default) and an F32 store's.
func TestShardedStoreByteIdentical(t *testing.T) {
	_, model := builtinModel(t)
	for _, dtype := range []string{"BF16", "F32"} {
		t.Run(dtype, func(t *testing.T) {
			args := storeArgs(model, "--dtype", dtype)
			want := wholeStore(t, args)
			for _, n := range []int{1, 3, 7} {
				if dtype == "F32" && n != 3 {
					continue
				}
				dir := filepath.Join(t.TempDir(), fmt.Sprintf("split-%d", n))
				runWorkers(t, n, append(slices.Clone(args), "--out", dir))
				if _, err := os.Stat(filepath.Join(dir, calib.StoreIndexName)); (err == nil) != (n == 1) {
					t.Fatalf("%d workers: index before assemble: %v", n, err)
				}
				code, out, errs := runCLI(t, "assemble", dir)
				if code != exitOK {
					t.Fatalf("assemble of %d workers: status %d\n%s\n%s", n, code, out, errs)
				}
				if n > 1 && !strings.Contains(out, fmt.Sprintf("from %d workers", n)) {
					t.Errorf("assemble of %d workers printed %q", n, out)
				}
				sameFiles(t, fmt.Sprintf("%d workers", n), want, dirFiles(t, dir))
			}
		})
	}
}

// storeRecordPath is worker i of 3's record in a split store.
func storeRecordPath(dir string, i int) string {
	return filepath.Join(dir, calib.StorePartialDir, fmt.Sprintf("shard-%05d-of-%05d.json", i, 3))
}

// editParts rewrites the parts of the first site with parts in a worker's
// record through f.
func editParts(t *testing.T, path string, f func([]json.RawMessage) []json.RawMessage) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]json.RawMessage
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	var sites []map[string]json.RawMessage
	if err := json.Unmarshal(r["sites"], &sites); err != nil {
		t.Fatal(err)
	}
	for _, si := range sites {
		var parts []json.RawMessage
		json.Unmarshal(si["shards"], &parts)
		if len(parts) > 0 {
			si["shards"], _ = json.Marshal(f(parts))
			break
		}
	}
	r["sites"], _ = json.Marshal(sites)
	data, _ = json.Marshal(r)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// splitStore runs the three workers of a split store build one after the
// other and returns the directory, unassembled.
func splitStore(t *testing.T, args []string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "split")
	for i := range 3 {
		if code, out, errs := runCLI(t, append(slices.Clone(args), "--out", dir, "--shard", fmt.Sprintf("%d/3", i))...); code != exitOK {
			t.Fatalf("worker %d/3: status %d\n%s\n%s", i, code, out, errs)
		}
	}
	return dir
}

// TestAssembleStoreRefuses: assemble of a split store names a missing
// worker, a missing unit, a duplicated unit, a worker of another source,
// of other data and of other options, and a truncated part, and writes
// nothing in each case.
func TestAssembleStoreRefuses(t *testing.T) {
	_, model := builtinModel(t)
	otherModel := filepath.Join(t.TempDir(), "model")
	if err := os.CopyFS(otherModel, os.DirFS(model)); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(otherModel, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(otherModel, "config.json"), append(cfg, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	args := storeArgs(model)
	base := splitStore(t, args)
	foreign := func(dir string, from string) {
		t.Helper()
		os.Remove(storeRecordPath(dir, 2))
		if err := os.Rename(storeRecordPath(from, 2), storeRecordPath(dir, 2)); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   []string
		status int
	}{
		{"missing worker", func(t *testing.T, dir string) { os.Remove(storeRecordPath(dir, 1)) }, []string{"worker 1/3 has not run"}, exitError},
		{"missing unit", func(t *testing.T, dir string) {
			editParts(t, storeRecordPath(dir, 1), func(p []json.RawMessage) []json.RawMessage { return p[1:] })
		}, []string{"unit sequence", "is missing", "worker 1/3"}, exitError},
		{"duplicated unit", func(t *testing.T, dir string) {
			var extra json.RawMessage
			editParts(t, storeRecordPath(dir, 0), func(p []json.RawMessage) []json.RawMessage { extra = p[0]; return p })
			editParts(t, storeRecordPath(dir, 2), func(p []json.RawMessage) []json.RawMessage { return append(p, extra) })
		}, []string{"is produced by worker 0/3 and by worker 2/3"}, exitError},
		{"other source", func(t *testing.T, dir string) {
			foreign(dir, splitStore(t, storeArgs(otherModel)))
		}, []string{"worker 2/3's units are of another build", "source model"}, exitError},
		{"other data", func(t *testing.T, dir string) {
			foreign(dir, splitStore(t, append(storeArgs(model), "--seq-len", "24")))
		}, []string{"worker 2/3's units are of another build", "calibration data"}, exitError},
		{"other options", func(t *testing.T, dir string) {
			foreign(dir, splitStore(t, storeArgs(model, "--dtype", "F32")))
		}, []string{"worker 2/3's units are of another build", "option"}, exitError},
		{"unknown field", func(t *testing.T, dir string) { addUnknownField(t, storeRecordPath(dir, 1)) },
			[]string{"shard-00001-of-00003.json", `unknown field "from_a_later_version"`}, exitError},
		{"truncated part", func(t *testing.T, dir string) {
			parts, _ := filepath.Glob(filepath.Join(dir, calib.StorePartialDir, "shard-00002-of-00003", "parts", "layer001.*.part"))
			if len(parts) == 0 {
				t.Fatal("worker 2/3 wrote no part of layer 1")
			}
			if err := os.Truncate(parts[0], 10); err != nil {
				t.Fatal(err)
			}
		}, []string{"unit sequence", "shard-00002-of-00003/parts/layer001.", "10 bytes", "truncated"}, exitVerifyKO},
		{"overwritten part", func(t *testing.T, dir string) {
			// The last part of the last site: the assembly has copied
			// every other part when it finds this one differs.
			parts, _ := filepath.Glob(filepath.Join(dir, calib.StorePartialDir, "shard-0000*-of-00003", "parts", "*.part"))
			slices.Sort(parts)
			if len(parts) == 0 {
				t.Fatal("no part")
			}
			p := parts[len(parts)-1]
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			data[len(data)-1] ^= 1
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"unit sequence", ".part has sha256"}, exitVerifyKO},
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
	// A whole build refuses the workers' directory, a worker refuses a
	// worker count other than the directory's.
	before := dirFiles(t, base)
	if code, _, errs := runCLI(t, append(slices.Clone(args), "--out", base)...); code != exitError || !strings.Contains(errs, "split store build") {
		t.Errorf("a whole build in the workers' directory: status %d, stderr %q", code, errs)
	}
	if code, _, errs := runCLI(t, append(slices.Clone(args), "--out", base, "--shard", "1/4")...); code != exitError || !strings.Contains(errs, "worker count") {
		t.Errorf("worker 1/4 in a directory of 3 workers: status %d, stderr %q", code, errs)
	}
	sameFiles(t, "after the refusals", before, dirFiles(t, base))
}

// TestStoreWorkerKilledMidUnit: a worker of a split store build stopped by
// SIGKILL or SIGTERM while it writes a part is run again; it keeps its
// finished layers, redoes the rest, and the assembled store is the
// single-process one, byte for byte.
func TestStoreWorkerKilledMidUnit(t *testing.T) {
	_, model := builtinModel(t)
	args := storeArgs(model)
	want := wholeStore(t, args)
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
			// Worker 1, its writes slowed down, is stopped while a part is
			// half written, after its first layer.
			wdir := filepath.Join(dir, calib.StorePartialDir, "shard-00001-of-00003")
			stopWorkerMidWrite(t, at(1), sig, dir, func() bool {
				_, err := os.Stat(filepath.Join(wdir, walk.RecordName(0)))
				ms, _ := filepath.Glob(filepath.Join(wdir, "parts", "*.part"+atomicfile.Suffix))
				return err == nil && len(ms) > 0
			}, "writing a part after its first layer")
			code, out, errs := runCLI(t, append(at(1), "--json")...)
			if code != exitOK {
				t.Fatalf("worker 1/3 again: status %d\n%s\n%s", code, out, errs)
			}
			var rep struct {
				ResumedAt int `json:"resumed_at_layer"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ResumedAt == 0 {
				t.Errorf("the rerun resumed at layer %d (%v), want after the first:\n%s", rep.ResumedAt, err, out)
			}
			if code, out, errs := runCLI(t, "assemble", dir); code != exitOK {
				t.Fatalf("assemble: status %d\n%s\n%s", code, out, errs)
			}
			sameFiles(t, "after the rerun", want, dirFiles(t, dir))
			// A worker run again on the assembled store does nothing.
			if code, out, errs := runCLI(t, at(2)...); code != exitOK || !strings.Contains(out, "already assembled") {
				t.Errorf("worker 2/3 on the assembled store: status %d\n%s\n%s", code, out, errs)
			}
			sameFiles(t, "after a worker's rerun", want, dirFiles(t, dir))
		})
	}
}
