package calib

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpenStoreIndex feeds arbitrary index files, next to valid shards, to
// OpenStore and reads every site the index then claims: errors are fine,
// panics and reads outside a shard are not.
func FuzzOpenStoreIndex(f *testing.F) {
	good := f.TempDir()
	writeTestStore(f, good, StoreOptions{ShardBytes: 8 * 24})
	raw, err := os.ReadFile(filepath.Join(good, StoreIndexName))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"format":"ttquant-calibration","format_version":1,"provenance":{"sequences":1,"tokens":1},"sequence_lengths":[1],"sites":[{"layer":0,"site":"mlp","cols":1,"tokens":1,"dtype":"BF16","shards":[{"file":"../x","first_token":0,"tokens":1}]}]}`))
	f.Add([]byte(`{"format":"ttquant-calibration","format_version":1,"provenance":{"sequences":1,"tokens":2},"sequence_lengths":[2],"sites":[{"layer":1,"site":"mlp","cols":12,"tokens":2,"dtype":"F32","shards":[{"file":"layer001.mlp.00000.safetensors","first_token":0,"tokens":2}]}]}`))
	ents, _ := os.ReadDir(good)
	f.Fuzz(func(t *testing.T, index []byte) {
		dir := t.TempDir()
		for _, e := range ents {
			if e.Name() == StoreIndexName {
				continue
			}
			if err := os.Symlink(filepath.Join(good, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				t.Skip("no symlinks:", err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, StoreIndexName), index, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := OpenStore(dir)
		if err != nil {
			if bytes.Equal(index, raw) {
				t.Fatalf("the valid index is rejected: %v", err)
			}
			return
		}
		for _, si := range s.Sites() {
			for _, sh := range si.Shards {
				if filepath.Base(sh.File) != sh.File || sh.File == ".." {
					t.Fatalf("accepted shard file name %q outside the store directory", sh.File)
				}
			}
			if si.Tokens*int64(si.Cols) > 1<<20 {
				continue
			}
			x, err := s.ReadRows(si.Layer, si.Site, 0, si.Tokens)
			if err == nil && int64(len(x)) != si.Tokens*int64(si.Cols) {
				t.Fatalf("layer %d site %s: %d values read for %d tokens × %d cols", si.Layer, si.Site, len(x), si.Tokens, si.Cols)
			}
		}
		s.TokenIDs()
	})
}
