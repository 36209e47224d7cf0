package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

type fullDisk struct{}

func (fullDisk) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// TestFaults: a Faults value fails the writes of the files it picks, and
// only those, with nothing left behind; two of them used at once do not
// see each other (no process-global hook).
func TestFaults(t *testing.T) {
	dir := t.TempDir()
	var seen []string
	failing := Faults(func(path string, w io.Writer) io.Writer {
		seen = append(seen, path)
		if filepath.Base(path) == "full" {
			return fullDisk{}
		}
		return w
	})
	full := filepath.Join(dir, "full")
	if _, err := failing.WriteFile(full, []byte("data")); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("WriteFile on a full disk: %v, want ENOSPC", err)
	}
	for _, p := range []string{full, full + Suffix} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", p, err)
		}
	}
	// The same name through the nil Faults (and the package function) is
	// written: the failing hook is not global.
	if _, err := WriteFile(full, []byte("data")); err != nil {
		t.Fatalf("WriteFile without faults: %v", err)
	}
	ok := filepath.Join(dir, "ok")
	sum, err := failing.WriteFile(ok, []byte("data"))
	if err != nil {
		t.Fatal(err)
	}
	if _, want, _ := HashFile(ok); sum != want {
		t.Errorf("sha256 %s, file has %s", sum, want)
	}
	if len(seen) != 2 || seen[0] != full || seen[1] != ok {
		t.Errorf("hook saw %q, want the two final paths", seen)
	}
}

// TestWriteNewOnce: of writers of one path started at once, exactly one
// places its file, whole, and nothing else is left in the directory; a
// later writer finds the file and leaves it as it is.
func TestWriteNewOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "head.json")
	const n = 16
	created := make(chan int, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			ok, err := WriteNew(path, []byte(strconv.Itoa(i)))
			if ok {
				created <- i
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(created)
	var firsts []int
	for i := range created {
		firsts = append(firsts, i)
	}
	if len(firsts) != 1 {
		t.Fatalf("%d writers placed the file, want 1", len(firsts))
	}
	check := func(when string) {
		t.Helper()
		got, err := os.ReadFile(path)
		if err != nil || string(got) != strconv.Itoa(firsts[0]) {
			t.Fatalf("%s: %q, %v; want the first writer's %d", when, got, err, firsts[0])
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Fatalf("%s: %d files in the directory, want 1", when, len(ents))
		}
	}
	check("after the writers")
	if ok, err := WriteNew(path, []byte("later")); ok || err != nil {
		t.Fatalf("a later writer: created %v, %v", ok, err)
	}
	check("after a later writer")
}
