//go:build linux || darwin

package testmodel

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// diskUsage returns the bytes allocated on disk by the files of dir.
func diskUsage(t *testing.T, dir string) int64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, e := range entries {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, e.Name()), &st); err != nil {
			t.Fatal(err)
		}
		total += int64(st.Blocks) * 512
	}
	return total
}
