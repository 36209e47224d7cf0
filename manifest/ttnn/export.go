package ttnn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/manifest"
)

// RecordName is the export record written beside the tensor files.
const RecordName = "ttnn_export.json"

// RecordFormat identifies an export record.
const RecordFormat = "ttquant-ttnn-export"

// RecordVersion is the export record's schema version.
const RecordVersion = 1

// Profile names the upstream file format the written files follow.
const Profile = "tt-metal flatbuffer tensorbin: Tensor{tensor_spec, mesh_shape, shards, tensor_topology} (tt-metal PR #29158), 64-byte data alignment (PR #56434), no schema_version field or file identifier"

// ErrCheckpoint is wrapped when the checkpoint to export fails
// verification.
var ErrCheckpoint = errors.New("checkpoint failed verification")

// ErrOutput is wrapped when the output directory holds files an export
// would replace and Overwrite is not set.
var ErrOutput = errors.New("output directory not writable for an export")

// JournalName is the journal of an export in progress, beside the tensor
// files: the export's record header, then one line per finished file. An
// interrupted export leaves it, and the same export resumes from it; a
// finished one removes it once the record is written.
const JournalName = "ttnn_export.partial.jsonl"

// Options configure Export.
type Options struct {
	// Out is the output directory (created if needed).
	Out string
	// Memory is the memory config stored in every file; zero means DRAM
	// interleaved. ttnn places the tensor with it on load.
	Memory MemoryConfig
	// Mesh is the mesh shape the tensors are replicated over; nil means
	// 1×1.
	Mesh []uint32
	// Overwrite allows replacing the files of an earlier export (and
	// removes the files that earlier export listed and this one does not
	// write, so that no stale cache file is left for ttnn to load).
	Overwrite bool
	// Workers is the number of files the checkpoint verification checks
	// at once (default 1).
	Workers int
	// Tool names the program, recorded in the export record.
	Tool string
	// Progress, when set, is called after each file is written.
	Progress func(done, total int, file string)
}

// Record is ttnn_export.json: what was exported from which checkpoint, with
// the hashes that let Verify check every file without trusting ttnn.
type Record struct {
	SchemaVersion int           `json:"schema_version"`
	Format        string        `json:"format"`
	Tool          string        `json:"tool,omitempty"`
	Profile       string        `json:"tensorbin_profile"`
	Checkpoint    CheckpointRef `json:"checkpoint"`
	Options       RecordOptions `json:"options"`
	Files         []RecordFile  `json:"files"`
}

// CheckpointRef identifies the exported checkpoint.
type CheckpointRef struct {
	// Identity is the sha256 of the checkpoint's manifest.
	Identity string `json:"identity"`
	CacheKey string `json:"cache_key"`
}

// RecordOptions are the export options that shape the bytes.
type RecordOptions struct {
	MemoryConfig string   `json:"memory_config"`
	Mesh         []uint32 `json:"mesh"`
	// NamesSHA256 is the sha256 of the name map file.
	NamesSHA256 string `json:"names_sha256"`
}

// RecordFile is one written file.
type RecordFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// CacheName is what model code passes to as_tensor as cache_file_name.
	CacheName string   `json:"cache_name"`
	DType     string   `json:"dtype"`
	Layout    string   `json:"layout"`
	Shape     []uint32 `json:"shape"`
	Tile      string   `json:"tile,omitempty"`
	// Transpose: the file holds the transpose of the sources' last two
	// dimensions.
	Transpose bool `json:"transpose,omitempty"`
	// Sources are the checkpoint tensors, in stacking order.
	Sources []RecordSource `json:"sources"`
}

// RecordSource is one checkpoint tensor of a file.
type RecordSource struct {
	Tensor string `json:"tensor"`
	// SHA256 and Bytes are the tensor's stored bytes' hash and length in
	// the checkpoint manifest.
	SHA256      string  `json:"sha256"`
	Bytes       int64   `json:"bytes"`
	Format      string  `json:"format"`
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	Orientation string  `json:"orientation,omitempty"`
}

// Result is what Export did.
type Result struct {
	Dir      string
	Identity string
	Files    int
	Bytes    int64
	// Kept is the number of files an earlier run of the same export had
	// finished, checked and kept (all of them when it had completed).
	Kept   int
	Record *Record
}

// planFile is one file to write.
type planFile struct {
	rec  RecordFile
	spec Spec
}

// dtypeOf returns the ttnn data type a checkpoint tensor exports as.
func dtypeOf(e manifest.TensorEntry) (DataType, error) {
	if f, _, ok := e.BFP(); ok {
		switch f {
		case bfp.BFP8:
			return BFloat8B, nil
		case bfp.BFP4:
			return BFloat4B, nil
		}
		return 0, fmt.Errorf("%w: tensor %s: %s has no ttnn data type", ErrUnsupported, e.Name, e.Format)
	}
	switch e.DType {
	case "BF16":
		return BFloat16, nil
	case "F32":
		return Float32, nil
	case "U32":
		return UInt32, nil
	case "I32":
		return Int32, nil
	case "U16":
		return UInt16, nil
	case "U8":
		return UInt8, nil
	}
	return 0, fmt.Errorf("%w: tensor %s: stored dtype %s has no ttnn data type (ttnn stores BF16, F32, U32, I32, U16, U8)", ErrUnsupported, e.Name, e.DType)
}

func sourceOf(e manifest.TensorEntry) RecordSource {
	return RecordSource{Tensor: e.Name, SHA256: e.SHA256, Bytes: e.Length, Format: e.Format, DType: e.DType,
		Shape: slices.Clone(e.Shape), Orientation: e.Orientation}
}

type member struct {
	index int
	entry manifest.TensorEntry
}

type group struct {
	rule    int
	cache   string
	members []member
}

func plan(names []string, info func(string) (manifest.TensorEntry, error), m *NameMap, mem MemoryConfig) ([]planFile, error) {
	var errs []error
	fail := func(err error) {
		if len(errs) < 20 {
			errs = append(errs, err)
		}
	}
	used := make([]int, len(m.Rules))
	groups := map[string]*group{}
	for _, name := range names {
		i, sm := m.match(name)
		if i < 0 {
			fail(fmt.Errorf("%w: tensor %s matches no rule (add a rule, or a skip rule to leave it out)", ErrNameMap, name))
			continue
		}
		used[i]++
		r := m.Rules[i]
		if r.Skip {
			continue
		}
		e, err := info(name)
		if err != nil {
			fail(err)
			continue
		}
		cache := m.expand(i, r.Name, name, sm)
		idx := 0
		if r.Stack != nil {
			s := m.expand(i, r.Stack.Index, name, sm)
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				fail(fmt.Errorf("%w: tensor %s: stack index %q is not a non-negative integer", ErrNameMap, name, s))
				continue
			}
			idx = n
			if gs := r.Stack.GroupSize; gs > 0 {
				cache = strings.ReplaceAll(cache, "{group}", strconv.Itoa(n/gs))
			}
		}
		if !validCacheName(cache) {
			fail(fmt.Errorf("%w: tensor %s: cache name %q is not a clean relative path", ErrNameMap, name, cache))
			continue
		}
		g := groups[cache]
		if g == nil {
			g = &group{rule: i, cache: cache}
			groups[cache] = g
		} else if g.rule != i || r.Stack == nil {
			fail(fmt.Errorf("%w: tensors %s and %s both map to %q", ErrNameMap, g.members[0].entry.Name, name, cache))
			continue
		}
		g.members = append(g.members, member{index: idx, entry: e})
	}
	for i, r := range m.Rules {
		if used[i] == 0 && !r.Optional {
			fail(fmt.Errorf("%w: rule %d (%q) matches no tensor of the checkpoint", ErrNameMap, i, r.Match))
		}
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []planFile
	seen := map[string]string{}
	for _, k := range keys {
		g := groups[k]
		f, err := planGroup(g, m.Rules[g.rule], mem)
		if err != nil {
			fail(err)
			continue
		}
		if prev, dup := seen[strings.ToLower(f.rec.Name)]; dup {
			fail(fmt.Errorf("%w: %q and %q give the same file name %s", ErrNameMap, prev, g.cache, f.rec.Name))
			continue
		}
		seen[strings.ToLower(f.rec.Name)] = g.cache
		out = append(out, f)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].rec.Name < out[b].rec.Name })
	return out, nil
}

// planGroup lays out one file: the group's members (stacked in index
// order when the rule stacks), in the data type, layout and shape the rule
// asks for and the stored bytes allow.
func planGroup(g *group, r Rule, mem MemoryConfig) (planFile, error) {
	sort.Slice(g.members, func(a, b int) bool { return g.members[a].index < g.members[b].index })
	first := g.members[0].entry
	where := fmt.Sprintf("tensor %s (%s %s %v)", first.Name, first.Format, first.DType, first.Shape)
	if err := checkStack(g, r); err != nil {
		return planFile{}, err
	}
	dt, layout, err := fileType(first, r, where)
	if err != nil {
		return planFile{}, err
	}
	shape, tile, err := memberShape(first, r, dt, layout, where)
	if err != nil {
		return planFile{}, err
	}
	s32, err := fileShape(shape, r, len(g.members), where)
	if err != nil {
		return planFile{}, err
	}
	spec := Spec{Shape: s32, DType: dt, Layout: layout, Tile: tile, Memory: mem}
	size, err := spec.PayloadSize()
	if err != nil {
		return planFile{}, fmt.Errorf("%s as %s %s %v: %w", where, dt, layout, s32, err)
	}
	var total int64
	for _, mb := range g.members {
		total += mb.entry.Length
	}
	if _, isBFP := dt.BFP(); isBFP && size != total {
		// The packed bytes are ttnn's payload only if the tiles line up.
		return planFile{}, fmt.Errorf("%w: %s: %d packed bytes, ttnn's %v %s layout needs %d", ErrShape, where, total, s32, dt, size)
	}
	rec := RecordFile{Name: FileName(g.cache, dt, layout), CacheName: g.cache, DType: dt.String(), Layout: layout.String(),
		Shape: s32, Transpose: r.Transpose}
	if layout == TileLayout {
		rec.Tile = tile.String()
	}
	for _, mb := range g.members {
		rec.Sources = append(rec.Sources, sourceOf(mb.entry))
	}
	return planFile{rec: rec, spec: spec}, nil
}

// checkStack checks a stacked group (members sorted by index): its stack
// positions run on from the start of their group of the stack, and every
// member is stored as the first is.
func checkStack(g *group, r Rule) error {
	if r.Stack == nil {
		return nil
	}
	first := g.members[0].entry
	base := 0
	if r.Stack.GroupSize > 0 {
		base = g.members[0].index / r.Stack.GroupSize * r.Stack.GroupSize
	}
	for j, mb := range g.members {
		if mb.index != base+j {
			return fmt.Errorf("%w: %s: stack positions %v are not consecutive from %d", ErrNameMap, g.cache, stackIndices(g.members), base)
		}
		e := mb.entry
		if e.Format != first.Format || e.DType != first.DType || !slices.Equal(e.Shape, first.Shape) || e.Orientation != first.Orientation || e.Tile != first.Tile {
			return fmt.Errorf("%w: %s: cannot stack %s (%s %v) with %s (%s %v)", ErrShape, g.cache, e.Name, e.Format, e.Shape, first.Name, first.Format, first.Shape)
		}
	}
	return nil
}

// fileType is the ttnn data type and layout of a file of e: its stored
// format's, where the rule names them they must agree (a BFP type is
// tiled).
func fileType(e manifest.TensorEntry, r Rule, where string) (DataType, Layout, error) {
	dt, err := dtypeOf(e)
	if err != nil {
		return 0, 0, err
	}
	if r.DType != "" {
		want, _ := ParseDataType(r.DType)
		if want != dt {
			return 0, 0, fmt.Errorf("%w: %s exports as %s, the map asks for %s", ErrNameMap, where, dt, want)
		}
	}
	_, isBFP := dt.BFP()
	layout := RowMajor
	if isBFP {
		layout = TileLayout
	}
	if r.Layout != "" {
		layout, _ = ParseLayout(r.Layout)
	}
	if isBFP && layout != TileLayout {
		return 0, 0, fmt.Errorf("%w: %s: %s tensors exist only in TILE layout", ErrShape, where, dt)
	}
	return dt, layout, nil
}

// memberShape is the shape one member e takes in the file, and the file's
// tile: a BFP tensor as stored (its orientation must be the transpose the
// rule asks for: its exponent groups cannot move), another transposed as
// the rule asks.
func memberShape(e manifest.TensorEntry, r Rule, dt DataType, layout Layout, where string) ([]int64, bfp.Tile, error) {
	shape := slices.Clone(e.Shape)
	var tile bfp.Tile
	if _, isBFP := dt.BFP(); isBFP {
		_, tile, _ = e.BFP()
		stored := e.Orientation == manifest.OrientTransposed
		if r.Transpose != stored {
			axis := bfp.AxisInput
			if r.Transpose {
				axis = bfp.AxisOutput
			}
			return nil, tile, fmt.Errorf("%w: %s is stored with orientation %q but the map asks for transpose=%v; a BFP tensor's exponent groups cannot be moved without quantizing again (build the checkpoint with the %s axis, --axis %s)", ErrShape, where, e.Orientation, r.Transpose, axis, axis)
		}
		if stored {
			if len(shape) < 2 {
				return nil, tile, fmt.Errorf("%w: %s: transposed tensor of rank %d", ErrShape, where, len(shape))
			}
			swapLast2(shape)
		}
		if len(shape) < 2 && r.Stack != nil {
			return nil, tile, fmt.Errorf("%w: %s: stacking BFP vectors would put them in one tile column group; ttnn would tile them differently", ErrShape, where)
		}
		return shape, tile, nil
	}
	if layout == TileLayout {
		tile = bfp.Tile32x32
	}
	if r.Transpose {
		if len(shape) < 2 {
			return nil, tile, fmt.Errorf("%w: %s: cannot transpose a tensor of rank %d", ErrShape, where, len(shape))
		}
		swapLast2(shape)
	}
	return shape, tile, nil
}

// swapLast2 swaps the last two dimensions of shape.
func swapLast2(shape []int64) {
	n := len(shape)
	shape[n-2], shape[n-1] = shape[n-1], shape[n-2]
}

// fileShape is the file's shape of n members of shape: stacked on a new
// first dimension when the rule stacks, padded with leading ones to the
// rule's rank, every dimension a uint32.
func fileShape(shape []int64, r Rule, n int, where string) ([]uint32, error) {
	if r.Stack != nil {
		shape = append([]int64{int64(n)}, shape...)
	}
	if r.Rank > 0 {
		if len(shape) > r.Rank {
			return nil, fmt.Errorf("%w: %s: shape %v has rank above the map's rank %d", ErrShape, where, shape, r.Rank)
		}
		for len(shape) < r.Rank {
			shape = append([]int64{1}, shape...)
		}
	}
	s32 := make([]uint32, len(shape))
	for i, d := range shape {
		if d <= 0 || d > math.MaxUint32 {
			return nil, fmt.Errorf("%w: %s: dimension %d of %v", ErrShape, where, d, shape)
		}
		s32[i] = uint32(d)
	}
	return s32, nil
}

func stackIndices(ms []member) []int {
	out := make([]int, len(ms))
	for i, m := range ms {
		out[i] = m.index
	}
	return out
}

// specOf rebuilds a record file's spec.
func specOf(f RecordFile, mem MemoryConfig) (Spec, error) {
	dt, err := ParseDataType(f.DType)
	if err != nil {
		return Spec{}, err
	}
	l, err := ParseLayout(f.Layout)
	if err != nil {
		return Spec{}, err
	}
	s := Spec{Shape: slices.Clone(f.Shape), DType: dt, Layout: l, Memory: mem}
	if l == TileLayout {
		if s.Tile, err = bfp.ParseTile(f.Tile); err != nil {
			return Spec{}, err
		}
	}
	return s, nil
}

// matrixGeometry returns the final shape folded into slices×rows×cols.
func matrixGeometry(shape []uint32) (slices, rows, cols int) {
	slices, rows, cols = 1, 1, int(shape[len(shape)-1])
	if len(shape) >= 2 {
		rows = int(shape[len(shape)-2])
		for _, d := range shape[:len(shape)-2] {
			slices *= int(d)
		}
	}
	return
}

// sourceGeometry returns a lossless source's shape as slices×rows×cols.
func sourceGeometry(shape []int64) (slices, rows, cols int) {
	s := make([]uint32, len(shape))
	for i, d := range shape {
		s[i] = uint32(d)
	}
	return matrixGeometry(s)
}

// encodePayload turns the sources' stored bytes (in stacking order) into
// the file's payload.
func encodePayload(f RecordFile, spec Spec, parts [][]byte) ([]byte, error) {
	if _, isBFP := spec.DType.BFP(); isBFP {
		return bytes.Join(parts, nil), nil
	}
	elem := spec.DType.ElementSize()
	rm := make([]byte, 0, len(parts)*len(parts[0]))
	for i, p := range parts {
		if f.Transpose {
			sl, r, c := sourceGeometry(f.Sources[i].Shape)
			p = transposeLast2(p, sl, r, c, elem)
		}
		rm = append(rm, p...)
	}
	if spec.Layout == RowMajor {
		return rm, nil
	}
	sl, r, c := matrixGeometry(spec.Shape)
	return tilize(rm, tileGeometry{slices: sl, rows: r, cols: c, elem: elem, tile: spec.Tile})
}

// decodePayload inverts encodePayload: the sources' stored bytes.
func decodePayload(f RecordFile, spec Spec, payload []byte) ([][]byte, error) {
	n := len(f.Sources)
	var rm []byte
	if _, isBFP := spec.DType.BFP(); isBFP || spec.Layout == RowMajor {
		rm = payload
	} else {
		sl, r, c := matrixGeometry(spec.Shape)
		var err error
		if rm, err = untilize(payload, tileGeometry{slices: sl, rows: r, cols: c, elem: spec.DType.ElementSize(), tile: spec.Tile}); err != nil {
			return nil, err
		}
	}
	if len(rm)%n != 0 {
		return nil, fmt.Errorf("%w: %d payload bytes do not split into %d sources", ErrShape, len(rm), n)
	}
	per := len(rm) / n
	out := make([][]byte, n)
	for i := range out {
		p := rm[i*per : (i+1)*per]
		if f.Transpose {
			if _, isBFP := spec.DType.BFP(); !isBFP {
				sl, r, c := sourceGeometry(f.Sources[i].Shape)
				p = transposeLast2(p, sl, c, r, spec.DType.ElementSize())
			}
		}
		out[i] = p
	}
	return out, nil
}

// Export writes every tensor the name map selects from checkpoint c as a
// .tensorbin file under opt.Out, then ttnn_export.json. The checkpoint is
// verified and the whole export planned first: nothing is written when the
// checkpoint fails verification, the map does not fit it, a shape cannot be
// laid out, or the output holds files of another export (unless
// opt.Overwrite). Each file is written under a temporary name, flushed and
// renamed, and listed in the journal; the record is written last. The same
// export (checkpoint, options and name map) into a directory that holds
// it, finished or interrupted, keeps every file that still has the size
// and hash recorded for it and writes the rest: an interrupted export
// resumes, and a repeated one writes nothing.
func Export(ctx context.Context, c *manifest.Checkpoint, m *NameMap, opt Options) (*Result, error) {
	if err := opt.settle(); err != nil {
		return nil, err
	}
	files, err := plan(c.Names(), c.TensorInfo, m, opt.Memory)
	if err != nil {
		return nil, err
	}
	if err := verifyCheckpoint(ctx, c, opt.Workers); err != nil {
		return nil, err
	}
	if inside(opt.Out, c.Dir()) {
		return nil, fmt.Errorf("%w: %s is inside the checkpoint %s (its verification would fail on the extra files)", ErrOutput, opt.Out, c.Dir())
	}
	// One writer per output directory, as for checkpoint builds: taken
	// before the directory is examined, released (with any directory it
	// had to create) when the export ends.
	lk, err := fslock.Acquire(opt.Out)
	if err != nil {
		return nil, err
	}
	defer lk.Release()
	rec := &Record{SchemaVersion: RecordVersion, Format: RecordFormat, Tool: opt.Tool, Profile: Profile,
		Checkpoint: CheckpointRef{Identity: c.Identity(), CacheKey: c.CacheKey()},
		Options:    RecordOptions{MemoryConfig: opt.Memory.String(), Mesh: slices.Clone(opt.Mesh), NamesSHA256: m.SHA256()}}
	known, stale, err := checkOutput(opt.Out, rec, files, opt.Overwrite)
	if err != nil {
		return nil, err
	}
	res := &Result{Dir: opt.Out, Identity: c.Identity(), Record: rec}
	keep, err := keptFiles(ctx, opt.Out, files, known)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(keep, false) && len(stale) == 0 {
		if res, done, err := keptExport(opt, rec, files, res); done || err != nil {
			return res, err
		}
	}
	if err := clearOutput(opt.Out, stale); err != nil {
		return nil, err
	}
	jr, err := startJournal(opt.Out, rec)
	if err != nil {
		return nil, err
	}
	defer jr.Close()
	if err := writeFiles(ctx, c, opt, files, keep, jr, res); err != nil {
		return nil, err
	}
	if err := finishExport(opt.Out, rec, jr); err != nil {
		return nil, err
	}
	return res, nil
}

// settle fills in the defaults (DRAM interleaved, a 1×1 mesh) and refuses
// what is not written: no output directory, a sharded memory config, a
// mesh shape Replicated refuses.
func (opt *Options) settle() error {
	if opt.Out == "" {
		return errors.New("ttnn: no output directory")
	}
	if opt.Memory == (MemoryConfig{}) {
		opt.Memory = DRAMInterleaved
	}
	if opt.Memory.Layout != Interleaved || opt.Memory.Sharded {
		return fmt.Errorf("%w: memory config %s (only interleaved configs are written)", ErrUnsupported, opt.Memory)
	}
	if len(opt.Mesh) == 0 {
		opt.Mesh = []uint32{1, 1}
	}
	_, _, err := Replicated(opt.Mesh, 0)
	return err
}

// verifyCheckpoint verifies c in full (workers files at once): a failure,
// or a checkpoint changed since it was opened, is an ErrCheckpoint.
func verifyCheckpoint(ctx context.Context, c *manifest.Checkpoint, workers int) error {
	rep, err := manifest.Verify(ctx, c.Dir(), manifest.VerifyOptions{Workers: workers})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCheckpoint, err)
	}
	if !rep.OK {
		var b strings.Builder
		for i, f := range rep.Failures {
			if i == 3 {
				fmt.Fprintf(&b, "; and %d more", len(rep.Failures)-3)
				break
			}
			fmt.Fprintf(&b, "; %s", f)
		}
		return fmt.Errorf("%w: %s%s", ErrCheckpoint, c.Dir(), b.String())
	}
	if rep.Identity != c.Identity() {
		return fmt.Errorf("%w: %s changed since it was opened (identity %s, now %s)", ErrCheckpoint, c.Dir(), c.Identity(), rep.Identity)
	}
	return nil
}

// keptFiles says which files an earlier run of this export finished
// (known) and still hold what it recorded: they are kept, their size and
// hash filled in. It is decided before anything is written.
func keptFiles(ctx context.Context, dir string, files []planFile, known map[string]RecordFile) ([]bool, error) {
	keep := make([]bool, len(files))
	for i, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if k, ok := known[f.rec.Name]; ok && sameFile(k, f.rec) && fileHolds(ctx, filepath.Join(dir, filepath.FromSlash(k.Name)), k.Size, k.SHA256) {
			keep[i] = true
			files[i].rec.Size, files[i].rec.SHA256 = k.Size, k.SHA256
		}
	}
	return keep, nil
}

// clearOutput makes the output directory ready for the files: an earlier
// record goes first (until the new one is written the directory is
// visibly an unfinished export), then the stale files of an earlier
// export.
func clearOutput(dir string, stale []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, name := range append([]string{RecordName}, stale...) {
		if err := os.Remove(filepath.Join(dir, filepath.FromSlash(name))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// writeFiles writes every file not kept, in order, and lists each file,
// kept or written, in the journal, the record and the result.
func writeFiles(ctx context.Context, c *manifest.Checkpoint, opt Options, files []planFile, keep []bool, jr *journal, res *Result) error {
	for i, f := range files {
		if err := ctx.Err(); err != nil {
			return err
		}
		if keep[i] {
			res.Kept++
		} else {
			size, sum, err := writeFile(c, opt, f)
			if err != nil {
				return err
			}
			f.rec.Size, f.rec.SHA256 = size, sum
		}
		if err := jr.add(f.rec); err != nil {
			return err
		}
		res.Record.Files = append(res.Record.Files, f.rec)
		res.Files++
		res.Bytes += f.rec.Size
		if opt.Progress != nil {
			opt.Progress(i+1, len(files), f.rec.Name)
		}
	}
	return nil
}

// writeFile writes one file from its sources' stored bytes and returns
// its size and sha256.
func writeFile(c *manifest.Checkpoint, opt Options, f planFile) (int64, string, error) {
	parts := make([][]byte, len(f.rec.Sources))
	for j, s := range f.rec.Sources {
		var err error
		if parts[j], err = c.ReadPacked(s.Tensor); err != nil {
			return 0, "", err
		}
	}
	payload, err := encodePayload(f.rec, f.spec, parts)
	if err != nil {
		return 0, "", fmt.Errorf("%s: %w", f.rec.Name, err)
	}
	return writeTensorFile(filepath.Join(opt.Out, filepath.FromSlash(f.rec.Name)), f.spec, opt.Mesh, payload)
}

// finishExport writes the record, then closes and removes the journal.
func finishExport(dir string, rec *Record, jr *journal) error {
	data, err := rec.Encode()
	if err != nil {
		return err
	}
	if _, err := atomicfile.WriteFile(filepath.Join(dir, RecordName), data); err != nil {
		return err
	}
	if err := jr.Close(); err != nil {
		return err
	}
	return os.Remove(filepath.Join(dir, JournalName))
}

// keptExport finishes an export whose every file an earlier run left
// intact: when the directory's record is already this export's, nothing
// is written (done); otherwise the caller writes the record.
func keptExport(opt Options, rec *Record, files []planFile, res *Result) (*Result, bool, error) {
	for _, f := range files {
		rec.Files = append(rec.Files, f.rec)
		res.Bytes += f.rec.Size
	}
	res.Files, res.Kept = len(files), len(files)
	data, err := rec.Encode()
	if err != nil {
		return nil, false, err
	}
	old, err := os.ReadFile(filepath.Join(opt.Out, RecordName))
	if err != nil || !bytes.Equal(old, data) {
		// Back to a clean start for the caller's pass.
		rec.Files, res.Files, res.Kept, res.Bytes = nil, 0, 0, 0
		return nil, false, nil
	}
	if _, err := os.Stat(filepath.Join(opt.Out, JournalName)); err == nil {
		if err := os.Remove(filepath.Join(opt.Out, JournalName)); err != nil {
			return nil, false, err
		}
	}
	if opt.Progress != nil {
		opt.Progress(len(files), len(files), "")
	}
	return res, true, nil
}

func writeTensorFile(path string, spec Spec, mesh []uint32, payload []byte) (int64, string, error) {
	a, err := atomicfile.Create(path)
	if err != nil {
		return 0, "", err
	}
	if _, err := Write(a, spec, mesh, payload); err != nil {
		a.Abort()
		return 0, "", fmt.Errorf("%s: %w", path, err)
	}
	return a.Commit()
}

// inside reports whether path is dir or below it.
func inside(path, dir string) bool {
	p, err1 := filepath.Abs(path)
	d, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// checkOutput examines the output directory. When it holds this export
// (rec, without files), finished (its record) or interrupted (its
// journal), it returns the files that export finished, to keep if they
// still check. Otherwise a record, a journal or a file the export would
// write is refused unless overwrite is set; with overwrite it returns the
// earlier export's files this one does not write, to remove.
func checkOutput(dir string, rec *Record, files []planFile, overwrite bool) (known map[string]RecordFile, stale []string, err error) {
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if !fi.IsDir() {
		return nil, nil, fmt.Errorf("%w: %s is not a directory", ErrOutput, dir)
	}
	old, oldErr := ReadRecord(dir)
	if oldErr == nil && sameExport(old, rec) {
		return filesByName(old.Files), nil, nil
	}
	if hdr, done, err := readJournal(dir); err == nil && sameExport(hdr, rec) {
		return filesByName(done), nil, nil
	}
	var clash []string
	for _, name := range []string{RecordName, JournalName} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			clash = append(clash, name)
		}
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(f.rec.Name))); err == nil {
			clash = append(clash, f.rec.Name)
		}
	}
	if len(clash) == 0 {
		return nil, nil, nil
	}
	if !overwrite {
		more := ""
		if len(clash) > 3 {
			more = fmt.Sprintf(" and %d more", len(clash)-3)
			clash = clash[:3]
		}
		return nil, nil, fmt.Errorf("%w: %s already holds %s%s of another export (Overwrite, --overwrite on the command line, replaces it)", ErrOutput, dir, strings.Join(clash, ", "), more)
	}
	if oldErr != nil {
		return nil, nil, nil // no readable earlier record: nothing known to be stale
	}
	keep := map[string]bool{}
	for _, f := range files {
		keep[f.rec.Name] = true
	}
	for _, f := range old.Files {
		if !keep[f.Name] && validCacheName(f.Name) && strings.HasSuffix(f.Name, Ext) {
			stale = append(stale, f.Name)
		}
	}
	return nil, stale, nil
}

// sameExport reports whether two records describe the same export: the
// same checkpoint, file profile and options (the name map by its hash).
func sameExport(a, b *Record) bool {
	return a.Format == b.Format && a.SchemaVersion == b.SchemaVersion && a.Profile == b.Profile && a.Checkpoint == b.Checkpoint &&
		a.Options.MemoryConfig == b.Options.MemoryConfig && slices.Equal(a.Options.Mesh, b.Options.Mesh) && a.Options.NamesSHA256 == b.Options.NamesSHA256
}

func filesByName(fs []RecordFile) map[string]RecordFile {
	out := make(map[string]RecordFile, len(fs))
	for _, f := range fs {
		out[f.Name] = f
	}
	return out
}

// sameFile reports whether a recorded file is the planned one: every
// field but the size and hash, which only writing gives.
func sameFile(got, want RecordFile) bool {
	got.Size, got.SHA256, want.Size, want.SHA256 = 0, "", 0, ""
	a, err1 := json.Marshal(got)
	b, err2 := json.Marshal(want)
	return err1 == nil && err2 == nil && bytes.Equal(a, b)
}

// fileHolds reports whether path is a regular file of the given size and
// sha256 (the size checked first, the hash through manifest's cancellable
// hashing).
func fileHolds(ctx context.Context, path string, size int64, sum string) bool {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		return false
	}
	n, got, err := manifest.HashFileContext(ctx, path)
	return err == nil && n == size && got == sum
}

// journal appends finished files to JournalName, each line flushed to
// disk before the next file is written.
type journal struct{ f *os.File }

// startJournal writes a new journal with the export's header.
func startJournal(dir string, rec *Record) (*journal, error) {
	hdr := *rec
	hdr.Files = nil
	line, err := json.Marshal(&hdr)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, JournalName), os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	j := &journal{f: f}
	if err := j.line(line); err != nil {
		f.Close()
		return nil, err
	}
	return j, nil
}

func (j *journal) add(f RecordFile) error {
	line, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return j.line(line)
}

func (j *journal) line(b []byte) error {
	if _, err := j.f.Write(append(b, '\n')); err != nil {
		return err
	}
	return j.f.Sync()
}

// Close closes the journal file; closing twice is harmless.
func (j *journal) Close() error {
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}

// readJournal reads an interrupted export's journal: its header and the
// files it finished (a torn last line is ignored).
func readJournal(dir string) (*Record, []RecordFile, error) {
	data, err := os.ReadFile(filepath.Join(dir, JournalName))
	if err != nil {
		return nil, nil, err
	}
	lines := bytes.Split(data, []byte("\n"))
	var hdr Record
	if err := json.Unmarshal(lines[0], &hdr); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", JournalName, err)
	}
	var done []RecordFile
	for _, l := range lines[1:] {
		var f RecordFile
		if json.Unmarshal(l, &f) != nil || f.Name == "" {
			break
		}
		done = append(done, f)
	}
	return &hdr, done, nil
}

// Encode returns the record's canonical bytes: indented JSON, files sorted
// by name, a trailing newline.
func (r *Record) Encode() ([]byte, error) {
	sort.Slice(r.Files, func(a, b int) bool { return r.Files[a].Name < r.Files[b].Name })
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ReadRecord reads and strictly decodes dir/ttnn_export.json.
func ReadRecord(dir string) (*Record, error) {
	data, err := os.ReadFile(filepath.Join(dir, RecordName))
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var r Record
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %w", RecordName, err)
	}
	if r.Format != RecordFormat || r.SchemaVersion != RecordVersion {
		return nil, fmt.Errorf("%s: format %q version %d, this build reads %q version %d", RecordName, r.Format, r.SchemaVersion, RecordFormat, RecordVersion)
	}
	return &r, nil
}
