// Package testdata locates the shared conformance data that the tests read in
// place. The data live beside the repository, in ../shared/testdata; they are
// never copied into the repository.
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

// SharedDir returns the shared conformance data directory
// (<repo>/../shared/testdata) joined with elem. The environment variable
// TTQUANT_SHARED, when set, names the shared directory instead of
// <repo>/../shared.
//
// When the directory does not exist the test is skipped, except under CI
// (CI set to a non-empty value), where a missing directory fails the test so
// that conformance can never pass vacuously.
func SharedDir(tb testing.TB, elem ...string) string {
	tb.Helper()
	base := os.Getenv("TTQUANT_SHARED")
	if base == "" {
		base = filepath.Join(RepoRoot(), "..", "shared")
	}
	dir := filepath.Join(append([]string{base, "testdata"}, elem...)...)
	if _, err := os.Stat(dir); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("shared conformance data missing: %v", err)
		}
		tb.Skipf("shared conformance data not present: %v", err)
	}
	return dir
}
