package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// IndexFileName is the conventional name of a sharded checkpoint's index.
const IndexFileName = "model.safetensors.index.json"

// Index is the content of a sharded checkpoint's index file
// (model.safetensors.index.json): which shard holds each tensor.
type Index struct {
	// Metadata is the index's "metadata" object (usually {"total_size": N},
	// the sum of the tensors' byte sizes). Numbers are json.Number.
	Metadata map[string]any
	// WeightMap maps each tensor name to the shard file holding it, relative
	// to the index's directory.
	WeightMap map[string]string
}

// TotalSize returns metadata.total_size when it is a non-negative integer.
func (x *Index) TotalSize() (int64, bool) {
	switch v := x.Metadata["total_size"].(type) {
	case json.Number:
		n, err := strconv.ParseInt(string(v), 10, 64)
		return n, err == nil && n >= 0
	case int64:
		return v, v >= 0
	case int:
		return int64(v), v >= 0
	}
	return 0, false
}

// Shards returns the distinct shard file names of the weight map, sorted.
func (x *Index) Shards() []string {
	set := map[string]bool{}
	for _, s := range x.WeightMap {
		set[s] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// ReadIndex reads and checks an index file. The JSON must be strict (no
// duplicate keys anywhere: a tensor listed twice in weight_map is an error
// naming it); weight_map is required and maps names to shard file names
// that stay inside the index's directory.
func ReadIndex(path string) (*Index, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	bad := func(format string, args ...any) error {
		return &Error{Path: path, Kind: ErrInvalidIndex, Detail: fmt.Sprintf(format, args...)}
	}
	if !utf8.Valid(data) {
		return nil, bad("not valid UTF-8")
	}
	p := parser{b: data}
	p.ws()
	v, err := p.value()
	if err == nil {
		p.ws()
		if p.i != len(p.b) {
			err = p.errf("trailing characters after the index object")
		}
	}
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return nil, bad("%s", e.Detail)
		}
		return nil, bad("%v", err)
	}
	top, ok := v.(map[string]any)
	if !ok {
		return nil, bad("the index must be a JSON object")
	}
	x := &Index{WeightMap: map[string]string{}}
	if m, ok := top["metadata"]; ok && m != nil {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil, bad("metadata must be an object")
		}
		x.Metadata = mm
	}
	wm, ok := top["weight_map"].(map[string]any)
	if !ok {
		return nil, bad("weight_map is missing or not an object")
	}
	for name, s := range wm {
		shard, ok := s.(string)
		if !ok {
			return nil, bad("weight_map entry for tensor %q is not a string", name)
		}
		if !filepath.IsLocal(shard) || strings.ContainsRune(shard, '\\') {
			return nil, bad("tensor %q: shard name %q is not a file name inside the checkpoint directory", name, shard)
		}
		x.WeightMap[name] = shard
	}
	return x, nil
}

// WriteIndex writes x as indented JSON with sorted keys (deterministic),
// through a temporary file renamed into place.
func WriteIndex(path string, x *Index) error {
	doc := struct {
		Metadata  map[string]any    `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}{x.Metadata, x.WeightMap}
	if doc.Metadata == nil {
		doc.Metadata = map[string]any{}
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	data = append(data, '\n')
	tmp, err := createTemp(path)
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("safetensors: writing index %s: %w", path, err)
	}
	return nil
}

// BuildIndex opens the given shards (file names relative to dir) and
// returns the index describing them, with metadata.total_size set to the
// sum of the tensors' byte sizes. A tensor in two shards is an error.
func BuildIndex(dir string, shards []string) (*Index, error) {
	x := &Index{WeightMap: map[string]string{}}
	var total int64
	for _, s := range shards {
		f, err := Open(filepath.Join(dir, s))
		if err != nil {
			return nil, err
		}
		for _, t := range f.h.tensors {
			if prev, dup := x.WeightMap[t.Name]; dup {
				f.Close()
				return nil, &Error{Path: filepath.Join(dir, s), Tensor: t.Name, hasT: true, Kind: ErrDuplicateTensor, Detail: "also in shard " + prev}
			}
			x.WeightMap[t.Name] = s
			total += t.Size()
		}
		f.Close()
	}
	x.Metadata = map[string]any{"total_size": json.Number(strconv.FormatInt(total, 10))}
	return x, nil
}

// Model is a checkpoint made of one or more safetensors files: a single
// file, a directory of shards, or a sharded checkpoint described by an
// index. Tensor names are unique across the model.
type Model struct {
	path     string
	files    []*File
	where    map[string]int // tensor name -> index in files
	names    []string
	index    *Index
	warnings []string
}

// OpenModel opens a checkpoint. path may be
//   - a .safetensors file;
//   - an index file (*.json, normally model.safetensors.index.json);
//   - a directory: its model.safetensors.index.json if present, else its
//     only *.safetensors.index.json, else all its *.safetensors files.
//
// With an index, every tensor of weight_map must exist in exactly the shard
// it names, and every tensor of every shard must be in weight_map; a
// missing shard, a tensor found in another shard or in two shards, and a
// tensor missing from the index are errors naming the tensor and shard.
// Without an index, a name present in two files is an error. A total_size
// that disagrees with the shards is only a warning (see Warnings). Every
// file is fully validated as Open does.
func OpenModel(path string) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if st.IsDir() {
		idx := filepath.Join(path, IndexFileName)
		if _, err := os.Stat(idx); err == nil {
			return openIndexed(path, idx)
		}
		cands, _ := filepath.Glob(filepath.Join(path, "*.safetensors.index.json"))
		switch len(cands) {
		case 0:
		case 1:
			return openIndexed(path, cands[0])
		default:
			return nil, &Error{Path: path, Kind: ErrInvalidIndex, Detail: "several index files: " + strings.Join(baseNames(cands), ", ")}
		}
		files, _ := filepath.Glob(filepath.Join(path, "*.safetensors"))
		if len(files) == 0 {
			return nil, fmt.Errorf("safetensors: %s: no .safetensors files and no index", path)
		}
		return openFiles(path, files)
	}
	if strings.HasSuffix(path, ".json") {
		return openIndexed(path, path)
	}
	return openFiles(path, []string{path})
}

func baseNames(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = filepath.Base(p)
	}
	return out
}

func openFiles(path string, files []string) (*Model, error) {
	slices.Sort(files)
	m := &Model{path: path, where: map[string]int{}}
	for _, fp := range files {
		f, err := Open(fp)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.files = append(m.files, f)
		fi := len(m.files) - 1
		for _, t := range f.h.tensors {
			if j, dup := m.where[t.Name]; dup {
				m.Close()
				return nil, &Error{Path: fp, Tensor: t.Name, hasT: true, Kind: ErrDuplicateTensor, Detail: "also in " + m.files[j].path}
			}
			m.where[t.Name] = fi
		}
		m.noteDups(f)
	}
	m.finish()
	return m, nil
}

func (m *Model) noteDups(f *File) {
	for _, d := range f.h.dups {
		m.warnings = append(m.warnings, fmt.Sprintf("%s: tensor %q appears more than once in the header; the last entry is used", f.path, d))
	}
}

func (m *Model) finish() {
	m.names = slices.Sorted(maps.Keys(m.where))
}

func openIndexed(path, indexPath string) (*Model, error) {
	x, err := ReadIndex(indexPath)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(indexPath)
	m := &Model{path: path, where: map[string]int{}, index: x}
	// First tensor (sorted) listed for each shard, to name in errors.
	firstOf := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(x.WeightMap)) {
		if _, ok := firstOf[x.WeightMap[name]]; !ok {
			firstOf[x.WeightMap[name]] = name
		}
	}
	shardIdx := map[string]int{}
	for _, s := range x.Shards() {
		fp := filepath.Join(dir, s)
		f, err := Open(fp)
		if err != nil {
			m.Close()
			if errors.Is(err, fs.ErrNotExist) {
				return nil, &Error{Path: indexPath, Tensor: firstOf[s], hasT: true, Kind: ErrInvalidIndex,
					Detail: fmt.Sprintf("shard %q named in weight_map does not exist", s)}
			}
			return nil, err
		}
		m.files = append(m.files, f)
		shardIdx[s] = len(m.files) - 1
		m.noteDups(f)
	}
	// Where each tensor actually is.
	found := map[string][]int{}
	for i, f := range m.files {
		for _, t := range f.h.tensors {
			found[t.Name] = append(found[t.Name], i)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(found)) {
		in := found[name]
		if len(in) > 1 {
			m.Close()
			return nil, &Error{Path: indexPath, Tensor: name, hasT: true, Kind: ErrDuplicateTensor,
				Detail: fmt.Sprintf("present in shards %s and %s", filepath.Base(m.files[in[0]].path), filepath.Base(m.files[in[1]].path))}
		}
		want, listed := x.WeightMap[name]
		got := filepath.Base(m.files[in[0]].path)
		if !listed {
			m.Close()
			return nil, &Error{Path: indexPath, Tensor: name, hasT: true, Kind: ErrInvalidIndex,
				Detail: fmt.Sprintf("present in shard %s but missing from weight_map", got)}
		}
		if in[0] != shardIdx[want] {
			m.Close()
			return nil, &Error{Path: indexPath, Tensor: name, hasT: true, Kind: ErrInvalidIndex,
				Detail: fmt.Sprintf("weight_map names shard %s but the tensor is in shard %s", want, got)}
		}
		m.where[name] = in[0]
	}
	for _, name := range slices.Sorted(maps.Keys(x.WeightMap)) {
		if _, ok := found[name]; !ok {
			m.Close()
			return nil, &Error{Path: indexPath, Tensor: name, hasT: true, Kind: ErrInvalidIndex,
				Detail: fmt.Sprintf("listed in weight_map for shard %s, which does not contain it", x.WeightMap[name])}
		}
	}
	if ts, ok := x.TotalSize(); ok {
		if sum := m.TotalSize(); ts != sum {
			m.warnings = append(m.warnings, fmt.Sprintf("%s: metadata.total_size is %d but the tensors hold %d bytes", indexPath, ts, sum))
		}
	}
	m.finish()
	return m, nil
}

// Close closes every file of the model.
func (m *Model) Close() error {
	var first error
	for _, f := range m.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Path returns the path the model was opened with.
func (m *Model) Path() string { return m.path }

// Names returns all tensor names, sorted bytewise.
func (m *Model) Names() []string { return slices.Clone(m.names) }

// Len returns the number of tensors.
func (m *Model) Len() int { return len(m.names) }

// Lookup returns the file holding the tensor and its description.
func (m *Model) Lookup(name string) (*File, TensorInfo, bool) {
	i, ok := m.where[name]
	if !ok {
		return nil, TensorInfo{}, false
	}
	t, _ := m.files[i].Lookup(name)
	return m.files[i], t, true
}

// ModelTensor is a tensor of a Model together with the file holding it.
type ModelTensor struct {
	File *File
	TensorInfo
}

// Tensors returns every tensor in storage order: files in the order of
// Files, and within a file in data-offset order. Reading tensors in this
// order reads each file sequentially.
func (m *Model) Tensors() []ModelTensor {
	out := make([]ModelTensor, 0, len(m.names))
	for _, f := range m.files {
		for _, t := range f.h.tensors {
			out = append(out, ModelTensor{File: f, TensorInfo: t})
		}
	}
	return out
}

// Files returns the model's files, sorted by path.
func (m *Model) Files() []*File { return slices.Clone(m.files) }

// Index returns the index the model was opened from, or nil.
func (m *Model) Index() *Index { return m.index }

// Warnings returns non-fatal findings: a total_size that disagrees with the
// shards, duplicate names inside a header.
func (m *Model) Warnings() []string { return slices.Clone(m.warnings) }

// TotalSize returns the sum of the tensors' byte sizes.
func (m *Model) TotalSize() int64 {
	var s int64
	for _, f := range m.files {
		for _, t := range f.h.tensors {
			s += t.Size()
		}
	}
	return s
}

func (m *Model) lookup(name string) (*File, error) {
	f, _, ok := m.Lookup(name)
	if !ok {
		return nil, &Error{Path: m.path, Tensor: name, hasT: true, Kind: ErrTensorNotFound}
	}
	return f, nil
}

// ReadTensor returns a fresh copy of the named tensor's bytes.
func (m *Model) ReadTensor(name string) ([]byte, error) {
	f, err := m.lookup(name)
	if err != nil {
		return nil, err
	}
	return f.ReadTensor(name)
}

// Float32s reads the named tensor converted to float32.
func (m *Model) Float32s(name string) ([]float32, error) {
	f, err := m.lookup(name)
	if err != nil {
		return nil, err
	}
	return f.Float32s(name)
}
