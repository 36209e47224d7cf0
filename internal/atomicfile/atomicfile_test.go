package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
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
