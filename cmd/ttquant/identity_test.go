package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/model/builtin"
	"github.com/ttquant/ttquant/manifest"
)

// readManifest returns a checkpoint's manifest bytes.
func readManifest(t *testing.T, dir string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, manifest.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// firstLineDiff names the first line where two manifests differ.
func firstLineDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] && !strings.Contains(al[i], `"integrity"`) {
			return al[i] + "  vs  " + bl[i]
		}
	}
	return "lengths differ"
}

// TestIdentityFromContent: the same sequential GPTQ build with the
// calibration file named by a relative, an absolute and a symlinked path,
// from two working directories, and the demo into two directories, give
// byte-identical manifests (and so one identity): the manifest records
// what the text is, not where it was read from.
func TestIdentityFromContent(t *testing.T) {
	root, model := builtinModel(t)
	calib := filepath.Join(model, builtin.CalibText)
	for _, d := range []string{"w1", "w2/deeper", "links"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(calib, filepath.Join(root, "links", "texts.jsonl")); err != nil {
		t.Fatal(err)
	}
	runs := []struct{ cwd, model, data string }{
		{"w1", "../model", "calib=../model/" + builtin.CalibText},
		{"w2/deeper", model, "calib=" + calib},
		{"w2/deeper", "../../model", "calib=../../links/texts.jsonl"},
		{"links", model, "calib=texts.jsonl"},
	}
	var want []byte
	for i, r := range runs {
		t.Chdir(filepath.Join(root, r.cwd))
		out := filepath.Join(root, "out"+string(rune('a'+i)))
		code, so, se := runCLI(t, "gptq", "--model", r.model, "--data", r.data, "--layers", "experts", "--sequences", "6", "--seq-len", "64",
			"--held-out", "2", "--quiet", "--workers", "2", "--out", out)
		if code != exitOK {
			t.Fatalf("gptq from %s with %s: status %d\n%s\n%s", r.cwd, r.data, code, so, se)
		}
		got := readManifest(t, out)
		if bytes.Contains(got, []byte(root)) || bytes.Contains(got, []byte(builtin.CalibText)) || bytes.Contains(got, []byte("texts.jsonl")) {
			t.Errorf("run %d: the manifest records a path", i)
		}
		if want == nil {
			want = got
		} else if !bytes.Equal(got, want) {
			t.Errorf("gptq from %s with --data %s: the manifest differs from the first run's: %s", r.cwd, r.data, firstLineDiff(want, got))
		}
	}

	// The demo into two directories, one named relatively.
	t.Chdir(root)
	demo := []string{"--json", "--quiet", "--workers", "2", "--sequences", "6", "--seq-len", "64", "--held-out", "2", "--eval-sequences", "2", "--eval-seq-len", "32"}
	if code, so, se := runCLI(t, append([]string{"demo", "--out", "d1"}, demo...)...); code != exitOK {
		t.Fatalf("demo --out d1: status %d\n%s\n%s", code, so, se)
	}
	if code, so, se := runCLI(t, append([]string{"demo", "--out", filepath.Join(root, "w2", "d2")}, demo...)...); code != exitOK {
		t.Fatalf("demo --out d2: status %d\n%s\n%s", code, so, se)
	}
	for _, c := range []string{"gptq", "rtn"} {
		a, b := readManifest(t, filepath.Join(root, "d1", c)), readManifest(t, filepath.Join(root, "w2", "d2", c))
		if !bytes.Equal(a, b) {
			t.Errorf("demo %s: the manifests in d1 and d2 differ: %s", c, firstLineDiff(a, b))
		}
	}
}
