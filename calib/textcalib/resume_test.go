package textcalib

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model/walk"
	"github.com/ttquant/ttquant/safetensors"
)

// resumeOptions: 3 sequences of 32 tokens, F32, 32 rows per shard of a
// 128-wide site (so sites span several shards).
func resumeOptions(t *testing.T, out string) Options {
	opt := trainedOptions(t, out, 3, 32)
	opt.Store.ShardBytes = 32 * 128 * 4
	return opt
}

// tree returns every file under dir (relative name → bytes).
func tree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, what string, got, want map[string][]byte) {
	t.Helper()
	var names []string
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		g, ok := got[n]
		if !ok {
			t.Errorf("%s: %s missing", what, n)
		} else if !bytes.Equal(g, want[n]) {
			t.Errorf("%s: %s differs from the uninterrupted build's", what, n)
		}
	}
	for n := range got {
		if _, ok := want[n]; !ok {
			t.Errorf("%s: extra file %s", what, n)
		}
	}
}

var (
	refOnce sync.Once
	refTree map[string][]byte
	refErr  error
)

// reference is the store of an uninterrupted build with resumeOptions.
func reference(t *testing.T) map[string][]byte {
	t.Helper()
	refOnce.Do(func() {
		out := filepath.Join(t.TempDir(), "ref")
		if _, refErr = Build(context.Background(), resumeOptions(t, out)); refErr == nil {
			refTree = tree(t, out)
		}
	})
	if refErr != nil {
		t.Fatal(refErr)
	}
	return refTree
}

// notAStore checks that an interrupted build left no store but a partial
// directory to resume from.
func notAStore(t *testing.T, out string) {
	t.Helper()
	if _, err := calib.OpenStore(out); err == nil {
		t.Errorf("the unfinished build in %s opens as a store", out)
	}
	if _, err := os.Stat(filepath.Join(out, PartialDir, walk.InputsName)); err != nil {
		t.Errorf("no build record to resume from: %v", err)
	}
}

var errStop = errors.New("stopped by the test")

// stopAfter is an afterStep hook that stops the build with errStop once
// step k is done.
func stopAfter(k int) func(int) error {
	return func(step int) error {
		if step == k {
			return errStop
		}
		return nil
	}
}

// TestResumeByteIdentical interrupts a build at several points — after a
// finished layer (an error from the step hook), inside a layer (the
// context cancelled while its shards are being written), after the last
// (MTP) layer but before the index, and from the progress callback — and
// resumes each time; the final store is byte-identical to an uninterrupted
// build's, with nothing of the partial state left.
func TestResumeByteIdentical(t *testing.T) {
	want := reference(t)
	out := filepath.Join(t.TempDir(), "store")

	// 1. Stop after layer 0.
	opt := resumeOptions(t, out)
	opt.afterStep = stopAfter(0)
	if _, err := Build(context.Background(), opt); !errors.Is(err, errStop) || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("stop after layer 0: %v", err)
	}
	notAStore(t, out)

	// 2. Cancel inside layer 3, once its first shard is being written.
	ctx, cancel := context.WithCancel(context.Background())
	opt = resumeOptions(t, out)
	var resumedMsg string
	opt.Progress = func(msg string) {
		if strings.HasPrefix(msg, "resuming") {
			resumedMsg = msg
		}
	}
	opt.Store.Faults = func(path string, w io.Writer) io.Writer {
		if strings.HasPrefix(filepath.Base(path), "layer003.") {
			cancel()
		}
		return w
	}
	if _, err := Build(ctx, opt); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel inside layer 3: %v", err)
	}
	if !strings.Contains(resumedMsg, "at layer 1") {
		t.Errorf("the second run did not resume at layer 1: %q", resumedMsg)
	}
	if _, err := os.Stat(filepath.Join(out, PartialDir, walk.RecordName(3))); !os.IsNotExist(err) {
		t.Errorf("layer 3 was recorded although its run was cancelled inside it (%v)", err)
	}
	notAStore(t, out)
	// A killed process leaves temporary files and half-written shards of
	// the layer it was in; a resumed build replaces them.
	for _, name := range []string{"layer003.attn.00000.safetensors", ".layer003.attn.00001.safetensors.tmp-123",
		filepath.Join(PartialDir, walk.StreamName(3, 0)+atomicfile.Suffix), filepath.Join(PartialDir, walk.RecordName(3)+atomicfile.Suffix),
		filepath.Join(PartialDir, walk.StreamName(1, 0)), filepath.Join(PartialDir, walk.RecordName(4))} {
		if err := os.WriteFile(filepath.Join(out, name), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// 3. Stop after the MTP layer (layer 4), before the index.
	opt = resumeOptions(t, out)
	opt.afterStep = stopAfter(4)
	res, err := Build(context.Background(), opt)
	if !errors.Is(err, errStop) {
		t.Fatalf("stop after the MTP layer: %v", err)
	}
	notAStore(t, out)

	// 4. Finish: only the index is left to write.
	res, err = Build(context.Background(), resumeOptions(t, out))
	if err != nil {
		t.Fatal(err)
	}
	if res.ResumedAt != 5 {
		t.Errorf("the last run resumed at layer %d, want 5", res.ResumedAt)
	}
	sameTree(t, "resumed after 3 interruptions", tree(t, out), want)

	// 5. Cancel from the progress callback after layer 2, then resume.
	out2 := filepath.Join(t.TempDir(), "store")
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	opt = resumeOptions(t, out2)
	opt.Progress = func(msg string) {
		if strings.HasPrefix(msg, "layer 2 written") {
			cancel()
		}
	}
	if _, err := Build(ctx, opt); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel after layer 2: %v", err)
	}
	notAStore(t, out2)
	if res, err = Build(context.Background(), resumeOptions(t, out2)); err != nil {
		t.Fatalf("resume after layer 2: %v", err)
	}
	if res.ResumedAt != 3 {
		t.Errorf("resumed at layer %d, want 3", res.ResumedAt)
	}
	sameTree(t, "resumed after a cancel at layer 2", tree(t, out2), want)
}

// TestInterruptedBeforeFirstLayer: a build stopped before any layer is
// finished leaves nothing behind.
func TestInterruptedBeforeFirstLayer(t *testing.T) {
	out := filepath.Join(t.TempDir(), "store")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opt := resumeOptions(t, out)
	opt.Store.Faults = func(_ string, w io.Writer) io.Writer {
		cancel()
		return w
	}
	if _, err := Build(ctx, opt); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "removed") {
		t.Fatalf("interrupted build: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a build interrupted in its first layer left %s behind (%v)", out, err)
	}
}

// TestResumeRefusesDifferentInputs: an unfinished build is resumed only
// with the same model, data and options; a different one is refused before
// anything is touched, naming what differs.
func TestResumeRefusesDifferentInputs(t *testing.T) {
	want := reference(t)
	out := filepath.Join(t.TempDir(), "store")
	opt := resumeOptions(t, out)
	opt.afterStep = stopAfter(1)
	if _, err := Build(context.Background(), opt); !errors.Is(err, errStop) {
		t.Fatal(err)
	}
	before := tree(t, out)
	for _, c := range []struct {
		name string
		edit func(o *Options)
		want []string
	}{
		{"dtype", func(o *Options) { o.Store.DType = safetensors.BF16 }, []string{"dtype was F32, now BF16"}},
		{"shard size", func(o *Options) { o.Store.ShardBytes = 1 << 20 }, []string{"shard bytes was 16384, now 1048576"}},
		{"sequence length", func(o *Options) { o.DataOptions.Calibration.SeqLen = 16 }, []string{"tokens was 96, now 48", "token ids sha256", "data provenance differs in calibration, options"}},
		{"seed", func(o *Options) { o.DataOptions.Seed = 2 }, []string{"token ids sha256 was"}},
	} {
		o := resumeOptions(t, out)
		c.edit(&o)
		_, err := Build(context.Background(), o)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", c.name, err, w)
			}
		}
		sameTree(t, c.name+" refusal", tree(t, out), before)
	}
	if _, err := Build(context.Background(), resumeOptions(t, out)); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "resumed after refusals", tree(t, out), want)
}

// TestBuildWorkers: 1 and 2 workers write the same bytes.
func TestBuildWorkers(t *testing.T) {
	var trees []map[string][]byte
	for _, w := range []int{1, 2} {
		prev := kernels.SetWorkers(w)
		out := filepath.Join(t.TempDir(), "store")
		_, err := Build(context.Background(), resumeOptions(t, out))
		kernels.SetWorkers(prev)
		if err != nil {
			t.Fatal(err)
		}
		trees = append(trees, tree(t, out))
	}
	sameTree(t, "2 workers against 1", trees[1], trees[0])
}

// fullDisk fails writes to files whose name has prefix, after limit bytes
// in all, as a full disk does.
type fullDisk struct {
	prefix string
	limit  int64
	mu     sync.Mutex
	n      int64
	hit    bool
}

func (f *fullDisk) wrap(path string, w io.Writer) io.Writer {
	name := filepath.Base(path)
	if !strings.HasPrefix(name, f.prefix) {
		return w
	}
	return writerFunc(func(p []byte) (int, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.n+int64(len(p)) > f.limit {
			k := max(0, f.limit-f.n)
			w.Write(p[:k])
			f.n += k
			f.hit = true
			return int(k), &fs.PathError{Op: "write", Path: name, Err: syscall.ENOSPC}
		}
		f.n += int64(len(p))
		return w.Write(p)
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestDiskFull: a write failing with ENOSPC — in a shard, in the residual
// stream kept for resuming, in the index — stops the build with the
// error; what is left does not open as a store, and once space is freed
// the same build resumes and writes the same bytes as an uninterrupted one.
func TestDiskFull(t *testing.T) {
	want := reference(t)
	for _, c := range []struct {
		file  string
		limit int64
	}{
		{"layer002.mlp.", 5000},     // inside a shard of layer 2
		{"stream-002.f32", 10000},   // the stream entering layer 3
		{calib.StoreIndexName, 100}, // the index
	} {
		t.Run(c.file, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "store")
			opt := resumeOptions(t, out)
			fd := &fullDisk{prefix: c.file, limit: c.limit}
			opt.Store.Faults = fd.wrap
			_, err := Build(context.Background(), opt)
			if !errors.Is(err, syscall.ENOSPC) || !fd.hit {
				t.Fatalf("full disk at %s: %v (hit %v)", c.file, err, fd.hit)
			}
			if !strings.Contains(err.Error(), "no space left") || !strings.Contains(err.Error(), "resume") {
				t.Errorf("error does not say what happened and what to do: %v", err)
			}
			notAStore(t, out)
			if _, err := os.Stat(filepath.Join(out, calib.StoreIndexName)); !os.IsNotExist(err) {
				t.Errorf("index present after a failed build (%v)", err)
			}
			if _, err := Build(context.Background(), resumeOptions(t, out)); err != nil {
				t.Fatalf("resume after space was freed: %v", err)
			}
			sameTree(t, fmt.Sprintf("resumed after a full disk at %s", c.file), tree(t, out), want)
		})
	}
	// A full disk in the first layer of a fresh build leaves nothing.
	out := filepath.Join(t.TempDir(), "store")
	opt := resumeOptions(t, out)
	opt.Store.Faults = (&fullDisk{prefix: "layer000.", limit: 100}).wrap
	if _, err := Build(context.Background(), opt); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("full disk in layer 0: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a build failing in its first layer left %s behind (%v)", out, err)
	}
}

// TestResumeDamaged: a kept residual stream or shard that does not match
// its record stops the resume with an error saying so and what to do.
func TestResumeDamaged(t *testing.T) {
	for _, c := range []struct {
		name string
		file string // relative to the store
		want string
	}{
		{"stream", filepath.Join(PartialDir, walk.StreamName(1, 0)), "sha256"},
		{"shard", "layer001.mlp.00001.safetensors", "layer001.mlp.00001"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "store")
			opt := resumeOptions(t, out)
			opt.afterStep = stopAfter(1)
			if _, err := Build(context.Background(), opt); !errors.Is(err, errStop) {
				t.Fatal(err)
			}
			path := filepath.Join(out, c.file)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)-9] ^= 1
			if c.name == "shard" {
				b = b[:len(b)-4] // truncated
			}
			os.WriteFile(path, b, 0o644)
			_, err = Build(context.Background(), resumeOptions(t, out))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "start over") || strings.Contains(err.Error(), "run the same command again") {
				t.Errorf("damaged %s: %v", c.name, err)
			}
		})
	}
}

// TestBuildLocked: a second build into a directory that another holds is
// refused at once, and the holder's directory is left alone.
func TestBuildLocked(t *testing.T) {
	out := filepath.Join(t.TempDir(), "store")
	lk, err := fslock.Acquire(out)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release()
	before := tree(t, out)
	if _, err := Build(context.Background(), resumeOptions(t, out)); !errors.Is(err, fslock.ErrHeld) {
		t.Fatalf("build into a locked directory: %v", err)
	}
	sameTree(t, "locked directory", tree(t, out), before)
}

// TestBatchRowsSameBytes: the layers run over batches of whole sequences
// (forward.BatchRows); batches of one sequence each write the store of one
// batch of all.
func TestBatchRowsSameBytes(t *testing.T) {
	want := tree(t, buildWith(t, 1<<30))
	sameTree(t, "one sequence per batch", tree(t, buildWith(t, 1)), want)
}

func buildWith(t *testing.T, rows int) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "store")
	opt := resumeOptions(t, out)
	opt.batchRows = rows
	if _, err := Build(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	return out
}
