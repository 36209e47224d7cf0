package manifest

import (
	"fmt"
	"sort"
)

// Layout defaults.
const (
	// DefaultExpertsPerFile is the number of routed experts stored per
	// grouped expert file.
	DefaultExpertsPerFile = 16
	// DefaultDenseShardBytes is the target size of a dense shard file.
	DefaultDenseShardBytes int64 = 4 << 30
)

// expertFileName is the name of a grouped expert file.
func expertFileName(layer int, kind string, group int) string {
	return fmt.Sprintf("experts-l%03d-%s-g%03d.safetensors", layer, kind, group)
}

// LayoutItem is one stored tensor as the file layout sees it.
type LayoutItem struct {
	Name string
	// Layer is the tensor's layer index (MTP layers after the trunk's),
	// -1 outside layers.
	Layer int
	// Expert is the routed expert index, -1 for every other tensor.
	Expert int
	// Kind is "gate_up" or "down" for a routed expert tensor.
	Kind string
	// Bytes is the stored size.
	Bytes int64
}

// LayoutFile is one data file of a native checkpoint and the tensors it
// holds.
type LayoutFile struct {
	Name  string
	Role  string // FileExperts or FileDense
	Layer int    // -1 for dense shards
	Kind  string // "gate_up" or "down" for expert files
	Group int    // expert group, or the dense shard's 0-based index
	// Items are indices into the slice given to Layout: for an expert
	// file by expert then name, for a dense shard by name.
	Items []int
	Bytes int64
}

// Layout assigns every stored tensor to a file; it is the one function both
// the plan preview and the build use. Routed expert tensors in a layer go
// to grouped expert files (experts e with e/perFile == g of one layer and
// one kind); every other tensor fills dense shards in name order, a new
// shard being started when the next tensor would push a non-empty shard
// past shardBytes. The result is sorted by file name and does not depend on
// the order of items.
func Layout(items []LayoutItem, perFile int, shardBytes int64) ([]LayoutFile, error) {
	if perFile <= 0 {
		return nil, fmt.Errorf("manifest: experts per file must be positive, got %d", perFile)
	}
	if shardBytes <= 0 {
		return nil, fmt.Errorf("manifest: dense shard size must be positive, got %d", shardBytes)
	}
	groups := map[string]*LayoutFile{}
	var dense []int
	for i, it := range items {
		if it.Expert < 0 || it.Layer < 0 {
			dense = append(dense, i)
			continue
		}
		if it.Kind != "gate_up" && it.Kind != "down" {
			return nil, fmt.Errorf("manifest: expert tensor %s has kind %q, want gate_up or down", it.Name, it.Kind)
		}
		g := it.Expert / perFile
		name := expertFileName(it.Layer, it.Kind, g)
		f := groups[name]
		if f == nil {
			f = &LayoutFile{Name: name, Role: FileExperts, Layer: it.Layer, Kind: it.Kind, Group: g}
			groups[name] = f
		}
		f.Items = append(f.Items, i)
		f.Bytes += it.Bytes
	}
	var files []LayoutFile
	for _, f := range groups {
		sort.Slice(f.Items, func(a, b int) bool {
			x, y := items[f.Items[a]], items[f.Items[b]]
			if x.Expert != y.Expert {
				return x.Expert < y.Expert
			}
			return x.Name < y.Name
		})
		files = append(files, *f)
	}
	sort.Slice(dense, func(a, b int) bool { return items[dense[a]].Name < items[dense[b]].Name })
	var shards [][]int
	var cur []int
	var curBytes int64
	for _, i := range dense {
		if len(cur) > 0 && curBytes+items[i].Bytes > shardBytes {
			shards = append(shards, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, i)
		curBytes += items[i].Bytes
	}
	if len(cur) > 0 {
		shards = append(shards, cur)
	}
	for k, s := range shards {
		f := LayoutFile{Name: fmt.Sprintf("dense-%05d-of-%05d.safetensors", k+1, len(shards)), Role: FileDense, Layer: -1, Group: k, Items: s}
		for _, i := range s {
			f.Bytes += items[i].Bytes
		}
		files = append(files, f)
	}
	sort.Slice(files, func(a, b int) bool { return files[a].Name < files[b].Name })
	return files, nil
}
