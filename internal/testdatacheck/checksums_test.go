// Package testdatacheck holds the checksum test of the conformance data. It
// lives outside internal/testdata because the go command skips directories
// named testdata in package patterns such as ./..., so a test there never runs.
package testdatacheck

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// TestChecksums checks every file of the conformance data against
// testdata/SHA256SUMS, and that no file is present that the list does not
// name (apart from the list itself, the folder's own README and the per-folder
// SHA256SUMS files that came with the data).
func TestChecksums(t *testing.T) {
	root := testdata.Dir(t)
	f, err := os.Open(filepath.Join(root, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS: malformed line %q", sc.Text())
		}
		want[filepath.FromSlash(strings.TrimPrefix(name, "./"))] = sum
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) < 700 {
		t.Fatalf("SHA256SUMS lists %d files; expected the whole conformance set", len(want))
	}
	seen := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel == "SHA256SUMS" || rel == "README.md" || filepath.Base(rel) == "SHA256SUMS" {
			return nil
		}
		sum, ok := want[rel]
		if !ok {
			t.Errorf("%s: not listed in SHA256SUMS", rel)
			return nil
		}
		g, err := os.Open(path)
		if err != nil {
			return err
		}
		defer g.Close()
		h := sha256.New()
		if _, err := io.Copy(h, g); err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != sum {
			t.Errorf("%s: sha256 %s, SHA256SUMS says %s", rel, got, sum)
		}
		seen++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != len(want) {
		t.Errorf("checked %d files, SHA256SUMS lists %d", seen, len(want))
	}
}
