package calib

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/safetensors"
)

// TestStoreErrorKinds: a damaged store fails with a *StoreError of the
// kind that names the damage, with the file, layer and site filled in,
// and errors.Is still reaches the underlying cause.
func TestStoreErrorKinds(t *testing.T) {
	fresh := func() string {
		d := t.TempDir()
		writeTestStore(t, d, StoreOptions{})
		return d
	}
	shardOf := func(d string, layer int, site string) string {
		s, err := OpenStore(d)
		if err != nil {
			t.Fatal(err)
		}
		si, _ := s.Site(layer, site)
		return filepath.Join(d, si.Shards[0].File)
	}

	// The index.
	d := fresh()
	idx := filepath.Join(d, StoreIndexName)
	raw, _ := os.ReadFile(idx)
	var m map[string]any
	json.Unmarshal(raw, &m)
	m["format_version"] = 9
	raw, _ = json.Marshal(m)
	os.WriteFile(idx, raw, 0o644)
	_, err := OpenStore(d)
	var se *StoreError
	if !errors.Is(err, ErrStoreIndex) || !errors.As(err, &se) || se.Path != idx || se.Site != "" {
		t.Errorf("index of version 9: %v, want an ErrStoreIndex naming %s", err, idx)
	}
	if _, err := OpenStore(t.TempDir()); !errors.Is(err, ErrStoreIndex) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no index: %v, want ErrStoreIndex wrapping fs.ErrNotExist", err)
	}

	// A missing shard, and a truncated one.
	d = fresh()
	victim := shardOf(d, 1, SiteMoE)
	os.Remove(victim)
	s, err := OpenStore(d)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Check(context.Background(), false)
	if !errors.Is(err, ErrStoreShard) || !errors.Is(err, fs.ErrNotExist) || !errors.As(err, &se) ||
		se.Path != victim || se.Layer != 1 || se.Site != SiteMoE {
		t.Errorf("missing shard: %v (%+v), want ErrStoreShard for layer 1 site %s, %s", err, se, SiteMoE, victim)
	}
	d = fresh()
	victim = shardOf(d, 0, SiteOProj)
	raw, _ = os.ReadFile(victim)
	os.WriteFile(victim, raw[:len(raw)-2], 0o644)
	s, _ = OpenStore(d)
	_, err = s.ReadRows(0, SiteOProj, 0, 20)
	if !errors.Is(err, ErrStoreShard) || !errors.Is(err, safetensors.ErrMetadataIncompleteBuffer) || !errors.As(err, &se) || se.Layer != 0 || se.Site != SiteOProj {
		t.Errorf("truncated shard: %v, want ErrStoreShard wrapping the safetensors kind", err)
	}

	// A request outside the store.
	d = fresh()
	s, _ = OpenStore(d)
	if _, err := s.ReadRows(7, SiteMoE, 0, 1); !errors.Is(err, ErrNoSite) || !errors.As(err, &se) || se.Layer != 7 {
		t.Errorf("site the store lacks: %v, want ErrNoSite for layer 7", err)
	}
	if _, err := s.ReadRows(1, SiteMoE, 15, 6); !errors.Is(err, ErrNoSite) {
		t.Errorf("rows past the site: %v, want ErrNoSite", err)
	}
}
