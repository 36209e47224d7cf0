package build

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ErrNoSpace is wrapped by the error of a build whose output file system
// has less free space than the build still has to write.
var ErrNoSpace = errors.New("not enough free disk space for the build")

// DiskSpaceError is the refusal of a build that would not fit on the file
// system of its output directory: Files is what it still has to write of
// the checkpoint (its share, for a worker of a split build), Scratch the
// residual streams a sequential build keeps, Free the space there (Dir is
// the output directory or its nearest existing parent).
type DiskSpaceError struct {
	Dir                  string
	Files, Scratch, Free int64
}

func (e *DiskSpaceError) Error() string {
	mib := func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
	return fmt.Sprintf("%v: the build needs %s (%s of files still to write, %s of scratch streams) and %s is free on the file system of %s; free some space or choose another --out",
		ErrNoSpace, mib(e.Files+e.Scratch), mib(e.Files), mib(e.Scratch), mib(e.Free), e.Dir)
}

func (e *DiskSpaceError) Unwrap() error { return ErrNoSpace }

// checkDisk refuses, before the first write, a build whose files still to
// write and scratch streams exceed the free space of the output's file
// system. A file an earlier run recorded counts as kept (its hash is
// checked later; one that fails is written again, into space it frees).
// Where the free space cannot be told, nothing is refused.
func (b *builder) checkDisk(recs map[string]*fileRecord) error {
	free, dir := b.freeAt(b.opt.Out)
	if free < 0 {
		return nil
	}
	e := &DiskSpaceError{Dir: dir, Free: free}
	for i, j := range b.jobs {
		if b.owns(i) && recs[j.file] == nil {
			e.Files += j.bytes
		}
	}
	for _, st := range b.ownedParts { // a worker's tensors of dense shards
		if _, err := os.Stat(partPath(b.opt.Out, st.name) + ".json"); err != nil {
			e.Files += st.outSize
		}
	}
	if b.seq != nil {
		e.Scratch = b.sequentialWork(b.modelCfg, 0, 0).ScratchBytes
	}
	if e.Files+e.Scratch > free {
		return e
	}
	return nil
}

// freeAt finds the free space where dir is or would be created: on the
// file system of dir or of its nearest existing parent.
func freeAt(dir string) (int64, string) {
	if dir == "" {
		return -1, ""
	}
	d, err := filepath.Abs(dir)
	if err != nil {
		return -1, ""
	}
	for {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			if n, ok := freeBytes(d); ok {
				return n, d
			}
			return -1, ""
		}
		parent := filepath.Dir(d)
		if parent == d {
			return -1, ""
		}
		d = parent
	}
}

// freeAt is freeAt, or the test's stand-in.
func (b *builder) freeAt(dir string) (int64, string) {
	if b.opt.freeSpace != nil {
		return b.opt.freeSpace(dir)
	}
	return freeAt(dir)
}
