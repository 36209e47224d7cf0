package calib

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/safetensors"
)

// TestStoreCheckFindsBadShards: every shard fault is found by OpenStore or
// Check, before any row is read, with an error naming the shard.
func TestStoreCheckFindsBadShards(t *testing.T) {
	good := t.TempDir()
	writeTestStore(t, good, StoreOptions{ShardBytes: 8 * 24})
	if s, err := OpenStore(good); err != nil {
		t.Fatal(err)
	} else if err := s.Check(context.Background(), true); err != nil {
		t.Fatalf("a good store fails the deep check: %v", err)
	}
	const victim = "layer001.mlp.00001.safetensors"
	copyStore := func() string {
		d := t.TempDir()
		ents, _ := os.ReadDir(good)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(good, e.Name()))
			os.WriteFile(filepath.Join(d, e.Name()), b, 0o644)
		}
		return d
	}
	rewrite := func(d string, rows, cols int64) {
		p := filepath.Join(d, victim)
		f, err := safetensors.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		md := f.Metadata()
		f.Close()
		data := make([]byte, rows*cols*2)
		if err := safetensors.WriteFile(p, []safetensors.Tensor{{Name: "activations", DType: safetensors.BF16, Shape: []int64{rows, cols}, Data: data}}, md); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name  string
		edit  func(d string)
		deep  bool
		wants []string
	}{
		{"missing", func(d string) { os.Remove(filepath.Join(d, victim)) }, false, []string{victim, "no such file"}},
		{"truncated", func(d string) {
			p := filepath.Join(d, victim)
			raw, _ := os.ReadFile(p)
			os.WriteFile(p, raw[:len(raw)-2], 0o644)
		}, false, []string{victim}},
		{"mis-shaped", func(d string) { rewrite(d, 8, 13) }, false, []string{victim, "want BF16 [8, 12]"}},
		{"fewer rows", func(d string) { rewrite(d, 7, 12) }, false, []string{victim, "[7 12]"}},
		{"directory", func(d string) {
			os.Remove(filepath.Join(d, victim))
			os.Mkdir(filepath.Join(d, victim), 0o755)
		}, false, []string{victim, "not a regular file"}},
		{"non-finite", func(d string) {
			p := filepath.Join(d, victim)
			raw, _ := os.ReadFile(p)
			// The last value of the last row: a BF16 NaN.
			raw[len(raw)-2], raw[len(raw)-1] = 0xc0, 0x7f
			os.WriteFile(p, raw, 0o644)
		}, true, []string{"layer 1 site mlp", "token 15 feature 11", "NaN"}},
	}
	for _, c := range cases {
		d := copyStore()
		c.edit(d)
		s, err := OpenStore(d)
		if err == nil {
			err = s.Check(context.Background(), c.deep)
		}
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		for _, w := range c.wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.name, err, w)
			}
		}
	}
}

// TestStoreRefusesEscapingShardName: a shard name leading out of the store
// is refused by OpenStore with an error that says so.
func TestStoreRefusesEscapingShardName(t *testing.T) {
	for _, name := range []string{"../outside.safetensors", "sub/x.safetensors", "..", "/abs.safetensors"} {
		d := t.TempDir()
		writeTestStore(t, d, StoreOptions{})
		p := filepath.Join(d, StoreIndexName)
		raw, _ := os.ReadFile(p)
		var m map[string]any
		json.Unmarshal(raw, &m)
		m["sites"].([]any)[0].(map[string]any)["shards"].([]any)[0].(map[string]any)["file"] = name
		raw, _ = json.Marshal(m)
		os.WriteFile(p, raw, 0o644)
		_, err := OpenStore(d)
		if err == nil || !strings.Contains(err.Error(), "not a plain file name") || !strings.Contains(err.Error(), name) {
			t.Errorf("shard %q: %v", name, err)
		}
	}
}
