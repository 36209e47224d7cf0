package build

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/jsonx"
	"github.com/ttquant/ttquant/internal/par"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
)

// ErrResumeMismatch is wrapped by the error a build returns when the output
// directory holds a build of different inputs or options.
var ErrResumeMismatch = errors.New("output directory holds a different build")

const buildRecordName = "build.json"

// tool is the program recorded in the manifest: BuildOptions.Tool, or
// "ttquant (devel)" when it is not set.
func (b *builder) tool() manifest.ToolInfo {
	if b.opt.Tool == (manifest.ToolInfo{}) {
		return manifest.ToolInfo{Name: "ttquant", Version: "(devel)"}
	}
	return b.opt.Tool
}

func (b *builder) fingerprint(si manifest.SourceInfo) fingerprint {
	fp := fingerprint{
		Command: b.command(),
		Tool:    b.tool(),
		Source:  si.Identity,
		Plan:    planInfo(b.opt.Plan).SHA256,
		Options: b.params,
		Parent:  b.opt.Parent,
	}
	if b.calib != nil {
		fp.Calibration = b.calib.SHA256
	}
	return fp
}

func (b *builder) command() string {
	if b.kind == kindGPTQ {
		return "gptq"
	}
	return "convert"
}

// diffFingerprints names what differs between two builds.
func diffFingerprints(have, want fingerprint) []string {
	var d []string
	if have.Command != want.Command {
		d = append(d, fmt.Sprintf("command (%s, now %s)", have.Command, want.Command))
	}
	if have.Source != want.Source {
		d = append(d, fmt.Sprintf("source checkpoint (identity %.16s, now %.16s)", have.Source, want.Source))
	}
	if have.Plan != want.Plan {
		d = append(d, fmt.Sprintf("plan (sha256 %.16s, now %.16s)", have.Plan, want.Plan))
	}
	if have.Calibration != want.Calibration {
		d = append(d, fmt.Sprintf("calibration (sha256 %.16s, now %.16s)", have.Calibration, want.Calibration))
	}
	if have.Options != want.Options {
		hv, wv := reflect.ValueOf(have.Options), reflect.ValueOf(want.Options)
		for i := 0; i < hv.NumField(); i++ {
			if hv.Field(i).Interface() != wv.Field(i).Interface() {
				tag := strings.Split(hv.Type().Field(i).Tag.Get("json"), ",")[0]
				d = append(d, fmt.Sprintf("option %s (%v, now %v)", tag, hv.Field(i).Interface(), wv.Field(i).Interface()))
			}
		}
	}
	if have.Parent != want.Parent {
		d = append(d, "parent manifest")
	}
	// The tool is provenance, not part of what the build is: a build
	// resumed or rerun by another build of the program keeps the files
	// whose hashes check, and the manifest records the program that
	// finished it.
	return d
}

// fingerprintOf recovers the fingerprint of a finished checkpoint.
func fingerprintOf(m *manifest.Manifest) fingerprint {
	fp := fingerprint{
		Command: m.TTQuant.Command,
		Tool:    m.Tool,
		Source:  m.Source.Identity,
		Plan:    m.Plan.SHA256,
		Options: m.TTQuant.Options,
		Parent:  m.TTQuant.Parent,
	}
	if m.TTQuant.Calibration != nil {
		fp.Calibration = m.TTQuant.Calibration.SHA256
	}
	return fp
}

// recordsOf splits a finished manifest into per-file records.
func recordsOf(m *manifest.Manifest) map[string]*fileRecord {
	recs := map[string]*fileRecord{}
	for _, f := range m.Files {
		if f.Role == manifest.FileExperts || f.Role == manifest.FileDense {
			recs[f.Name] = &fileRecord{File: f}
		}
	}
	fileOf := map[string]string{}
	for _, t := range m.Tensors {
		if r := recs[t.File]; r != nil {
			r.Tensors = append(r.Tensors, t)
			fileOf[t.Name] = t.File
		}
	}
	for _, ms := range m.TTQuant.Matrices {
		if r := recs[fileOf[ms.Tensor]]; r != nil {
			r.Matrices = append(r.Matrices, ms)
		}
	}
	return recs
}

func recordPath(out, file string) string {
	return filepath.Join(out, manifest.PartialDir, file+".json")
}

// prepareDir checks the output directory and returns the records of files
// an earlier run of the same build finished.
func (b *builder) prepareDir(fp fingerprint) (map[string]*fileRecord, error) {
	// Every check that can refuse the build comes before the first write;
	// the bookkeeping directory is created by the first record written.
	out := b.opt.Out
	recs := map[string]*fileRecord{}
	mpath := filepath.Join(out, manifest.ManifestName)
	bpath := filepath.Join(out, manifest.PartialDir, buildRecordName)
	old, err := b.existingManifest(fp)
	if err != nil {
		return nil, err
	}
	if old != nil {
		recs = recordsOf(old)
		if err := b.checkDisk(recs); err != nil {
			return nil, err
		}
		for name, r := range recs {
			if err := b.opt.Faults.WriteJSON(recordPath(out, name), r); err != nil {
				return nil, err
			}
		}
		b.wasFinished = true
		for _, ls := range old.TTQuant.Layers {
			if ls.CalibTokens > 0 || ls.ResidualMeanSquare > 0 {
				if err := b.opt.Faults.WriteJSON(layerRecordPath(out, ls.Layer), ls); err != nil {
					return nil, err
				}
			}
		}
		if err := b.opt.Faults.WriteJSON(bpath, fp); err != nil {
			return nil, err
		}
		// From here on the directory is an unfinished build again until the
		// manifest is rewritten.
		if err := os.Remove(mpath); err != nil {
			return nil, err
		}
	} else if started, err := b.checkBuildRecord(fp); err != nil {
		return nil, err
	} else if started {
		if recs, err = readFileRecords(out); err != nil {
			return nil, err
		}
		if err := b.checkDisk(recs); err != nil {
			return nil, err
		}
	} else {
		ents, err := os.ReadDir(out)
		if err != nil {
			return nil, err
		}
		if recs, err := readShardRecords(out); err == nil && len(recs) > 0 {
			return nil, fmt.Errorf("%w: %s holds worker %s of a split build: run its workers with --shard %s and ttquant assemble, or use another directory", ErrResumeMismatch, out, recs[0].Shard, "i/"+fmt.Sprint(recs[0].Count))
		}
		if err := checkOnly(out, ents, map[string]bool{manifest.PartialDir: true, fslock.Name: true}); err != nil {
			return nil, err
		}
		if err := b.checkDisk(recs); err != nil {
			return nil, err
		}
		if err := b.opt.Faults.WriteJSON(bpath, fp); err != nil {
			return nil, err
		}
	}
	// Leftovers of interrupted writes.
	filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, manifest.PartialSuffix) {
			os.Remove(p)
		}
		return nil
	})
	return recs, nil
}

// existingManifest reads the manifest a finished build left in the output
// directory (nil when there is none) and refuses it when it is of another
// build, or holds tensors stored from NaN or Inf source values and this
// run does not allow them. A whole build (prepareDir) and a worker of a
// split build (prepareShard) both start with it, so that both refuse the
// same directories.
func (b *builder) existingManifest(fp fingerprint) (*manifest.Manifest, error) {
	out := b.opt.Out
	mpath := filepath.Join(out, manifest.ManifestName)
	data, err := os.ReadFile(mpath)
	if err != nil {
		return nil, nil
	}
	old, err := manifest.DecodeManifest(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (remove it or choose another output directory)", mpath, err)
	}
	if d := diffFingerprints(fingerprintOf(old), fp); len(d) > 0 {
		return nil, fmt.Errorf("%w: %s was built with a different %s", ErrResumeMismatch, out, strings.Join(d, ", "))
	}
	if len(old.TTQuant.NonFinite) > 0 && !b.opt.AllowNonFinite {
		return nil, fmt.Errorf("%w: %s holds %d tensors stored from NaN or Inf source values (built with --allow-nonfinite), e.g. %s; rerun with --allow-nonfinite to keep them",
			ErrNonFinite, out, len(old.TTQuant.NonFinite), old.TTQuant.NonFinite[0])
	}
	return old, nil
}

// checkBuildRecord compares the record of an unfinished build in the
// output directory with fp: false when there is none, an error naming what
// differs (for a sequential build whose calibration differs, what its
// walk's record says changed in the text).
func (b *builder) checkBuildRecord(fp fingerprint) (bool, error) {
	out := b.opt.Out
	bpath := filepath.Join(out, manifest.PartialDir, buildRecordName)
	if _, err := os.Stat(bpath); err != nil {
		return false, nil
	}
	var have fingerprint
	if err := jsonx.ReadFile(bpath, &have); err != nil {
		return false, err
	}
	if d := diffFingerprints(have, fp); len(d) > 0 {
		if have.Calibration != fp.Calibration && b.seq != nil {
			// The walk's own record says what changed in the text.
			if c := b.seq.changed(); len(c) > 0 {
				d = append(d, "calibration walk ("+strings.Join(c, "; ")+")")
			}
		}
		return false, fmt.Errorf("%w: the unfinished build in %s used a different %s", ErrResumeMismatch, out, strings.Join(d, ", "))
	}
	return true, nil
}

// checkOnly refuses an output directory holding anything but ours (names,
// a file being written counting as its final name): it is no build's.
func checkOnly(out string, ents []os.DirEntry, ours map[string]bool) error {
	for _, e := range ents {
		if !ours[strings.TrimSuffix(e.Name(), manifest.PartialSuffix)] {
			return fmt.Errorf("output directory %s is not empty and holds no ttquant build (found %s)", out, e.Name())
		}
	}
	return nil
}

// readFileRecords reads the records of the files an unfinished build in
// out finished; a damaged record is left out (its file is redone).
func readFileRecords(out string) (map[string]*fileRecord, error) {
	ents, err := os.ReadDir(filepath.Join(out, manifest.PartialDir))
	if err != nil {
		return nil, err
	}
	recs := map[string]*fileRecord{}
	for _, e := range ents {
		if e.Name() == buildRecordName || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(out, manifest.PartialDir, e.Name()))
		if err != nil {
			return nil, err
		}
		var r fileRecord
		if jsonx.Unmarshal(data, &r) != nil || r.File.Name+".json" != e.Name() {
			continue
		}
		recs[r.File.Name] = &r
	}
	return recs, nil
}

func (b *builder) run(ctx context.Context) (*BuildResult, error) {
	si, configs, err := b.sourceIdentity(ctx)
	if err != nil {
		return nil, err
	}
	if err := b.checkSourcesFinite(); err != nil {
		return nil, err
	}
	fp := b.fingerprint(si)
	var recs map[string]*fileRecord
	if b.sharded() {
		if err := b.assignShard(); err != nil {
			return nil, err
		}
		var finished bool
		if recs, finished, err = b.prepareShard(fp); err != nil {
			return nil, err
		}
		if finished {
			return &BuildResult{Dir: b.opt.Out, AlreadyComplete: true}, nil
		}
	} else if recs, err = b.prepareDir(fp); err != nil {
		return nil, err
	}

	// Files produced one by one; the expert files of GPTQ layers are
	// produced by their layer's task below.
	layerJobs := map[int][]int{}
	var plain []int
	gptqJobs := map[int]bool{}
	for i, j := range b.jobs {
		if !b.owns(i) {
			continue
		}
		if j.role == manifest.FileExperts && b.gptqLayers[j.layer] {
			layerJobs[j.layer] = append(layerJobs[j.layer], i)
			gptqJobs[i] = true
		} else {
			plain = append(plain, i)
		}
	}
	var seqLayers []int
	if b.seq != nil {
		seqLayers = b.seq.layers()
	}
	b.track = b.begin(gptqJobs, seqLayers)

	// The workers of a split build all record the config files; the first
	// writes them.
	files, err := b.copyConfigs(configs, !b.sharded() || b.opt.Shard.Index == 0)
	if err != nil {
		return nil, err
	}

	o := &outputs{b: b, ctx: ctx, recs: recs, results: make([]*fileRecord, len(b.jobs))}
	keep, commit := o.keep, o.commit
	var layerOut []manifest.LayerStats
	if b.seq != nil && b.wasFinished && b.allHold(ctx, recs) {
		// The directory holds this checkpoint, every file intact: its
		// layer statistics are those recorded, and the pass is not run
		// again.
		if layerOut, err = b.recordedLayerStats(); err != nil {
			return nil, err
		}
		for i := range b.jobs {
			keep(i)
		}
		for _, l := range seqLayers {
			b.track.layerDone(l, true)
		}
	} else if b.seq != nil {
		// The dense files hold GPTQ'd tensors of many layers: they are
		// written after the sequential pass decided them.
		if layerOut, err = b.seq.run(ctx, layerJobs, keep, commit); err != nil {
			return nil, err
		}
		if err := o.writePlain(plain); err != nil {
			return nil, err
		}
	} else {
		if err := o.writePlain(plain); err != nil {
			return nil, err
		}
		for _, l := range sortedLayers(layerJobs) {
			ls, err := b.runGPTQLayer(ctx, l, layerJobs[l], keep, commit)
			if err != nil {
				return nil, fmt.Errorf("layer %d: %w", l, err)
			}
			layerOut = append(layerOut, *ls)
		}
	}

	return b.finishRun(ctx, o, fp, si, files, layerOut, len(plain)+len(gptqJobs))
}

// finishRun ends a build whose files are all written or kept: a worker of
// a split build writes its parts and record (mine is its file count), a
// whole build its manifest.
func (b *builder) finishRun(ctx context.Context, o *outputs, fp fingerprint, si manifest.SourceInfo, files []manifest.FileEntry, layerOut []manifest.LayerStats, mine int) (*BuildResult, error) {
	if b.sharded() {
		parts, err := b.writeParts(ctx)
		if err != nil {
			return nil, err
		}
		if err := b.finishShard(fp, b.head(si, files), o.results, parts, layerOut); err != nil {
			return nil, err
		}
		b.track.done()
		return &BuildResult{Dir: b.opt.Out, Files: mine, Kept: o.kept, AlreadyComplete: o.kept == mine && mine > 0}, nil
	}
	m, data, sums, dataBytes, err := b.writeManifest(ctx, si, o.results, layerOut, files)
	if err != nil {
		return nil, err
	}
	id := manifest.Identity(data)
	b.track.done()
	return &BuildResult{
		Dir:             b.opt.Out,
		Identity:        id,
		CacheKey:        manifest.CacheKey(id),
		Files:           len(m.Files) + 1,
		Tensors:         len(m.Tensors),
		Bytes:           dataBytes + int64(len(sums)) + int64(len(data)) + configBytes(files),
		Kept:            o.kept,
		AlreadyComplete: o.kept == len(b.jobs) && len(b.jobs) > 0,
		Manifest:        m,
		NonFinite:       m.TTQuant.NonFinite,
	}, nil
}

// outputs tracks a run's output files: those written (with their records)
// and those kept from an earlier run. It is safe for concurrent use.
type outputs struct {
	b       *builder
	ctx     context.Context
	recs    map[string]*fileRecord // what an earlier run recorded
	results []*fileRecord          // per job, once written or kept
	mu      sync.Mutex
	kept    int
}

// finish reports job i's file finished.
func (o *outputs) finish(i int, wasKept bool) {
	o.mu.Lock()
	if wasKept {
		o.kept++
	}
	o.mu.Unlock()
	o.b.track.file(i, o.b.jobs[i], wasKept)
}

// commit records a freshly written file.
func (o *outputs) commit(i int, r *fileRecord) error {
	b := o.b
	if err := b.opt.Faults.WriteJSON(recordPath(b.opt.Out, b.jobs[i].file), r); err != nil {
		return err
	}
	o.results[i] = r
	o.finish(i, false)
	if b.opt.testHook != nil {
		b.opt.testHook(b.jobs[i].file, "")
	}
	return nil
}

// keep reuses a file an earlier run finished, when its hash checks.
func (o *outputs) keep(i int) bool {
	if o.results[i] != nil {
		return true // kept or written already
	}
	j := o.b.jobs[i]
	if r := o.recs[j.file]; r != nil && o.b.recordHolds(o.ctx, j, r) {
		o.results[i] = r
		o.finish(i, true)
		return true
	}
	return false
}

// writePlain writes (or keeps) the files produced one by one.
func (o *outputs) writePlain(plain []int) error {
	b := o.b
	return par.For(o.ctx, len(plain), b.opt.Workers, func(k int) error {
		i := plain[k]
		if o.keep(i) {
			return nil
		}
		r, err := b.writeJob(o.ctx, b.jobs[i])
		if err != nil {
			return fmt.Errorf("%s: %w", b.jobs[i].file, err)
		}
		return o.commit(i, r)
	})
}

// allHold reports whether every output file was finished by an earlier run
// and checks.
func (b *builder) allHold(ctx context.Context, recs map[string]*fileRecord) bool {
	for _, j := range b.jobs {
		r := recs[j.file]
		if r == nil || !b.recordHolds(ctx, j, r) {
			return false
		}
	}
	return true
}

// recordedLayerStats reads the layer statistics prepareDir kept from a
// finished manifest.
func (b *builder) recordedLayerStats() ([]manifest.LayerStats, error) {
	ents, err := os.ReadDir(filepath.Join(b.opt.Out, manifest.PartialDir))
	if err != nil {
		return nil, err
	}
	var out []manifest.LayerStats
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "layer-") || !strings.HasSuffix(e.Name(), ".stats") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(b.opt.Out, manifest.PartialDir, e.Name()))
		if err != nil {
			return nil, err
		}
		var ls manifest.LayerStats
		if err := jsonx.Unmarshal(data, &ls); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out = append(out, ls)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Layer < out[j].Layer })
	return out, nil
}

func configBytes(fs []manifest.FileEntry) int64 {
	var n int64
	for _, f := range fs {
		n += f.Size
	}
	return n
}

// recordHolds reports whether a finished file of an earlier run can be
// kept: the record describes the same tensors and the file on disk has the
// recorded size and hash.
func (b *builder) recordHolds(ctx context.Context, j *job, r *fileRecord) bool {
	if r.File.Name != j.file || len(r.Tensors) != len(j.tensors) {
		return false
	}
	for _, t := range r.Tensors {
		if !t.Finite && !b.opt.AllowNonFinite {
			return false // produced again, and refused
		}
	}
	names := map[string]bool{}
	for _, t := range r.Tensors {
		names[t.Name] = true
	}
	for _, st := range j.tensors {
		if !names[st.name] {
			return false
		}
	}
	n, sum, err := manifest.HashFileContext(ctx, filepath.Join(b.opt.Out, j.file))
	return err == nil && n == r.File.Size && sum == r.File.SHA256
}

// layerStats aggregates the matrix statistics per layer. The float sums
// are taken in one fixed order, the manifest's (by tensor name), whatever
// order the matrices come in: a fresh build lists them in file order, a
// rerun in the order the finished manifest recorded them, and floating-point
// addition depends on the order.
func layerStats(ms []manifest.MatrixStats) []manifest.LayerStats {
	ms = append([]manifest.MatrixStats(nil), ms...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].Tensor < ms[j].Tensor })
	by := map[int]*manifest.LayerStats{}
	for _, s := range ms {
		if s.Layer == nil {
			continue
		}
		l := by[*s.Layer]
		if l == nil {
			l = &manifest.LayerStats{Layer: *s.Layer}
			by[*s.Layer] = l
		}
		l.Matrices++
		if s.Method == manifest.MethodGPTQ {
			l.GPTQ++
		}
		if s.Fallback != "" {
			l.Fallbacks++
		}
		l.ProxyLoss += s.ProxyLoss
		l.RTNProxyLoss += s.RTNProxyLoss
		if s.Expert != nil && strings.HasSuffix(s.Tensor, "gate_up_proj") {
			l.Tokens += s.Tokens
		}
	}
	var out []manifest.LayerStats
	for _, l := range by {
		out = append(out, *l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Layer < out[j].Layer })
	return out
}

// producer returns one stored tensor's bytes, its entry (without file
// position and hash) and, for quantized matrices with statistics, those.
type producer func(ctx context.Context, st *storedTensor) ([]byte, manifest.TensorEntry, *manifest.MatrixStats, error)

// writeJob produces one output file.
func (b *builder) writeJob(ctx context.Context, j *job) (*fileRecord, error) {
	return b.writeJobWith(ctx, j, b.produce)
}

// writeJobWith writes one output file with the given producer and records
// it in the bookkeeping directory.
func (b *builder) writeJobWith(ctx context.Context, j *job, produce producer) (*fileRecord, error) {
	header, offs, err := jobHeader(j)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(b.opt.Out, j.file)
	af, err := b.opt.Faults.Create(path)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			af.Abort()
		}
	}()
	if _, err := af.Write(header); err != nil {
		return nil, err
	}
	r := &fileRecord{}
	for i, st := range j.tensors {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		data, te, ms, err := produce(ctx, st)
		if err != nil {
			return nil, fmt.Errorf("tensor %s (shape %v): %w", st.name, st.shape, err)
		}
		if int64(len(data)) != st.outSize {
			panic(fmt.Sprintf("manifest: %s produced %d bytes, planned %d", st.name, len(data), st.outSize))
		}
		if _, err := af.Write(data); err != nil {
			return nil, err
		}
		te.File = j.file
		te.Offset = offs[i]
		te.Length = st.outSize
		te.SHA256 = manifest.SHA256Hex(data)
		r.Tensors = append(r.Tensors, te)
		if ms != nil {
			r.Matrices = append(r.Matrices, *ms)
		}
		if b.opt.testHook != nil {
			b.opt.testHook(j.file, st.name)
		}
	}
	n, sum, err := af.Commit()
	if err != nil {
		return nil, err
	}
	ok = true
	fe := manifest.FileEntry{Name: j.file, Role: j.role, Size: n, SHA256: sum}
	if j.layer >= 0 {
		fe.Layer = intPtr(j.layer)
	}
	r.File = fe
	return r, nil
}

// jobHeader returns the safetensors header of a job's file and its
// tensors' data offsets.
func jobHeader(j *job) ([]byte, []int64, error) {
	hts := make([]manifest.HeaderTensor, len(j.tensors))
	for i, st := range j.tensors {
		shape := st.shape
		if st.isBFP {
			shape = []int64{st.outSize}
		}
		hts[i] = manifest.HeaderTensor{Name: st.name, DType: st.outDType, Shape: shape, Size: st.outSize}
	}
	return manifest.EncodeSTHeader(hts, map[string]string{"format": "ttquant-native"})
}

// entryOf fills the descriptive fields of a tensor entry.
func entryOf(st *storedTensor) manifest.TensorEntry {
	te := manifest.TensorEntry{
		Name:        st.name,
		Sources:     st.sourceRefs(),
		Role:        st.role,
		Rule:        st.rule,
		Method:      st.method,
		Format:      st.format,
		SourceDType: st.srcDType,
		DType:       st.outDType,
		Shape:       st.shape,
	}
	if st.expert >= 0 {
		te.Expert = intPtr(st.expert)
	}
	if st.layer >= 0 {
		te.Layer = intPtr(st.layer)
	}
	if st.isBFP {
		te.PaddedShape = st.padded
		te.Orientation = st.orient
		te.Tile = st.tile.String()
	}
	return te
}

// produce returns the stored bytes of one tensor, its entry (without file
// position and hash) and, for GPTQ matrices, its statistics.
func (b *builder) produce(ctx context.Context, st *storedTensor) ([]byte, manifest.TensorEntry, *manifest.MatrixStats, error) {
	if b.seq != nil {
		// A sequential build decided its GPTQ'd dense tensors layer by
		// layer.
		p, err := b.seq.lookup(st)
		if err != nil {
			return nil, entryOf(st), nil, err
		}
		if p != nil {
			return p.data, p.te, p.ms, nil
		}
	}
	te := entryOf(st)
	raw, err := readSlice(st)
	if err != nil {
		return nil, te, nil, err
	}
	te.Finite = true
	if !st.isBFP && st.outDType == st.srcDType {
		if manifest.IsFloatDType(st.srcDType) {
			if te.Finite, err = manifest.FiniteFloats(st.srcDType, raw); err != nil {
				return nil, te, nil, err
			}
			if !te.Finite && !b.opt.AllowNonFinite {
				vals, err := manifest.DecodeFloats(st.srcDType, raw)
				if err != nil {
					return nil, te, nil, err
				}
				return nil, te, nil, nonFiniteError(st, vals)
			}
		}
		return raw, te, nil, nil
	}
	vals, err := manifest.DecodeFloats(st.srcDType, raw)
	if err != nil {
		return nil, te, nil, err
	}
	te.Finite = manifest.AllFinite(vals)
	if err := b.checkSourceFinite(st, vals, te.Finite); err != nil {
		return nil, te, nil, err
	}
	if !st.isBFP {
		return manifest.EncodeFloats(st.outDType, vals), te, nil, nil
	}
	if st.method != manifest.MethodGPTQ {
		packed, err := b.roundStored(ctx, st, vals)
		return packed, te, nil, err
	}
	return b.produceGPTQ(ctx, st, vals, te)
}

func (b *builder) produceGPTQ(ctx context.Context, st *storedTensor, w []float32, te manifest.TensorEntry) ([]byte, manifest.TensorEntry, *manifest.MatrixStats, error) {
	slices, rows, cols := manifest.MatDims(st.shape)
	ms := &manifest.MatrixStats{Tensor: st.name, Method: manifest.MethodGPTQ}
	if st.layer >= 0 {
		ms.Layer = intPtr(st.layer)
	}
	if st.expert >= 0 {
		ms.Expert = intPtr(st.expert)
	}
	var h []float64 // the Hessian, once known: it weights the rounding of a fallback
	rtn := func(reason *calib.FallbackError) ([]byte, manifest.TensorEntry, *manifest.MatrixStats, error) {
		var diag []float64
		if h != nil && b.rule == gptq.ExpSearch {
			diag = diagOf(h, cols)
		}
		packed, err := roundBFP(st.bfpF, st.tile, w, st.shape, st.orient, b.rule, diag)
		if err != nil {
			return nil, te, nil, err
		}
		q, err := manifest.UnpackBFP(st.bfpF, st.tile, packed, st.shape, st.orient)
		if err != nil {
			return nil, te, nil, err
		}
		te.Method = manifest.MethodRTN
		ms.Method = manifest.MethodRTN
		if reason != nil {
			ms.Fallback = reason.Error()
		}
		ms.Error = manifest.SquaredError(w, q)
		return packed, te, ms, nil
	}
	if slices != 1 {
		return rtn(calib.Fallback(calib.ErrNotMatrix, fmt.Sprintf("GPTQ needs a matrix; shape %v has %d slices", st.shape, slices), nil))
	}
	if b.hess == nil {
		return rtn(calib.Fallback(calib.ErrNoCalibration, "", nil))
	}
	hs, tokens, fallback, err := b.hess.Hessian(ctx, st.name, st.layer, st.expert, cols)
	if err != nil {
		return nil, te, nil, err
	}
	ms.Tokens = tokens
	if hs == nil {
		return rtn(fallback)
	}
	if len(hs) != cols*cols {
		return nil, te, nil, fmt.Errorf("Hessian has %d entries, want %d×%d", len(hs), cols, cols)
	}
	h = hs
	axis := bfp.AxisInput
	if st.axis == bfp.AxisOutput {
		axis = bfp.AxisOutput
	}
	res, asym, err := b.quantizeDense(ctx, st, w, rows, cols, h, gptq.NewBFPGrid(st.bfpF, axis))
	if errors.Is(err, gptq.ErrOptions) {
		return nil, te, nil, err // an invalid option is never a fallback
	}
	var be buildError
	if errors.As(err, &be) {
		return nil, te, nil, be.error
	}
	if err != nil {
		return rtn(calib.Fallback(calib.ErrGPTQFailed, "gptq", err))
	}
	packed, back, err := manifest.PackExact(st.bfpF, st.tile, res.Q, st.shape, st.orient)
	if err != nil {
		return nil, te, nil, fmt.Errorf("GPTQ: %w", err)
	}
	ms.Damp = res.Damp
	ms.ProxyLoss = res.ProxyLoss
	ms.RTNProxyLoss = res.RTNProxyLoss
	if asym {
		ms.Fit = manifest.FitAsymmetric
	}
	ms.Error = manifest.SquaredError(w, back)
	return packed, te, ms, nil
}

// quantizeDense runs GPTQ on a dense matrix with Hessian h: on w itself,
// or, in an asymmetric build with the matrix's source inputs at hand, on
// its fit to the source model's outputs (calib.AsymmetricTarget) with the
// same factorization.
//
// asym reports whether the fit was asymmetric: the build asks for it and
// the matrix has at least calib.AsymmetricMinRowsPerColumn calibration
// rows per input column.
func (b *builder) quantizeDense(ctx context.Context, st *storedTensor, w []float32, rows, cols int, h []float64, g gptq.Grid) (res *gptq.Result, asym bool, err error) {
	sh, ok := b.hess.(*storeHessians)
	if !b.opt.Asymmetric || !ok {
		res, err = gptq.Quantize(w, rows, cols, h, g, b.gopt)
		return res, false, err
	}
	src, n, err := sh.asymRows(ctx, st.name, st.layer, cols)
	if err != nil {
		return nil, false, buildError{err}
	}
	if src == nil {
		res, err = gptq.Quantize(w, rows, cols, h, g, b.gopt)
		return res, false, err
	}
	f, err := gptq.NewFactor(h, cols, b.gopt)
	if err != nil {
		return nil, false, err
	}
	defer f.Release()
	fit, err := calib.AsymmetricTarget(w, rows, cols, n, f, src)
	if err != nil {
		return nil, false, buildError{err}
	}
	fitted := fit != nil
	if !fitted {
		fit = w // its own fit
	}
	res, err = f.Quantize(fit, rows, g, b.gopt)
	return res, fitted && err == nil, err
}

// buildError marks an error of quantizeDense that must stop the build
// (reading inputs, shapes) rather than send the matrix to rounding.
type buildError struct{ error }

func (e buildError) Unwrap() error { return e.error }

// planInfo records a plan in the manifest.
// PlanSHA256 is the sha256 a build of plan p records in its manifest's
// plan section (over the name and the rules).
func PlanSHA256(p *plan.Plan) string { return planInfo(p).SHA256 }

func planInfo(p *plan.Plan) manifest.PlanInfo {
	pi := manifest.PlanInfo{Name: p.Name}
	for _, r := range p.Rules {
		pi.Rules = append(pi.Rules, manifest.RuleInfo{Pattern: r.Pattern, Format: r.Format, Method: r.Method, Axis: r.Axis, Tile: r.Tile})
	}
	pi.SHA256 = planSHA256(pi)
	return pi
}

// planSHA256 is the sha256 of the plan section's JSON with an empty sha256,
// over the rules as spelled: manifests written before the spellings were
// made canonical ("BFP4_B") still check.
func planSHA256(pi manifest.PlanInfo) string {
	type ruleText struct {
		Pattern string `json:"pattern"`
		Format  string `json:"format"`
		Method  string `json:"method"`
		Axis    string `json:"axis,omitempty"`
		Tile    string `json:"tile,omitempty"`
	}
	doc := struct {
		Name   string     `json:"name"`
		Rules  []ruleText `json:"rules"`
		SHA256 string     `json:"sha256"`
	}{Name: pi.Name}
	for _, r := range pi.Rules {
		doc.Rules = append(doc.Rules, ruleText{r.Pattern, string(r.Format), string(r.Method), string(r.Axis), r.Tile})
	}
	data, err := json.Marshal(doc)
	if err != nil {
		panic(err) // strings and slices of strings always encode
	}
	return manifest.SHA256Hex(data)
}

// copyConfigs copies the config and tokenizer files into the output
// directory.
func (b *builder) copyConfigs(configs []string, write bool) ([]manifest.FileEntry, error) {
	var files []manifest.FileEntry
	for _, c := range configs {
		data, err := os.ReadFile(c)
		if err != nil {
			return nil, err
		}
		name := filepath.Base(c)
		sum := manifest.SHA256Hex(data)
		if write {
			if sum, err = b.opt.Faults.WriteFile(filepath.Join(b.opt.Out, name), data); err != nil {
				return nil, err
			}
		}
		files = append(files, manifest.FileEntry{Name: name, Role: manifest.FileConfig, Size: int64(len(data)), SHA256: sum})
	}
	return files, nil
}

// manifestHead is everything of a manifest that is not a data file: what
// a build and the assembly of a split build (Assemble) both write.
type manifestHead struct {
	Tool        manifest.ToolInfo    `json:"tool"`
	Source      manifest.SourceInfo  `json:"source"`
	Plan        manifest.PlanInfo    `json:"plan"`
	Layout      manifest.LayoutInfo  `json:"layout"`
	Command     string               `json:"command"`
	Options     manifest.BuildParams `json:"options"`
	Calibration *manifest.CalibInfo  `json:"calibration,omitempty"`
	Parent      string               `json:"parent,omitempty"`
	Configs     []manifest.FileEntry `json:"configs"`
}

func (b *builder) head(si manifest.SourceInfo, configs []manifest.FileEntry) manifestHead {
	return manifestHead{
		Tool:        b.tool(),
		Source:      si,
		Plan:        planInfo(b.opt.Plan),
		Layout:      manifest.LayoutInfo{ExpertsPerFile: b.opt.ExpertsPerFile, DenseShardBytes: b.opt.DenseShardBytes, Alignment: manifest.FileAlignment},
		Command:     b.command(),
		Options:     b.params,
		Calibration: b.calib,
		Parent:      b.opt.Parent,
		Configs:     configs,
	}
}

// writeManifest assembles the manifest from the finished files, writes
// SHA256SUMS and then the manifest, last, and removes the bookkeeping of
// the unfinished build. It returns the manifest, its bytes, the checksum
// list and the data files' total size.
func (b *builder) writeManifest(ctx context.Context, si manifest.SourceInfo, results []*fileRecord, layerOut []manifest.LayerStats, files []manifest.FileEntry) (*manifest.Manifest, []byte, []byte, int64, error) {
	return writeManifest(ctx, b.opt.Faults, b.opt.Out, b.head(si, files), results, layerOut)
}

// writeManifest writes the manifest of out from its head, the records of
// its data files in layout order and the GPTQ layers' statistics.
func writeManifest(ctx context.Context, faults atomicfile.Faults, out string, h manifestHead, results []*fileRecord, layerOut []manifest.LayerStats) (*manifest.Manifest, []byte, []byte, int64, error) {
	m := &manifest.Manifest{
		FormatVersion: manifest.FormatVersion,
		Format:        manifest.FormatName,
		Tool:          h.Tool,
		Source:        h.Source,
		Plan:          h.Plan,
		Layout:        h.Layout,
		TTQuant: manifest.TTQuantSection{
			Command:     h.Command,
			Options:     h.Options,
			Calibration: h.Calibration,
			Parent:      h.Parent,
		},
	}
	var dataBytes int64
	for _, r := range results {
		m.Files = append(m.Files, r.File)
		m.Tensors = append(m.Tensors, r.Tensors...)
		m.TTQuant.Matrices = append(m.TTQuant.Matrices, r.Matrices...)
		dataBytes += r.File.Size
	}
	m.TTQuant.Layers = mergeLayerStats(layerStats(m.TTQuant.Matrices), layerOut)
	for _, t := range m.Tensors {
		if !t.Finite {
			m.TTQuant.NonFinite = append(m.TTQuant.NonFinite, t.Name)
		}
	}
	sort.Strings(m.TTQuant.NonFinite)
	m.Files = append(m.Files, h.Configs...)
	if err := ctx.Err(); err != nil {
		return nil, nil, nil, 0, err
	}
	sums := manifest.EncodeSums(m.Files)
	sumsHash, err := faults.WriteFile(filepath.Join(out, manifest.SumsName), sums)
	if err != nil {
		return nil, nil, nil, 0, err
	}
	m.Files = append(m.Files, manifest.FileEntry{Name: manifest.SumsName, Role: manifest.FileChecksum, Size: int64(len(sums)), SHA256: sumsHash})
	data, err := m.Encode()
	if err != nil {
		return nil, nil, nil, 0, err
	}
	if _, err := faults.WriteFile(filepath.Join(out, manifest.ManifestName), data); err != nil {
		return nil, nil, nil, 0, err
	}
	atomicfile.SyncDir(out)
	if err := os.RemoveAll(filepath.Join(out, manifest.PartialDir)); err != nil {
		return nil, nil, nil, 0, err
	}
	return m, data, sums, dataBytes, nil
}
