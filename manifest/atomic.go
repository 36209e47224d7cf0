package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// partialSuffix marks a file being written. A file with this suffix is never
// part of a finished checkpoint.
const partialSuffix = ".partial"

// atomicFile is a file written under a temporary name (final + ".partial")
// and renamed into place by Commit after an fsync. It hashes what is
// written.
type atomicFile struct {
	f     *os.File
	final string
	tmp   string
	h     hash.Hash
	n     int64
	w     io.Writer
	done  bool
}

func createAtomic(final string) (*atomicFile, error) {
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return nil, err
	}
	tmp := final + partialSuffix
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	a := &atomicFile{f: f, final: final, tmp: tmp, h: sha256.New()}
	a.w = io.MultiWriter(f, a.h)
	return a, nil
}

func (a *atomicFile) Write(p []byte) (int, error) {
	n, err := a.w.Write(p)
	a.n += int64(n)
	return n, err
}

// Commit flushes the file to disk and renames it into place. It returns the
// size and sha256 of what was written.
func (a *atomicFile) Commit() (int64, string, error) {
	a.done = true
	if err := a.sync(); err != nil {
		a.f.Close()
		os.Remove(a.tmp)
		return 0, "", fmt.Errorf("%s: %w", a.final, err)
	}
	if err := a.f.Close(); err != nil {
		os.Remove(a.tmp)
		return 0, "", fmt.Errorf("%s: %w", a.final, err)
	}
	if err := os.Rename(a.tmp, a.final); err != nil {
		os.Remove(a.tmp)
		return 0, "", err
	}
	syncDir(filepath.Dir(a.final))
	return a.n, hex.EncodeToString(a.h.Sum(nil)), nil
}

// Abort removes the temporary file. It is a no-op after Commit.
func (a *atomicFile) Abort() {
	if a.done {
		return
	}
	a.done = true
	a.f.Close()
	os.Remove(a.tmp)
}

// durable makes Commit flush files to stable storage before renaming them.
// Tests turn it off: they check contents, not durability, and flushing
// makes them slow on shared disks.
var durable = true

func (a *atomicFile) sync() error {
	if !durable {
		return nil
	}
	return a.f.Sync()
}

// syncDir makes a rename durable where the platform allows it; errors are
// ignored because some file systems refuse to sync directories.
func syncDir(dir string) {
	if !durable {
		return
	}
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	d.Sync()
	d.Close()
}

// writeFileAtomic writes data to path via a temporary file and a rename and
// returns its sha256.
func writeFileAtomic(path string, data []byte) (string, error) {
	a, err := createAtomic(path)
	if err != nil {
		return "", err
	}
	if _, err := a.Write(data); err != nil {
		a.Abort()
		return "", fmt.Errorf("%s: %w", path, err)
	}
	_, sum, err := a.Commit()
	return sum, err
}

// sha256Hex returns the hex sha256 of b.
func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// encodeSums renders a SHA256SUMS file (the text format of `sha256sum`:
// hash, two spaces, name) for the given entries, sorted by name. Names use
// forward slashes relative to the checkpoint directory.
func encodeSums(files []FileEntry) []byte {
	fs := append([]FileEntry(nil), files...)
	sort.Slice(fs, func(i, j int) bool { return fs[i].Name < fs[j].Name })
	var b bytes.Buffer
	for _, f := range fs {
		fmt.Fprintf(&b, "%s  %s\n", f.SHA256, f.Name)
	}
	return b.Bytes()
}

// validRelName reports whether name is a clean relative path inside a
// checkpoint directory (no "..", no absolute path, forward slashes, no
// characters that sha256sum would escape).
func validRelName(name string) bool {
	if name == "" || strings.HasPrefix(name, "/") || strings.ContainsAny(name, "\\\n\r\x00") {
		return false
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." {
			return false
		}
	}
	return true
}
