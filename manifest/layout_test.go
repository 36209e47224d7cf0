package manifest

import (
	"reflect"
	"testing"
)

// TestLayoutGroupsAndShards checks the file assignment both the plan
// preview and the build use: expert tensors by layer, kind and group;
// everything else in name order into shards closed before they overflow,
// a zero-byte tensor included (the preview once counted it differently).
func TestLayoutGroupsAndShards(t *testing.T) {
	items := []LayoutItem{
		{Name: "b", Layer: -1, Expert: -1, Bytes: 60},
		{Name: "a", Layer: -1, Expert: -1, Bytes: 0},
		{Name: "c", Layer: 0, Expert: -1, Bytes: 50},
		{Name: "x.5.down", Layer: 1, Expert: 5, Kind: "down", Bytes: 8},
		{Name: "x.1.down", Layer: 1, Expert: 1, Kind: "down", Bytes: 8},
		{Name: "x.2.gu", Layer: 1, Expert: 2, Kind: "gate_up", Bytes: 16},
	}
	files, err := Layout(items, 4, 100)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		name  string
		items []int
		bytes int64
	}
	var have []got
	for _, f := range files {
		have = append(have, got{f.Name, f.Items, f.Bytes})
	}
	want := []got{
		{"dense-00001-of-00002.safetensors", []int{1, 0}, 60},
		{"dense-00002-of-00002.safetensors", []int{2}, 50},
		{"experts-l001-down-g000.safetensors", []int{4}, 8},
		{"experts-l001-down-g001.safetensors", []int{3}, 8},
		{"experts-l001-gate_up-g000.safetensors", []int{5}, 16},
	}
	if !reflect.DeepEqual(have, want) {
		t.Errorf("layout\n got %v\nwant %v", have, want)
	}
	// A zero-byte shard start does not keep an oversized tensor in it.
	files, err = Layout([]LayoutItem{{Name: "a", Layer: -1, Expert: -1}, {Name: "b", Layer: -1, Expert: -1, Bytes: 150}}, 4, 100)
	if err != nil || len(files) != 2 {
		t.Errorf("zero-byte then oversized tensor: %d files (%v), want 2", len(files), err)
	}
	for _, bad := range []struct {
		per   int
		shard int64
	}{{0, 100}, {4, 0}, {-1, 100}} {
		if _, err := Layout(items, bad.per, bad.shard); err == nil {
			t.Errorf("Layout(per file %d, shard %d) accepted", bad.per, bad.shard)
		}
	}
	if _, err := Layout([]LayoutItem{{Name: "e", Layer: 0, Expert: 0, Kind: "gate"}}, 4, 100); err == nil {
		t.Error("an expert tensor of kind gate was accepted")
	}
}
