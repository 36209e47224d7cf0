package manifest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func readManifestBytes(t *testing.T, dir string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRerunKeepsManifestBytes: a build run twice into one directory and
// once into a fresh one gives three byte-identical manifests, for convert
// and for GPTQ from a calibration store (whose per-layer sums used to
// drift in the last digits on the rerun).
func TestRerunKeepsManifestBytes(t *testing.T) {
	for _, kind := range []string{"convert", "gptq1"} {
		first := filepath.Join(t.TempDir(), "ckpt")
		copyTree(t, reference(t, kind), first)
		want := readManifestBytes(t, first)
		fresh := filepath.Join(t.TempDir(), "fresh")
		for _, dir := range []string{first, fresh} {
			var err error
			if kind == "convert" {
				_, err = Convert(context.Background(), convertOpts(t, dir, 2))
			} else {
				_, err = GPTQ(context.Background(), gptq1Opts(t, dir, 2))
			}
			if err != nil {
				t.Fatalf("%s into %s: %v", kind, dir, err)
			}
			if got := readManifestBytes(t, dir); !bytes.Equal(got, want) {
				t.Errorf("%s: the manifest in %s differs from the first build's:\n%s", kind, filepath.Base(dir), firstDiff(want, got))
			}
		}
	}
}

// firstDiff shows the first differing line of two manifests after the
// integrity field (which differs whenever anything does).
func firstDiff(a, b []byte) string {
	al, bl := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := 0; i < len(al) && i < len(bl); i++ {
		if !bytes.Equal(al[i], bl[i]) && !bytes.Contains(al[i], []byte(integrityKey)) {
			return "line " + strconv.Itoa(i+1) + ":\n  " + string(al[i]) + "\n  " + string(bl[i])
		}
	}
	return "only the integrity field, or the lengths, differ"
}
