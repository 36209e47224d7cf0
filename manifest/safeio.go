package manifest

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/ttquant/ttquant/internal/atomicfile"
)

// DefaultMaxManifestBytes caps the size of a manifest that Verify and
// OpenCheckpoint read. A manifest holds a few hundred bytes per tensor; the
// largest models supported need a few tens of MiB.
const DefaultMaxManifestBytes = 64 << 20

// OpenRegular opens path for reading only if it is a regular file (after
// following symbolic links). The open does not block on a named pipe or a
// device, and what was opened is checked, so a file swapped for a pipe
// between a directory listing and the open is refused too.
func OpenRegular(path string) (*os.File, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %s, not a regular file", path, fileKind(fi.Mode()))
	}
	return f, fi, nil
}

// fileKind names a file's type for messages.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m.IsDir():
		return "a directory"
	}
	return "an irregular file"
}

// HashFileContext returns the size and sha256 of a regular file, checking
// ctx every cancelCheckBytes.
func HashFileContext(ctx context.Context, path string) (int64, string, error) {
	return HashFileScan(ctx, path, nil)
}

// scanWriter hands every chunk hashed to a scan function with its offset.
type scanWriter struct {
	off  int64
	scan func(off int64, p []byte)
}

func (w *scanWriter) Write(p []byte) (int, error) {
	w.scan(w.off, p)
	w.off += int64(len(p))
	return len(p), nil
}

// HashFileScan is HashFileContext that also hands every chunk it reads,
// in order, with its offset in the file, to scan (when not nil): one pass
// over the bytes for the hash and for whatever else must see them all.
func HashFileScan(ctx context.Context, path string, scan func(off int64, p []byte)) (int64, string, error) {
	f, _, err := OpenRegular(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	var also io.Writer
	if scan != nil {
		also = &scanWriter{scan: scan}
	}
	return atomicfile.HashReader(ctx, path, f, also)
}

// ReadManifestFile reads a manifest: a regular file of at most max bytes
// (DefaultMaxManifestBytes when max is 0). The size is checked before
// anything is read.
func ReadManifestFile(path string, max int64) ([]byte, error) {
	if max <= 0 {
		max = DefaultMaxManifestBytes
	}
	f, fi, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi.Size() > max {
		return nil, &manifestTooLargeError{path: path, size: fi.Size(), max: max}
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, &manifestTooLargeError{path: path, size: int64(len(data)), max: max}
	}
	return data, nil
}

type manifestTooLargeError struct {
	path      string
	size, max int64
}

func (e *manifestTooLargeError) Error() string {
	return fmt.Sprintf("%s is %d bytes, over the %d-byte limit for a manifest; refused without reading it", e.path, e.size, e.max)
}

// insideDir reports whether the symbolic link at path resolves to a regular
// file inside root (both resolved), and if not, why.
func insideDir(root, path string) (bool, string) {
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return false, err.Error()
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false, "a symbolic link that does not resolve: " + err.Error()
	}
	rel, err := filepath.Rel(realRoot, target)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return false, "a symbolic link pointing outside the checkpoint; refused"
	}
	fi, err := os.Stat(target)
	if err != nil {
		return false, err.Error()
	}
	if !fi.Mode().IsRegular() {
		return false, "a symbolic link to " + fileKind(fi.Mode()) + "; refused without opening"
	}
	return true, ""
}
