package testmodel

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/internal/atomicfile"
)

// Variant selects the layout of a generated tiny checkpoint.
type Variant int

// Checkpoint variants.
const (
	// Default: fused experts, three shards and model.safetensors.index.json.
	Default Variant = iota
	// PerExpert: like Default with 2-D per-expert expert tensors.
	PerExpert
	// SingleFile: fused experts in one model.safetensors, no index.
	SingleFile
	// FP8: like Default with layer 0's in_proj_qkv stored as F8_E4M3 plus a
	// weight_scale_inv companion and a quantization_config in config.json.
	FP8
)

var variantNames = []string{"default", "per-expert", "single-file", "fp8"}

// Variants lists the variants Write accepts.
func Variants() []Variant { return []Variant{Default, PerExpert, SingleFile, FP8} }

func (v Variant) String() string {
	if v >= 0 && int(v) < len(variantNames) {
		return variantNames[v]
	}
	return "Variant(" + strconv.Itoa(int(v)) + ")"
}

// ParseVariant parses a variant name as printed by String.
func ParseVariant(s string) (Variant, error) {
	for i, n := range variantNames {
		if s == n {
			return Variant(i), nil
		}
	}
	return 0, fmt.Errorf("testmodel: unknown variant %q (want one of %s)", s, strings.Join(variantNames, ", "))
}

// IndexFile is the name of the shard index of a sharded checkpoint.
const IndexFile = "model.safetensors.index.json"

// SingleFileName is the file name of an unsharded checkpoint.
const SingleFileName = "model.safetensors"

// ShardName returns the Hugging Face shard file name
// model-{i:05d}-of-{n:05d}.safetensors for 1-based i.
func ShardName(i, n int) string {
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i, n)
}

// shardStyle controls how one shard's header is laid out.
type shardStyle struct {
	alphabetical bool // JSON keys in name order instead of data order
	leadingPad   int  // spaces before the opening brace
}

type shard struct {
	name   string
	style  shardStyle
	specs  []TensorSpec
	sparse bool
}

// Write generates the checkpoint described by cfg in the given variant into
// dir (created if needed): the safetensors file(s), the shard index when
// sharded, and config.json. Existing files of the same names are replaced
// (each file is written under a temporary name and renamed into place).
// The output is byte-identical on every platform.
func Write(dir string, cfg Config, v Variant) error {
	layout := ExpertsFused
	if v == PerExpert {
		layout = ExpertsPerExpert
	}
	if v < Default || v > FP8 {
		return fmt.Errorf("testmodel: unknown variant %d", int(v))
	}
	specs, err := Specs(cfg, layout, v == FP8)
	if err != nil {
		return err
	}
	var shards []shard
	if v == SingleFile {
		shards = []shard{{name: SingleFileName, specs: specs}}
	} else {
		shards = tinyShards(cfg, specs)
	}
	return writeCheckpoint(dir, cfg, shards, v == FP8)
}

// tinyShards splits specs into three shards: the embedding and the first
// half of the layers; the second half, the final norm and lm_head; MTP and
// vision. Shard 2 gets alphabetical JSON keys and a 4-space leading pad.
func tinyShards(cfg Config, specs []TensorSpec) []shard {
	s := []shard{
		{name: ShardName(1, 3)},
		{name: ShardName(2, 3), style: shardStyle{alphabetical: true, leadingPad: 4}},
		{name: ShardName(3, 3)},
	}
	half := (cfg.Layers + 1) / 2
	for _, t := range specs {
		i := 0
		switch {
		case t.MTP || strings.HasPrefix(t.Name, "model.visual."):
			i = 2
		case t.Layer >= half, t.Name == "lm_head.weight", t.Name == cfg.Prefix()+"norm.weight":
			i = 1
		}
		s[i].specs = append(s[i].specs, t)
	}
	return s
}

// MaxShardBytes is the shard size limit used for the 35B replica, the
// Hugging Face default of 5 GB: tensors are packed in logical order and a
// new shard starts when the next tensor would exceed it.
const MaxShardBytes = 5_000_000_000

// WriteReplica35B writes a shape replica of the Qwen3.6-35B-A3B text model
// into dir: the 712 tensors of Qwen36_35B with their real names, shapes and
// dtypes, packed into 5 GB shards with an index and config.json. The data
// sections are holes (sparse files): headers are exact, every data byte
// reads as zero, and almost no disk space is used.
func WriteReplica35B(dir string) error {
	return WriteSparse(dir, Qwen36_35B(), ExpertsFused)
}

// WriteReplica27B writes a shape replica of a Qwen3.5-27B-shaped dense
// text model (Qwen35_27B) into dir, as WriteReplica35B does for the MoE
// model: exact headers, sparse data.
func WriteReplica27B(dir string) error {
	return WriteSparse(dir, Qwen35_27B(), ExpertsFused)
}

// WriteSparse writes the checkpoint described by cfg as sparse shards of at
// most MaxShardBytes (see WriteReplica35B).
func WriteSparse(dir string, cfg Config, layout ExpertLayout) error {
	specs, err := Specs(cfg, layout, false)
	if err != nil {
		return err
	}
	var groups [][]TensorSpec
	var size int64
	for _, t := range specs {
		if len(groups) == 0 || (size > 0 && size+t.Size() > MaxShardBytes) {
			groups = append(groups, nil)
			size = 0
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], t)
		size += t.Size()
	}
	shards := make([]shard, len(groups))
	for i, g := range groups {
		shards[i] = shard{name: ShardName(i+1, len(groups)), specs: g, sparse: true}
	}
	return writeCheckpoint(dir, cfg, shards, false)
}

func writeCheckpoint(dir string, cfg Config, shards []shard, fp8 bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	g := &generator{cfg: cfg}
	weightMap := map[string]string{}
	var total int64
	for _, s := range shards {
		if err := writeShard(filepath.Join(dir, s.name), s, g); err != nil {
			return err
		}
		for _, t := range s.specs {
			weightMap[t.Name] = s.name
			total += t.Size()
		}
	}
	if len(shards) > 1 {
		idx := struct {
			Metadata  map[string]int64  `json:"metadata"`
			WeightMap map[string]string `json:"weight_map"`
		}{map[string]int64{"total_size": total}, weightMap}
		b, err := json.MarshalIndent(idx, "", "  ")
		if err != nil {
			return fmt.Errorf("testmodel: encoding index: %w", err)
		}
		if err := writeAtomic(filepath.Join(dir, IndexFile), append(b, '\n')); err != nil {
			return err
		}
	}
	cj, err := cfg.ConfigJSON(fp8)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, "config.json"), cj)
}

func writeAtomic(path string, data []byte) error {
	if _, err := atomicfile.WriteFile(path, data); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	return nil
}

// dataOrder sorts tensors as the reference writer does: by dtype size
// (alignment) descending, then by name.
func dataOrder(specs []TensorSpec) []TensorSpec {
	out := append([]TensorSpec(nil), specs...)
	sort.SliceStable(out, func(i, j int) bool {
		ai, aj := dtypeBytes(out[i].DType), dtypeBytes(out[j].DType)
		if ai != aj {
			return ai > aj
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// header builds the JSON header of a shard, padded with spaces so that the
// data section starts at a multiple of 8, and returns it with the tensors
// in data order.
func header(s shard) ([]byte, []TensorSpec, error) {
	order := dataOrder(s.specs)
	type entry struct {
		t          TensorSpec
		begin, end int64
	}
	entries := make([]entry, len(order))
	var off int64
	for i, t := range order {
		entries[i] = entry{t, off, off + t.Size()}
		off += t.Size()
	}
	keys := append([]entry(nil), entries...)
	if s.style.alphabetical {
		sort.Slice(keys, func(i, j int) bool { return keys[i].t.Name < keys[j].t.Name })
	}
	var b bytes.Buffer
	b.WriteString(strings.Repeat(" ", s.style.leadingPad))
	b.WriteString(`{"__metadata__":{"format":"pt"}`)
	for _, e := range keys {
		name, err := json.Marshal(e.t.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("testmodel: tensor name %q: %w", e.t.Name, err)
		}
		b.WriteByte(',')
		b.Write(name)
		b.WriteString(`:{"dtype":"`)
		b.WriteString(e.t.DType)
		b.WriteString(`","shape":[`)
		for i, d := range e.t.Shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		b.WriteString(`],"data_offsets":[`)
		b.WriteString(strconv.FormatInt(e.begin, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(e.end, 10))
		b.WriteString("]}")
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes(), order, nil
}

func writeShard(path string, s shard, g *generator) (err error) {
	hdr, order, err := header(s)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	var prefix [8]byte
	binary.LittleEndian.PutUint64(prefix[:], uint64(len(hdr)))
	w.Write(prefix[:])
	w.Write(hdr)
	var dataSize int64
	for _, t := range order {
		dataSize += t.Size()
		if s.sparse {
			continue
		}
		b := g.bytes(t)
		if int64(len(b)) != t.Size() {
			return fmt.Errorf("testmodel: %s: generated %d bytes, want %d", t.Name, len(b), t.Size())
		}
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("testmodel: writing %s: %w", path, err)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("testmodel: writing %s: %w", path, err)
	}
	if s.sparse {
		// Extend the file to its full length without writing: the data
		// section becomes a hole.
		if err := f.Truncate(8 + int64(len(hdr)) + dataSize); err != nil {
			return fmt.Errorf("testmodel: extending %s: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("testmodel: closing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("testmodel: %w", errors.Join(err, os.Remove(tmp)))
	}
	return nil
}
