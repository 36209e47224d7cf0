// Package testdata locates the conformance data that the tests read. The data
// live in the repository's top-level testdata/ folder, copied unchanged from
// their reference sources (each subfolder's README says which); a fresh clone
// of the repository therefore runs every conformance test.
package testdata

import (
	"os"
	"path/filepath"
	"testing"
)

// RepoRoot returns the directory holding go.mod, found by walking up from the
// working directory. It panics if there is none, which can only happen when a
// test is run outside the module.
func RepoRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		panic("testdata: " + err.Error())
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			panic("testdata: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Dir returns <repo>/testdata joined with elem. The conformance data are part
// of the repository, so a missing directory fails the test: conformance can
// never pass vacuously.
func Dir(tb testing.TB, elem ...string) string {
	tb.Helper()
	dir := filepath.Join(append([]string{RepoRoot(), "testdata"}, elem...)...)
	if _, err := os.Stat(dir); err != nil {
		tb.Fatalf("conformance data missing: %v", err)
	}
	return dir
}
