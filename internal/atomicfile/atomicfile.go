// Package atomicfile writes files so that a reader never sees a partial
// one: the bytes go to a temporary name beside the final one, are flushed,
// and the file is renamed into place. Every finished or resumable file
// ttquant writes goes through it, but the shards the streaming safetensors
// writer writes itself.
package atomicfile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Suffix marks a file being written. A file with this suffix is never
// part of a finished checkpoint.
const Suffix = ".partial"

// File is a file written under a temporary name (final + ".partial")
// and renamed into place by Commit after an fsync. It hashes what is
// written.
type File struct {
	f     *os.File
	final string
	tmp   string
	h     hash.Hash
	n     int64
	w     io.Writer
	done  bool
}

// Faults, when set, wraps the writer of every file written through it
// (Faults.Create, Faults.WriteFile, or any writer passed to Wrap), given
// the file's final path. It exists for fault injection: a test returns a
// writer that fails as a full disk would (syscall.ENOSPC), or notes that a
// file was started. It is a value held by the options of whoever writes,
// so tests with different faults run in parallel. The nil Faults writes
// unchanged.
type Faults func(path string, w io.Writer) io.Writer

// Wrap returns w as f wraps it for the file path (w itself when f is nil).
func (f Faults) Wrap(path string, w io.Writer) io.Writer {
	if f == nil {
		return w
	}
	return f(path, w)
}

// Create starts writing final under its temporary name, creating the
// directory if needed.
func Create(final string) (*File, error) { return Faults(nil).Create(final) }

// Create is the package's Create with the writes going through f.
func (f Faults) Create(final string) (*File, error) {
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return nil, err
	}
	fh, err := os.OpenFile(final+Suffix, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return f.open(fh, final), nil
}

// open is the File writing final through fh, its temporary file.
func (f Faults) open(fh *os.File, final string) *File {
	a := &File{f: fh, final: final, tmp: fh.Name(), h: sha256.New()}
	a.w = f.Wrap(final, io.MultiWriter(fh, a.h))
	return a
}

func (a *File) Write(p []byte) (int, error) {
	n, err := a.w.Write(p)
	a.n += int64(n)
	return n, err
}

// Commit flushes the file to disk and renames it into place. It returns the
// size and sha256 of what was written.
func (a *File) Commit() (int64, string, error) { return a.commit(os.Rename) }

// commit is Commit putting the temporary file in place by place (a rename,
// or a link that never replaces a file).
func (a *File) commit(place func(tmp, final string) error) (int64, string, error) {
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
	if err := place(a.tmp, a.final); err != nil {
		os.Remove(a.tmp)
		return 0, "", err
	}
	SyncDir(filepath.Dir(a.final))
	return a.n, hex.EncodeToString(a.h.Sum(nil)), nil
}

// Abort removes the temporary file. It is a no-op after Commit.
func (a *File) Abort() {
	if a.done {
		return
	}
	a.done = true
	a.f.Close()
	os.Remove(a.tmp)
}

// Durable makes Commit flush files to stable storage before renaming them.
// Tests turn it off: they check contents, not durability, and flushing
// makes them slow on shared disks.
var Durable = true

func (a *File) sync() error {
	if !Durable {
		return nil
	}
	return a.f.Sync()
}

// SyncDir makes a rename durable where the platform allows it; errors are
// ignored because some file systems refuse to sync directories.
func SyncDir(dir string) {
	if !Durable {
		return
	}
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	d.Sync()
	d.Close()
}

// WriteFile writes data to path via a temporary file and a rename and
// returns its sha256.
func WriteFile(path string, data []byte) (string, error) { return Faults(nil).WriteFile(path, data) }

// WriteFile is the package's WriteFile with the writes going through f.
func (f Faults) WriteFile(path string, data []byte) (string, error) {
	a, err := f.Create(path)
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

// WriteNew writes data to path as WriteFile does, unless a file is there:
// of several processes writing path at once, the first to finish places
// its file and the others find it there. created says whether this call
// placed it. Each call writes to a temporary name of its own and links it
// into place (a link, unlike a rename, never replaces a file).
func WriteNew(path string, data []byte) (created bool, err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	fh, err := os.CreateTemp(dir, filepath.Base(path)+".*"+Suffix)
	if err != nil {
		return false, err
	}
	a := Faults(nil).open(fh, path)
	if err := fh.Chmod(0o644); err != nil { // CreateTemp makes the file private
		a.Abort()
		return false, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := a.Write(data); err != nil {
		a.Abort()
		return false, fmt.Errorf("%s: %w", path, err)
	}
	_, _, err = a.commit(func(tmp, final string) error {
		err := os.Link(tmp, final)
		os.Remove(tmp)
		return err
	})
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	return err == nil, err
}

// WriteJSON writes v as indented JSON with a trailing newline, the form of
// every record a build or a walk keeps for resuming.
func (f Faults) WriteJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	_, err = f.WriteFile(path, append(data, '\n'))
	return err
}

// HashFile returns the size and sha256 of a file.
func HashFile(path string) (int64, string, error) {
	return HashFileContext(context.Background(), path)
}

// HashFileContext is HashFile that stops, with ctx's error, once ctx is
// done (HashReader).
func HashFileContext(ctx context.Context, path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	return HashReader(ctx, path, f, nil)
}

// cancelCheckBytes bounds the bytes read between two checks for
// cancellation while hashing or copying large files, so an interrupt is
// answered within a fraction of a second at any disk speed.
const cancelCheckBytes = 8 << 20

// ctxReader is an io.Reader that fails with the context's error once the
// context is done, and reads at most cancelCheckBytes per call.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	if len(p) > cancelCheckBytes {
		p = p[:cancelCheckBytes]
	}
	return c.r.Read(p)
}

// ContextReader returns r reading at most 8 MiB a call and failing with
// ctx's error once ctx is done, so that a copy through it stops soon
// after a cancellation.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx, r} }

// HashReader reads r to its end (through ContextReader) and returns the
// number of bytes and their sha256, also writing them to also when it is
// not nil: one pass over the bytes for the hash and for whatever else must
// see them. A read error names path; a cancellation is ctx's error.
func HashReader(ctx context.Context, path string, r io.Reader, also io.Writer) (int64, string, error) {
	h := sha256.New()
	var dst io.Writer = h
	if also != nil {
		dst = io.MultiWriter(h, also)
	}
	n, err := io.CopyBuffer(dst, ctxReader{ctx, r}, make([]byte, 1<<20))
	if err != nil {
		if ctx.Err() != nil {
			return n, "", ctx.Err()
		}
		return 0, "", fmt.Errorf("%s: %w", path, err)
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}
