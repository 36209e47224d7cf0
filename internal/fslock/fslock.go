// Package fslock gives one process at a time the right to write a
// directory: an advisory lock (flock) on a lock file inside the directory,
// released by Release or, if the process dies, by the kernel.
//
// The lock file records the holder's pid and command line, so a second
// process is refused at once with an error naming the holder. A lock file
// left behind by a process that died is stale: its flock is free and the
// next Acquire takes it over. On file systems without flock the recorded
// pid decides: the lock is held while that process is alive.
package fslock

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Name is the lock file's name inside the locked directory.
const Name = ".ttquant.lock"

// ErrHeld is wrapped by the error Acquire returns when another process
// holds the lock.
var ErrHeld = errors.New("directory is locked by another process")

// HeldError names the process that holds a directory's lock.
type HeldError struct {
	Dir string
	// File is the lock file's name in Dir ("" for Name).
	File string
	// PID and Command are the holder's, as recorded in the lock file (0 and
	// "" when the file could not be read).
	PID     int
	Command string
	// Dead is set when the recorded process no longer runs although the
	// lock is held (a process that inherited the lock file).
	Dead bool
}

func (e *HeldError) Error() string {
	who := "another process"
	switch {
	case e.PID > 0 && e.Dead:
		who = fmt.Sprintf("an unknown process (the lock file names pid %d, which no longer runs)", e.PID)
	case e.PID > 0 && e.Command != "":
		who = fmt.Sprintf("pid %d (%s)", e.PID, e.Command)
	case e.PID > 0:
		who = fmt.Sprintf("pid %d", e.PID)
	}
	name := e.File
	if name == "" {
		name = Name
	}
	return fmt.Sprintf("%s is being written by %s; wait for it to finish or stop it (lock file %s)",
		e.Dir, who, filepath.Join(e.Dir, name))
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// holder is the content of a lock file.
type holder struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
}

// Lock is a held directory lock.
type Lock struct {
	f    *os.File
	path string
	// created lists the directories Acquire created, deepest first.
	created []string
	// Stale is the pid recorded in a lock file that Acquire took over
	// from a process that had died (0 when there was none).
	Stale int
}

// Acquire locks dir for writing, creating it (and its parents) when it does
// not exist. It never waits: when another process holds the lock the error
// is a *HeldError. Release undoes everything Acquire did, directories it
// created included when they are still empty.
func Acquire(dir string) (*Lock, error) { return AcquireNamed(dir, Name) }

// AcquireExisting is Acquire for a directory that must already exist (an
// output to finish, not one to create): a missing path or one that is not
// a directory is an error, and nothing is created.
func AcquireExisting(dir string) (*Lock, error) {
	if fi, err := os.Stat(dir); err != nil {
		return nil, err
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	return Acquire(dir)
}

// AcquireNamed is Acquire with a lock file of another name in dir: the
// workers of a split build each lock their own share of a directory.
func AcquireNamed(dir, name string) (*Lock, error) {
	var created []string
	for attempt := 0; ; attempt++ {
		c, err := mkdirs(dir)
		created = mergeDirs(created, c)
		if errors.Is(err, os.ErrNotExist) && attempt < 100 {
			continue // a parent was removed while we created the path
		}
		if err != nil {
			removeDirs(created)
			return nil, err
		}
		l, err := acquire(dir, name)
		if errors.Is(err, os.ErrNotExist) && attempt < 100 {
			// Another process that had created the directory released
			// its lock and removed the directory in between: again.
			continue
		}
		if err != nil {
			removeDirs(created)
			return nil, err
		}
		l.created = created
		return l, nil
	}
}

// mergeDirs returns the union of two lists of directories, deepest first.
func mergeDirs(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, d := range append(append([]string(nil), a...), b...) {
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func acquire(dir, name string) (*Lock, error) {
	path := filepath.Join(dir, name)
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("locking %s: %w", dir, err)
		}
		ok, supported, err := tryLock(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", dir, err)
		}
		if supported && !ok {
			h, gone := waitHolder(f, path)
			f.Close()
			if gone && attempt < 100 {
				continue // released while we looked: try again
			}
			e := &HeldError{Dir: dir, File: name, PID: h.PID, Command: h.Command}
			e.Dead = h.PID > 0 && !pidAlive(h.PID)
			return nil, e
		}
		// The file may have been removed (and recreated) by a holder that
		// released it between our open and our lock: then we hold a lock
		// on a file nobody else will open, and must start again.
		if !samePath(f, path) {
			f.Close()
			if attempt >= 100 {
				return nil, fmt.Errorf("locking %s: the lock file keeps changing", dir)
			}
			continue
		}
		prev := readHolder(f)
		l := &Lock{f: f, path: path}
		if prev.PID > 0 && prev.PID != os.Getpid() {
			if !supported && pidAlive(prev.PID) {
				f.Close()
				return nil, &HeldError{Dir: dir, File: name, PID: prev.PID, Command: prev.Command}
			}
			l.Stale = prev.PID
		}
		if err := writeHolder(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", dir, err)
		}
		return l, nil
	}
}

// waitHolder reads the holder of a held lock from the locked file. The
// holder writes its pid right after locking; a reader that comes in between
// waits briefly for it. gone reports that the holder released the lock
// (the file left its path) before its pid could be read.
func waitHolder(f *os.File, path string) (h holder, gone bool) {
	for i := 0; i < 50; i++ {
		if h = readHolder(f); h.PID > 0 {
			return h, false
		}
		if !samePath(f, path) {
			return h, true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return h, false
}

func samePath(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

func readHolder(f *os.File) holder {
	var h holder
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<16))
	if err == nil {
		json.Unmarshal(b, &h)
	}
	return h
}

func writeHolder(f *os.File) error {
	b, _ := json.Marshal(holder{PID: os.Getpid(), Command: commandLine()})
	b = append(b, '\n')
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt(b, 0)
	return err
}

// commandLine is this process's command line, shortened for messages.
func commandLine() string {
	args := append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...)
	s := strings.Join(args, " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// Release removes the lock file, unlocks, and removes the directories
// Acquire created if they are empty. It is safe to call more than once.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	// Remove while still holding the lock: a process that opened the old
	// file sees it is no longer at the path and starts again.
	err := os.Remove(l.path)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	removeDirs(l.created)
	return err
}

// mkdirs creates dir and its missing parents and returns the directories it
// had to create, deepest first (also on failure, when some may exist).
func mkdirs(dir string) ([]string, error) {
	var missing []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	// On failure the caller still gets the list: some of it may exist.
	return missing, os.MkdirAll(dir, 0o755)
}

func removeDirs(dirs []string) {
	for _, d := range dirs {
		if os.Remove(d) != nil {
			return
		}
	}
}
