package build

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/internal/shard"
)

// lowDisk stands in for a file system with free bytes free.
func lowDisk(free int64) func(string) (int64, string) {
	return func(dir string) (int64, string) { return free, dir }
}

// TestLowDiskRefusedBeforeWork: a build that would not fit in the free
// space of its output's file system is refused before its first write,
// naming what it needs and what is free; a resumed build counts only the
// files it has still to write, and a sequential build its scratch streams
// too.
func TestLowDiskRefusedBeforeWork(t *testing.T) {
	out := filepath.Join(t.TempDir(), "ckpt")
	o := convertOpts(t, out, 1)
	o.freeSpace = lowDisk(1 << 20)
	_, err := Convert(context.Background(), o)
	var de *DiskSpaceError
	if !errors.As(err, &de) || !errors.Is(err, ErrNoSpace) {
		t.Fatalf("convert onto 1 MiB free: %v, want a DiskSpaceError", err)
	}
	if de.Free != 1<<20 || de.Files <= de.Free || de.Scratch != 0 || de.Dir != out {
		t.Errorf("refusal %+v: want the checkpoint's bytes against 1 MiB, no scratch, in %s", de, out)
	}
	if h := treeHash(t, out); h != "absent" {
		t.Errorf("the refused build wrote into %s: %v", out, mustList(out))
	}
	full := de.Files

	// A build interrupted after some files needs only the rest.
	if _, err := interruptAt(t, convertOpts(t, out, 1), "convert", 100, ""); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	before := treeHash(t, out)
	o.freeSpace = lowDisk(1)
	if _, err = Convert(context.Background(), o); !errors.As(err, &de) {
		t.Fatalf("resume onto 1 byte free: %v, want a DiskSpaceError", err)
	}
	if de.Files <= 0 || de.Files >= full {
		t.Errorf("resume needs %d of the checkpoint's %d bytes: want only the files still to write", de.Files, full)
	}
	if treeHash(t, out) != before {
		t.Error("the refused resume changed the directory")
	}
	o.freeSpace = lowDisk(de.Files)
	if _, err := Convert(context.Background(), o); err != nil {
		t.Fatalf("resume with exactly the space it needs: %v", err)
	}

	// A worker of a split build needs its share only.
	w := convertOpts(t, filepath.Join(t.TempDir(), "split"), 1)
	w.Shard, w.freeSpace = shard.Spec{Index: 1, Count: 3}, lowDisk(1)
	if _, err := Convert(context.Background(), w); !errors.As(err, &de) || de.Files <= 0 || de.Files >= full {
		t.Errorf("worker 1/3 onto 1 byte free: %v (%+v), want a refusal for its share of the %d bytes", err, de, full)
	}
	if h := treeHash(t, w.Out); h != "absent" {
		t.Errorf("the refused worker wrote into %s: %v", w.Out, mustList(w.Out))
	}

	// The sequential build keeps the residual streams on the same disk.
	s := seqOpts(t, filepath.Join(t.TempDir(), "seq"), 1)
	s.freeSpace = lowDisk(1 << 20)
	if _, err := GPTQ(context.Background(), s); !errors.As(err, &de) || de.Scratch <= 0 {
		t.Fatalf("sequential build onto 1 MiB free: %v (%+v), want a refusal counting the scratch streams", err, de)
	}
	// Where the free space cannot be told nothing is refused.
	if err := (&builder{opt: BuildOptions{Out: out, freeSpace: lowDisk(-1)}}).checkDisk(nil); err != nil {
		t.Errorf("unknown free space refused: %v", err)
	}
}

func mustList(dir string) []string {
	var l []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error { l = append(l, p); return nil })
	return l
}
