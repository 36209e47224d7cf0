package manifest

// AtomicFile is a file written under a temporary name (the final name plus
// ".partial") and renamed into place by Commit after an fsync, so that a
// crash never leaves a truncated file under the final name. It hashes what
// is written. Packages that write next to checkpoints (manifest/ttnn) use
// it.
type AtomicFile struct{ a *atomicFile }

// CreateAtomic starts writing path, creating its directory if needed.
func CreateAtomic(path string) (*AtomicFile, error) {
	a, err := createAtomic(path)
	if err != nil {
		return nil, err
	}
	return &AtomicFile{a}, nil
}

// Write appends p.
func (f *AtomicFile) Write(p []byte) (int, error) { return f.a.Write(p) }

// Commit flushes the file to disk and renames it into place; it returns the
// size and sha256 of what was written.
func (f *AtomicFile) Commit() (int64, string, error) { return f.a.Commit() }

// Abort removes the temporary file; it is a no-op after Commit.
func (f *AtomicFile) Abort() { f.a.Abort() }
