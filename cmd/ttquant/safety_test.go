package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/testmodel"
)

// tinyModel writes the built-in tiny model into a fresh directory.
func tinyModel(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Write(src, testmodel.Tiny(), testmodel.Default); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestConvertRefusedWhileDirectoryLocked: a second writer of an output
// directory fails at once, naming the holder, and leaves it alone.
func TestConvertRefusedWhileDirectoryLocked(t *testing.T) {
	src := tinyModel(t)
	out := filepath.Join(t.TempDir(), "out")
	lk, err := fslock.Acquire(out)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release()
	t0 := time.Now()
	code, _, errs := runCLI(t, "convert", "--model", src, "--out", out, "--quiet")
	if d := time.Since(t0); d > time.Second {
		t.Errorf("refusal took %v", d)
	}
	if code != exitError || !strings.Contains(errs, fmt.Sprintf("pid %d (", os.Getpid())) {
		t.Fatalf("convert into a locked directory: status %d, stderr %q; want status 1 naming pid %d", code, errs, os.Getpid())
	}
	ents, _ := os.ReadDir(out)
	if len(ents) != 1 || ents[0].Name() != fslock.Name {
		t.Errorf("the refused run touched the directory: %v", ents)
	}
}
