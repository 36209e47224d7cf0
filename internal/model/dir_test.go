package model

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDir: a model named by its directory or by one of its files has the
// same directory and config.json.
func TestDir(t *testing.T) {
	d := t.TempDir()
	shard := filepath.Join(d, "model.safetensors")
	if err := os.WriteFile(shard, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{d, shard} {
		if got := Dir(src); got != d {
			t.Errorf("Dir(%s) = %s, want %s", src, got, d)
		}
		if got, want := ConfigPath(src), filepath.Join(d, "config.json"); got != want {
			t.Errorf("ConfigPath(%s) = %s, want %s", src, got, want)
		}
	}
	// A path that does not exist is taken as a directory.
	if got := Dir(filepath.Join(d, "missing")); got != filepath.Join(d, "missing") {
		t.Errorf("Dir of a missing path = %s", got)
	}
}
