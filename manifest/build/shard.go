package build

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/jsonx"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/par"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/manifest"
)

// A split build (BuildOptions.Shard) divides a build's output files into
// units, assigns the units to workers with shard.Partition from their
// estimated cost, and has each worker write only its units' files and a
// record of them (a shard record); Assemble checks the records and writes
// the manifest. A unit is the output of one piece of work that needs
// nothing from another unit:
//
//   - the expert files of one expert group of a layer whose routed experts
//     GPTQ quantizes (gate_up and down together: a down projection's
//     Hessian comes from its expert's quantized gate and up), or of k
//     consecutive groups while there would be more than 8 units a worker
//     (shardUnits). With held-out
//     statistics the whole layer is one unit, since its held-out block
//     error sums every expert's output;
//   - the tensors of one layer in one dense shard, and every tensor of a
//     dense shard outside the layers on its own: a dense shard holds a
//     little of every layer (its GPTQ'd shared experts and attention), too
//     much for one unit. The worker writes each such tensor's bytes as a
//     part in the bookkeeping directory, and Assemble writes the dense
//     shard from its header and its parts, verified;
//   - every other output file on its own (expert files rounded to
//     nearest).
//
// The costs are the dry run's kernel-time estimators (package kernels) at
// the fixed rates of kernels.NominalReport, plus the bytes read at a fixed
// rate, so that every worker computes the same partition on any machine.

// nominalBytesPerSecond is the rate at which the cost model reads and
// rounds a tensor: convert is bound by it, GPTQ by the solver.
const nominalBytesPerSecond = 1e9

// assumedCalibTokens is the number of calibration tokens the cost model
// assumes behind a dense matrix's Hessian; the partition must not depend on
// the calibration data (the dry run does not read it).
const assumedCalibTokens = 1 << 18

// shardUnit is one unit of a split build.
type shardUnit struct {
	name    string
	jobs    []int // indices into builder.jobs, ascending
	layer   int   // the MoE layer whose GPTQ driver produces it (-1: none)
	experts []int // the routed experts it holds (layer >= 0)
	// parts, for a unit of a dense shard's tensors (jobs holds the one
	// shard), are its tensors.
	parts []*storedTensor
	cost  float64
	mem   int64 // estimated peak bytes (unitMemory)
}

// unitTensors returns the tensors a unit produces.
func (b *builder) unitTensors(u *shardUnit) []*storedTensor {
	if u.parts != nil {
		return u.parts
	}
	var ts []*storedTensor
	for _, i := range u.jobs {
		ts = append(ts, b.jobs[i].tensors...)
	}
	return ts
}

// unitRef is a unit as a shard record lists it.
type unitRef struct {
	Name    string   `json:"name"`
	Files   []string `json:"files"`
	Tensors []string `json:"tensors,omitempty"` // a dense shard's unit
	Worker  int      `json:"worker"`
}

// splitFile is a dense shard of a split build, which Assemble writes from
// its parts: its name, role and layer, its header, and its tensors in
// order.
type splitFile struct {
	Name    string   `json:"name"`
	Role    string   `json:"role"`
	Layer   *int     `json:"layer,omitempty"`
	Header  []byte   `json:"header"`
	Tensors []string `json:"tensors"`
	Offsets []int64  `json:"offsets"`
}

// partRecord is one finished tensor of a dense shard: its entry (without
// the file position) and statistics, and the size and sha256 of its part
// file.
type partRecord struct {
	Tensor string                `json:"tensor"`
	Entry  manifest.TensorEntry  `json:"entry"`
	Matrix *manifest.MatrixStats `json:"matrix,omitempty"`
	Size   int64                 `json:"size"`
	SHA256 string                `json:"sha256"`
}

func partPath(out, tensor string) string {
	return filepath.Join(out, manifest.PartialDir, "parts", tensor)
}

// shardRecord is what one worker of a split build leaves in the
// bookkeeping directory: written when it starts (Done false, so that the
// others see which build the directory holds) and again when its units are
// finished.
type shardRecord struct {
	Build fingerprint `json:"build"`
	Shard string      `json:"shard"`
	Index int         `json:"index"`
	Count int         `json:"count"`
	Done  bool        `json:"done"`
	// Head is the manifest's head as this worker computed it.
	Head *manifestHead `json:"head,omitempty"`
	// Planned lists every unit of the build and its worker, in layout
	// order; Files every data file in layout order.
	Planned []unitRef `json:"planned,omitempty"`
	Files   []string  `json:"files,omitempty"`
	// Records are this worker's finished files; Layers its part of the
	// GPTQ layers' statistics (the starved experts among its experts).
	Records []*fileRecord         `json:"records,omitempty"`
	Layers  []manifest.LayerStats `json:"layers,omitempty"`
	// Split lists the dense shards Assemble writes from parts (the same in
	// every record); Parts are this worker's.
	Split []splitFile   `json:"split,omitempty"`
	Parts []*partRecord `json:"parts,omitempty"`
}

func shardRecordName(s shard.Spec) string {
	return s.FileName("shard", ".json")
}

func shardLockName(s shard.Spec) string {
	return s.FileName("shard", ".lock")
}

// sharded reports whether the build is one worker of a split build.
func (b *builder) sharded() bool { return b.opt.Shard.Count > 1 }

// shardUnits groups the build's files into units and estimates their cost.
func (b *builder) shardUnits() []shardUnit {
	var units []shardUnit
	// Expert groups of a layer are merged, per consecutive groups a unit,
	// while there are more than 8 units a worker: a worker loads the
	// calibration inputs of every layer it has experts in, and fewer,
	// larger units spread it over fewer layers.
	groups := map[int]int{}
	total := 0
	for _, j := range b.jobs {
		if j.role == manifest.FileExperts && b.gptqLayers[j.layer] && j.group >= groups[j.layer] {
			total += j.group + 1 - groups[j.layer]
			groups[j.layer] = j.group + 1
		}
	}
	per := max(1, total/(8*max(1, b.opt.Shard.Count))) // expert groups a unit
	byKey := map[[2]int]int{}
	for i, j := range b.jobs {
		if j.role == manifest.FileExperts && b.gptqLayers[j.layer] {
			key := [2]int{j.layer, j.group / per}
			name := fmt.Sprintf("layer %d expert group %d", j.layer, j.group)
			if lo, hi := key[1]*per, min(key[1]*per+per, groups[j.layer])-1; hi > lo {
				name = fmt.Sprintf("layer %d expert groups %d–%d", j.layer, lo, hi)
			}
			if b.opt.HeldOutSequences > 0 {
				key[1] = -1
				name = fmt.Sprintf("layer %d routed experts", j.layer)
			}
			ui, ok := byKey[key]
			if !ok {
				ui = len(units)
				byKey[key] = ui
				units = append(units, shardUnit{name: name, layer: j.layer})
			}
			u := &units[ui]
			u.jobs = append(u.jobs, i)
			for _, st := range j.tensors {
				if model.Role(st.role) == model.RoleExpertGateUp {
					u.experts = append(u.experts, st.expert)
				}
			}
			continue
		}
		if j.role == manifest.FileDense {
			byLayer := map[int]int{}
			for _, st := range j.tensors {
				if k, ok := byLayer[st.layer]; ok && st.layer >= 0 {
					units[k].parts = append(units[k].parts, st)
					continue
				}
				name := fmt.Sprintf("dense shard %s tensor %s", j.file, st.name)
				if st.layer >= 0 {
					name = fmt.Sprintf("dense shard %s layer %d", j.file, st.layer)
					byLayer[st.layer] = len(units)
				}
				units = append(units, shardUnit{name: name, jobs: []int{i}, layer: -1, parts: []*storedTensor{st}})
			}
			continue
		}
		units = append(units, shardUnit{name: "file " + j.file, jobs: []int{i}, layer: -1})
	}
	for k := range units {
		slices.Sort(units[k].experts)
		units[k].cost = b.unitCost(&units[k])
		units[k].mem = b.unitMemory(&units[k])
	}
	return units
}

// The memory model of a unit, from the peak resident sets measured in
// docs/projections.md ("Peak memory of a layer step", a GPTQ layer step at
// hidden 2,048 and expert width 512): a fixed part (the runtime, the
// layer's weights, routing and scratch) and a part per routed row of each
// expert in flight (its gathered input rows, intermediates and Hessian
// accumulation).
const (
	memFixedBytes   = 642 << 20
	memRowBytes     = 22835 // 22.3 KiB per row at hidden 2,048
	memMeasuredCols = 2048
)

// unitMemory estimates the peak bytes a worker holds while it produces
// unit u, at the cost model's assumedCalibTokens calibration tokens and
// BuildOptions.Workers experts (or files) in flight:
//
//   - an expert group of a MoE layer: the layer's MoE-input rows from the
//     store (tokens × hidden float32), the fixed part, and per expert in
//     flight its routed rows (tokens × top-k ÷ experts) at the measured
//     bytes per row, scaled by hidden ÷ 2,048;
//   - a dense unit with GPTQ matrices: the fixed part and, for its largest
//     matrix, the site's rows (tokens × cols float32), its float64
//     Hessian and the float32 weight; a down projection's input is
//     computed from the gate and up outputs (two more tokens × cols);
//   - a unit that rounds: each tensor in flight as float32 in and its
//     encoded copy out (at most 2 × 4 bytes an element).
//
// It is an estimate for sizing nodes, comparable between units, not a
// bound: the Go runtime's heap target (GOGC) adds to it.
func (b *builder) unitMemory(u *shardUnit) int64 {
	T := int64(assumedCalibTokens)
	inflight := int64(max(1, b.opt.Workers))
	ts := b.unitTensors(u)
	if u.layer >= 0 && b.modelCfg != nil {
		moe := b.modelCfg.MoE()
		if moe.Experts > 0 && len(u.experts) > 0 {
			rows := T * int64(moe.TopK) / int64(moe.Experts)
			perRow := int64(memRowBytes) * int64(moe.Hidden) / memMeasuredCols
			return T*int64(moe.Hidden)*4 + memFixedBytes + min(inflight, int64(len(u.experts)))*rows*perRow
		}
	}
	var gptqMax, rtn []int64
	for _, st := range ts {
		elems := int64(1)
		for _, d := range st.shape {
			elems *= d
		}
		if st.method == manifest.MethodGPTQ && len(st.shape) == 2 {
			_, r, c := manifest.MatDims(st.shape)
			rows, cols := int64(r), int64(c)
			m := T*cols*4 + cols*cols*8 + rows*cols*4
			if r := model.Role(st.role); r == model.RoleSharedDown || r == model.RoleMLPDown {
				m += 2 * T * cols * 4
			}
			gptqMax = append(gptqMax, m)
			continue
		}
		rtn = append(rtn, 8*elems)
	}
	var m int64
	if len(gptqMax) > 0 {
		m = memFixedBytes + slices.Max(gptqMax)
	}
	// The largest tensors in flight at once.
	slices.Sort(rtn)
	slices.Reverse(rtn)
	var r int64
	for _, x := range rtn[:min(len(rtn), int(inflight))] {
		r += x
	}
	return max(m, r)
}

// unitCost is the estimated seconds of one unit.
func (b *builder) unitCost(u *shardUnit) float64 {
	rep := kernels.NominalReport()
	var c float64
	var gu *storedTensor
	for _, st := range b.unitTensors(u) {
		c += float64(st.srcLen) / nominalBytesPerSecond
		if model.Role(st.role) == model.RoleExpertGateUp && gu == nil {
			gu = st
		}
		if u.layer < 0 && st.method == manifest.MethodGPTQ && len(st.shape) == 2 && b.gopt.BlockSize > 0 {
			_, rows, cols := manifest.MatDims(st.shape)
			c += rep.HessianSeconds(assumedCalibTokens, cols) + rep.GPTQSolveSeconds(rows, cols, b.gopt.BlockSize)
		}
	}
	if u.layer >= 0 && gu != nil && len(gu.shape) == 2 && b.modelCfg != nil && b.modelCfg.MoE().Experts > 0 && b.gopt.BlockSize > 0 {
		w := kernels.DefaultMoEWorkload()
		all := int64(b.modelCfg.MoE().Experts)
		w.Layers, w.ExpertsPerLayer = 1, len(u.experts)
		w.Hidden, w.ExpertWidth = int(gu.shape[1]), int(gu.shape[0]/2)
		w.RoutedRowsPerLayer = w.RoutedRowsPerLayer * int64(len(u.experts)) / all
		w.BlockSize = b.gopt.BlockSize
		c += rep.EstimateMoE(w).TotalSeconds
	}
	return c
}

// ShardWork is the partition of a split build (dry runs and workers with
// BuildOptions.Shard): the estimated seconds (kernel time at the nominal
// rates of kernels.NominalReport plus reading at 1 GB/s; comparable
// between workers, not a prediction of wall time) of every worker.
type ShardWork struct {
	Workers     int       `json:"workers"`
	Units       int       `json:"units"`
	Worker      int       `json:"worker"`
	WorkerUnits int       `json:"worker_units"`
	Loads       []float64 `json:"estimated_seconds"`
	MaxSeconds  float64   `json:"max_seconds"`
	MeanSeconds float64   `json:"mean_seconds"`
	// MaxUnitSeconds is the largest unit: no partition does better than
	// it.
	MaxUnitSeconds float64 `json:"max_unit_seconds"`
	// WorkerMoELayers is the number of MoE layers whose calibration
	// inputs this worker loads (one process loads every layer's).
	WorkerMoELayers int `json:"worker_moe_layers"`
	// WorkerBytes is the estimated peak memory of this worker: its
	// largest unit's (the units run one after another; see unitMemory),
	// WorkerBytesUnit that unit; MaxWorkerBytes is the largest over all
	// workers, what every node of the split must have. The estimate
	// assumes 128 × 2,048 calibration tokens and BuildOptions.Workers
	// experts or files in flight.
	WorkerBytes     int64  `json:"worker_bytes"`
	WorkerBytesUnit string `json:"worker_bytes_unit,omitempty"`
	MaxWorkerBytes  int64  `json:"max_worker_bytes"`
}

// partition assigns the units to the workers of opt.Shard.
func (b *builder) partition() ([]shardUnit, [][]int, *ShardWork, error) {
	units := b.shardUnits()
	costs := make([]float64, len(units))
	for k, u := range units {
		costs[k] = u.cost
	}
	n := b.opt.Shard.Count
	asg, err := shard.Partition(costs, n)
	if err != nil {
		return nil, nil, nil, err
	}
	loads := shard.Loads(costs, asg)
	sw := &ShardWork{Workers: n, Units: len(units), Worker: b.opt.Shard.Index, WorkerUnits: len(asg[b.opt.Shard.Index]), Loads: loads}
	var sum float64
	for _, l := range loads {
		sum += l
		sw.MaxSeconds = max(sw.MaxSeconds, l)
	}
	sw.MeanSeconds = sum / float64(n)
	for _, c := range costs {
		sw.MaxUnitSeconds = max(sw.MaxUnitSeconds, c)
	}
	layers := map[int]bool{}
	for _, k := range asg[b.opt.Shard.Index] {
		if units[k].layer >= 0 {
			layers[units[k].layer] = true
		}
		if units[k].mem > sw.WorkerBytes {
			sw.WorkerBytes, sw.WorkerBytesUnit = units[k].mem, units[k].name
		}
	}
	sw.WorkerMoELayers = len(layers)
	for _, u := range units {
		sw.MaxWorkerBytes = max(sw.MaxWorkerBytes, u.mem)
	}
	return units, asg, sw, nil
}

// assignShard works out this worker's jobs and, per GPTQ layer, its
// routed experts (nil when it has all of them).
func (b *builder) assignShard() error {
	units, asg, sw, err := b.partition()
	if err != nil {
		return err
	}
	b.shardWork = sw
	owner := make([]int, len(units))
	for w, us := range asg {
		for _, k := range us {
			owner[k] = w
		}
	}
	b.units, b.unitOwner = units, owner
	b.owned = map[int]bool{}
	b.layerExperts = map[int][]int{}
	for _, k := range asg[b.opt.Shard.Index] {
		u := units[k]
		if u.parts != nil {
			b.ownedParts = append(b.ownedParts, u.parts...)
			continue
		}
		for _, i := range u.jobs {
			b.owned[i] = true
		}
		if u.layer >= 0 {
			b.layerExperts[u.layer] = append(b.layerExperts[u.layer], u.experts...)
		}
	}
	for l, ex := range b.layerExperts {
		slices.Sort(ex)
		if len(ex) == b.modelCfg.MoE().Experts {
			b.layerExperts[l] = nil
		}
	}
	return nil
}

// owns reports whether this process produces job i.
func (b *builder) owns(i int) bool { return !b.sharded() || b.owned[i] }

// expertSubset returns the routed experts of layer this process quantizes
// (nil: all of them).
func (b *builder) expertSubset(layer int) []int {
	if !b.sharded() {
		return nil
	}
	return b.layerExperts[layer]
}

// layerRecord is where the statistics of a finished GPTQ layer are kept
// for a resumed run; each worker of a split build keeps its own part.
func (b *builder) layerRecord(layer int) string {
	if !b.sharded() {
		return layerRecordPath(b.opt.Out, layer)
	}
	return filepath.Join(b.opt.Out, manifest.PartialDir, fmt.Sprintf("layer-%03d.%s.stats", layer, strings.TrimSuffix(shardRecordName(b.opt.Shard), ".json")))
}

// shardLock takes this worker's lock in the bookkeeping directory: workers
// of different indices run at once, two of the same index do not.
func shardLock(out string, s shard.Spec) (*fslock.Lock, error) {
	return fslock.AcquireNamed(filepath.Join(out, manifest.PartialDir), shardLockName(s))
}

// readShardRecords reads every shard record of dir's bookkeeping, by
// index; a damaged record is an error naming it.
func readShardRecords(dir string) ([]*shardRecord, error) {
	pdir := filepath.Join(dir, manifest.PartialDir)
	ents, err := os.ReadDir(pdir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*shardRecord
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "shard-") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(pdir, e.Name())
		var r shardRecord
		if err := jsonx.ReadFile(p, &r); err != nil {
			return nil, err
		}
		if s := (shard.Spec{Index: r.Index, Count: r.Count}); !s.Valid() || shardRecordName(s) != e.Name() {
			return nil, fmt.Errorf("%s: the record names worker %d/%d", p, r.Index, r.Count)
		}
		out = append(out, &r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// prepareShard is prepareDir for a worker of a split build, with the same
// checks of a finished or unfinished build (existingManifest,
// checkBuildRecord, checkOnly): the directory may also hold the other
// workers' files and records, all of the same build and the same split;
// this worker removes only its own leftovers. finished
// reports a directory that already holds the assembled checkpoint (nothing
// to do).
func (b *builder) prepareShard(fp fingerprint) (recs map[string]*fileRecord, finished bool, err error) {
	out := b.opt.Out
	spec := b.opt.Shard
	pdir := filepath.Join(out, manifest.PartialDir)
	if old, err := b.existingManifest(fp); err != nil || old != nil {
		return nil, old != nil, err
	}
	started, err := b.checkBuildRecord(fp)
	if err != nil {
		return nil, false, err
	}
	others, err := readShardRecords(out)
	if err != nil {
		return nil, false, err
	}
	for _, r := range others {
		if r.Count != spec.Count {
			return nil, false, fmt.Errorf("%w: %s holds worker %d/%d of a split into %d workers; this is worker %s (use the same count, or another directory)", ErrResumeMismatch, out, r.Index, r.Count, r.Count, spec)
		}
		if d := diffFingerprints(r.Build, fp); len(d) > 0 {
			return nil, false, fmt.Errorf("%w: worker %d/%d in %s builds with a different %s", ErrResumeMismatch, r.Index, r.Count, out, strings.Join(d, ", "))
		}
		started = true
	}
	if !started {
		// Only what the workers of this build write may be there already.
		ours := map[string]bool{manifest.PartialDir: true, fslock.Name: true}
		for _, j := range b.jobs {
			ours[j.file] = true
		}
		for _, c := range b.srcConfigs {
			ours[filepath.Base(c)] = true
		}
		ents, err := os.ReadDir(out)
		if err != nil {
			return nil, false, err
		}
		if err := checkOnly(out, ents, ours); err != nil {
			return nil, false, err
		}
	}
	recs = map[string]*fileRecord{}
	for i, j := range b.jobs {
		if !b.owned[i] {
			continue
		}
		var r fileRecord
		if jsonx.ReadFile(recordPath(out, j.file), &r) == nil && r.File.Name == j.file {
			recs[j.file] = &r
		}
	}
	// The last check: a refused worker leaves the directory as it was.
	if err := b.checkDisk(recs); err != nil {
		return nil, false, err
	}
	// Leftovers of this worker's interrupted writes.
	rec := filepath.Join(pdir, shardRecordName(spec))
	os.Remove(rec + manifest.PartialSuffix)
	for i, j := range b.jobs {
		if b.owned[i] {
			os.Remove(filepath.Join(out, j.file) + manifest.PartialSuffix)
			os.Remove(recordPath(out, j.file) + manifest.PartialSuffix)
		}
	}
	for l := range b.layerExperts {
		os.Remove(b.layerRecord(l) + manifest.PartialSuffix)
	}
	for _, st := range b.ownedParts {
		os.Remove(partPath(out, st.name) + manifest.PartialSuffix)
		os.Remove(partPath(out, st.name) + ".json" + manifest.PartialSuffix)
	}
	if err := b.opt.Faults.WriteJSON(rec, shardRecord{Build: fp, Shard: spec.String(), Index: spec.Index, Count: spec.Count}); err != nil {
		return nil, false, err
	}
	return recs, false, nil
}

// writeParts produces this worker's tensors of dense shards as part files
// (keeping those an earlier run finished, when their hashes check) and
// returns their records.
func (b *builder) writeParts(ctx context.Context) ([]*partRecord, error) {
	recs := make([]*partRecord, len(b.ownedParts))
	err := par.For(ctx, len(b.ownedParts), b.opt.Workers, func(k int) error {
		st := b.ownedParts[k]
		p := partPath(b.opt.Out, st.name)
		if r := (partRecord{}); jsonx.ReadFile(p+".json", &r) == nil {
			if r.Tensor == st.name && (r.Entry.Finite || b.opt.AllowNonFinite) {
				if n, sum, err := manifest.HashFileContext(ctx, p); err == nil && n == r.Size && sum == r.SHA256 {
					recs[k] = &r
					return nil
				}
			}
		}
		data, te, ms, err := b.produce(ctx, st)
		if err != nil {
			return fmt.Errorf("tensor %s (shape %v): %w", st.name, st.shape, err)
		}
		if int64(len(data)) != st.outSize {
			return fmt.Errorf("tensor %s produced %d bytes, planned %d", st.name, len(data), st.outSize)
		}
		sum, err := atomicfile.WriteFile(p, data)
		if err != nil {
			return err
		}
		r := &partRecord{Tensor: st.name, Entry: te, Matrix: ms, Size: int64(len(data)), SHA256: sum}
		if err := b.opt.Faults.WriteJSON(p+".json", r); err != nil {
			return err
		}
		recs[k] = r
		return nil
	})
	return recs, err
}

// finishShard writes this worker's final record.
func (b *builder) finishShard(fp fingerprint, head manifestHead, results []*fileRecord, parts []*partRecord, layers []manifest.LayerStats) error {
	spec := b.opt.Shard
	r := shardRecord{Build: fp, Shard: spec.String(), Index: spec.Index, Count: spec.Count, Done: true, Head: &head, Layers: layers}
	for k, u := range b.units {
		ref := unitRef{Name: u.name, Worker: b.unitOwner[k]}
		for _, i := range u.jobs {
			ref.Files = append(ref.Files, b.jobs[i].file)
		}
		for _, st := range u.parts {
			ref.Tensors = append(ref.Tensors, st.name)
		}
		r.Planned = append(r.Planned, ref)
	}
	for i, j := range b.jobs {
		r.Files = append(r.Files, j.file)
		if b.owned[i] {
			r.Records = append(r.Records, results[i])
		}
		if j.role == manifest.FileDense {
			header, offs, err := jobHeader(j)
			if err != nil {
				return err
			}
			sf := splitFile{Name: j.file, Role: j.role, Header: header, Offsets: offs}
			if j.layer >= 0 {
				sf.Layer = intPtr(j.layer)
			}
			for _, st := range j.tensors {
				sf.Tensors = append(sf.Tensors, st.name)
			}
			r.Split = append(r.Split, sf)
		}
	}
	r.Parts = parts
	return b.opt.Faults.WriteJSON(filepath.Join(b.opt.Out, manifest.PartialDir, shardRecordName(spec)), r)
}

// ErrAssemble is wrapped by every refusal of Assemble: a worker missing or
// unfinished, a unit missing, duplicated, damaged or from another build
// (shard.ErrAssemble, which the calibration store's assembly wraps too).
var ErrAssemble = shard.ErrAssemble

// AssembleOptions configure Assemble.
type AssembleOptions struct {
	// Dir is the output directory the workers of a split build wrote.
	Dir string
	// Workers is the number of files hashed at once (default 1).
	Workers int
}

// Validate reports an option out of range.
func (o AssembleOptions) Validate() error {
	switch {
	case o.Dir == "":
		return errors.New("build: no directory given")
	case o.Workers < 0:
		return fmt.Errorf("build: workers %d: want at least 1 (0 for the default)", o.Workers)
	}
	return nil
}

// Assemble finishes a split build: it checks that every worker of the
// split finished, that their records agree on the build (command, tool,
// source, plan, options, calibration data, parent), that every unit was
// produced exactly once and that every file has the size and sha256 its
// worker recorded; then it writes SHA256SUMS and the manifest, the same
// bytes a single process writes for the same build, and removes the
// bookkeeping. A refusal names the worker, unit or file and writes nothing.
// A directory that holds an assembled checkpoint and no records is left as
// it is (AlreadyComplete).
func Assemble(ctx context.Context, opt AssembleOptions) (*BuildResult, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if opt.Workers == 0 {
		opt.Workers = 1
	}
	dir := opt.Dir
	lk, err := fslock.AcquireExisting(dir)
	if err != nil {
		return nil, err
	}
	defer lk.Release()
	recs, err := readShardRecords(dir)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		if data, err := os.ReadFile(filepath.Join(dir, manifest.ManifestName)); err == nil {
			m, err := manifest.DecodeManifest(data)
			if err != nil {
				return nil, err
			}
			id := manifest.Identity(data)
			return &BuildResult{Dir: dir, Identity: id, CacheKey: manifest.CacheKey(id), Files: len(m.Files) + 1, Tensors: len(m.Tensors), AlreadyComplete: true, Manifest: m}, nil
		}
	}
	ws := make([]shard.Worker, len(recs))
	for i, r := range recs {
		ws[i] = shard.Worker{Index: r.Index, Count: r.Count, Done: r.Done && r.Head != nil}
	}
	n, release, err := shard.CheckWorkers(ws, filepath.Join(dir, manifest.PartialDir), shard.FileLocks(filepath.Join(dir, manifest.PartialDir), shardLockName))
	defer release()
	if err != nil {
		return nil, err
	}
	byIndex, err := agreeingWorkers(dir, recs, n)
	if err != nil {
		return nil, err
	}
	first := byIndex[0]
	g, err := gatherUnits(first, byIndex, n)
	if err != nil {
		return nil, err
	}
	unitOf, havePart := g.unitOf, g.havePart
	results, check, err := g.expected(dir, first, n)
	if err != nil {
		return nil, err
	}
	if err := verifyFiles(ctx, dir, check, unitOf, opt.Workers); err != nil {
		return nil, err
	}
	// Every check has passed: the dense shards are written from their
	// parts, then the manifest.
	fileIndex := map[string]int{}
	for k, f := range first.Files {
		fileIndex[f] = k
	}
	for _, sf := range first.Split {
		r, err := writeSplitFile(dir, sf, havePart)
		if err != nil {
			return nil, err
		}
		results[fileIndex[sf.Name]] = r
	}
	var parts []manifest.LayerStats
	for i := 0; i < n; i++ {
		parts = append(parts, byIndex[i].Layers...)
	}
	m, data, sums, dataBytes, err := writeManifest(ctx, nil, dir, *first.Head, results, joinLayerParts(parts))
	if err != nil {
		return nil, err
	}
	id := manifest.Identity(data)
	return &BuildResult{
		Dir: dir, Identity: id, CacheKey: manifest.CacheKey(id),
		Files: len(m.Files) + 1, Tensors: len(m.Tensors),
		Bytes:    dataBytes + int64(len(sums)) + int64(len(data)) + configBytes(first.Head.Configs),
		Manifest: m, NonFinite: m.TTQuant.NonFinite,
	}, nil
}

// ErrUnitDamaged is wrapped by Assemble's refusal of a file whose size or
// sha256 is not the one its worker recorded (shard.ErrUnitDamaged).
var ErrUnitDamaged = shard.ErrUnitDamaged

// verifyFiles hashes every file of want (data, config and part files)
// against its record (shard.Verify).
func verifyFiles(ctx context.Context, dir string, want []manifest.FileEntry, unitOf map[string]unitRef, workers int) error {
	files := make([]shard.Expected, len(want))
	for k, f := range want {
		what := "config file " + f.Name
		if u, ok := unitOf[f.Name]; ok {
			what = fmt.Sprintf("unit %s: file %s", u.Name, f.Name)
		}
		files[k] = shard.Expected{What: what, Path: filepath.Join(dir, f.Name), Size: f.Size, SHA256: f.SHA256}
	}
	return shard.Verify(ctx, files, workers, manifest.HashFileContext)
}

// writeSplitFile writes a dense shard of a split build from its header and
// its tensors' parts, and returns its record, the one the single process
// writes.
func writeSplitFile(dir string, sf splitFile, parts map[string]*partRecord) (*fileRecord, error) {
	if len(sf.Offsets) != len(sf.Tensors) {
		return nil, fmt.Errorf("%w: dense shard %s: %d offsets for %d tensors", ErrAssemble, sf.Name, len(sf.Offsets), len(sf.Tensors))
	}
	af, err := atomicfile.Create(filepath.Join(dir, sf.Name))
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			af.Abort()
		}
	}()
	if _, err := af.Write(sf.Header); err != nil {
		return nil, err
	}
	r := &fileRecord{}
	for i, tn := range sf.Tensors {
		pr := parts[tn]
		data, err := os.ReadFile(partPath(dir, tn))
		if err != nil {
			return nil, err
		}
		// verifyFiles hashed the part a moment ago, with every worker's
		// lock held; its length still guards the offsets.
		if int64(len(data)) != pr.Size {
			return nil, fmt.Errorf("%w: the part of tensor %s changed while assembling", ErrAssemble, tn)
		}
		if _, err := af.Write(data); err != nil {
			return nil, err
		}
		te := pr.Entry
		te.File, te.Offset, te.Length, te.SHA256 = sf.Name, sf.Offsets[i], pr.Size, pr.SHA256
		r.Tensors = append(r.Tensors, te)
		if pr.Matrix != nil {
			r.Matrices = append(r.Matrices, *pr.Matrix)
		}
	}
	n, sum, err := af.Commit()
	if err != nil {
		return nil, err
	}
	ok = true
	r.File = manifest.FileEntry{Name: sf.Name, Role: sf.Role, Size: n, SHA256: sum, Layer: sf.Layer}
	return r, nil
}

// joinLayerParts merges the workers' parts of the GPTQ layers' statistics:
// the calibration tokens and held-out figures are the same in every part
// that has them (a layer with held-out statistics is one worker's), the
// starved experts are the union, ascending as one process lists them.
func joinLayerParts(parts []manifest.LayerStats) []manifest.LayerStats {
	by := map[int]*manifest.LayerStats{}
	var out []manifest.LayerStats
	for _, p := range parts {
		l := by[p.Layer]
		if l == nil {
			c := p
			c.Starved = append([]int(nil), p.Starved...)
			by[p.Layer] = &c
			continue
		}
		l.Starved = append(l.Starved, p.Starved...)
		if p.HeldOutTokens > 0 {
			s := l.Starved
			*l = p
			l.Starved = s
		}
	}
	for _, l := range by {
		sort.Ints(l.Starved)
		if len(l.Starved) == 0 {
			l.Starved = nil
		}
		out = append(out, *l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Layer < out[j].Layer })
	return out
}

// agreeingWorkers indexes the records of a split into n by worker (every
// worker's finished record is there: shard.CheckWorkers) and checks that
// every worker built the same thing as worker 0 (tool, source, plan,
// options, data, partition).
func agreeingWorkers(dir string, recs []*shardRecord, n int) (map[int]*shardRecord, error) {
	byIndex := map[int]*shardRecord{}
	for _, r := range recs {
		byIndex[r.Index] = r
	}
	first := byIndex[0]
	for i := 1; i < n; i++ {
		r := byIndex[i]
		d := diffFingerprints(first.Build, r.Build)
		if first.Build.Tool != r.Build.Tool {
			d = append(d, fmt.Sprintf("tool (%s %s, now %s %s)", first.Build.Tool.Name, first.Build.Tool.Version, r.Build.Tool.Name, r.Build.Tool.Version))
		}
		if len(d) == 0 && !jsonx.Same(first.Head, r.Head) {
			d = append(d, "source, plan or calibration description")
		}
		if len(d) == 0 && (!slices.Equal(first.Files, r.Files) || !jsonx.Same(first.Planned, r.Planned)) {
			d = append(d, "partition of the units")
		}
		if len(d) > 0 {
			return nil, fmt.Errorf("%w: worker %d/%d's units are of another build than worker 0/%d's: it has a different %s", ErrAssemble, i, n, n, strings.Join(d, ", "))
		}
	}
	return byIndex, nil
}

// gathered is what the workers' records say was produced: per file and
// per dense-shard tensor its unit and record.
type gathered struct {
	unitOf, partUnit map[string]unitRef
	split            map[string]bool
	have             map[string]*fileRecord
	havePart         map[string]*partRecord
}

// gatherUnits collects the files and parts the n workers produced
// (shard.CheckClaims), refusing one that is no unit of the build, one
// produced twice, one in the record of a worker the partition does not
// give it to, and a missing one.
func gatherUnits(first *shardRecord, byIndex map[int]*shardRecord, n int) (*gathered, error) {
	split := map[string]bool{}
	for _, sf := range first.Split {
		split[sf.Name] = true
	}
	refs := map[string]unitRef{}
	var files, parts []shard.Planned
	for _, u := range first.Planned {
		refs[u.Name] = u
		f := shard.Planned{Name: u.Name, Worker: u.Worker}
		for _, name := range u.Files {
			if !split[name] {
				f.Outputs = append(f.Outputs, name)
			}
		}
		files = append(files, f)
		parts = append(parts, shard.Planned{Name: u.Name, Worker: u.Worker, Outputs: u.Tensors})
	}
	have := map[string]*fileRecord{}
	havePart := map[string]*partRecord{}
	for i := 0; i < n; i++ {
		for _, fr := range byIndex[i].Records {
			if fr == nil {
				return nil, fmt.Errorf("%w: worker %d/%d's record lists an empty file record", ErrAssemble, i, n)
			}
			have[fr.File.Name] = fr
		}
		for _, pr := range byIndex[i].Parts {
			if pr == nil {
				return nil, fmt.Errorf("%w: worker %d/%d's record lists an empty part", ErrAssemble, i, n)
			}
			havePart[pr.Tensor] = pr
		}
	}
	fileUnits, err := shard.CheckClaims(files, n, func(w int) []string {
		var out []string
		for _, fr := range byIndex[w].Records {
			out = append(out, fr.File.Name)
		}
		return out
	}, "file")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAssemble, err)
	}
	partUnits, err := shard.CheckClaims(parts, n, func(w int) []string {
		var out []string
		for _, pr := range byIndex[w].Parts {
			out = append(out, pr.Tensor)
		}
		return out
	}, "tensor")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAssemble, err)
	}
	unitOf := map[string]unitRef{}
	for f, u := range fileUnits {
		unitOf[f] = refs[u.Name]
	}
	partUnit := map[string]unitRef{}
	for tn, u := range partUnits {
		partUnit[tn] = refs[u.Name]
	}
	return &gathered{unitOf: unitOf, partUnit: partUnit, split: split, have: have, havePart: havePart}, nil
}

// expected lists, in the build's file order, the record of every file the
// workers produced (nil for the dense shards still to be joined from
// parts), and the files and parts to check before anything is written
// (gatherUnits has refused a missing unit; a file of the build that no
// unit lists is refused here). It records the parts' units in g.unitOf.
func (g *gathered) expected(dir string, first *shardRecord, n int) ([]*fileRecord, []manifest.FileEntry, error) {
	unitOf, partUnit, split, have, havePart := g.unitOf, g.partUnit, g.split, g.have, g.havePart
	results := make([]*fileRecord, len(first.Files))
	for k, f := range first.Files {
		if split[f] {
			continue
		}
		if have[f] == nil {
			u := unitOf[f]
			return nil, nil, fmt.Errorf("%w: unit %s (file %s, worker %d/%d) is missing", ErrAssemble, u.Name, f, u.Worker, n)
		}
		results[k] = have[f]
	}
	var check []manifest.FileEntry
	for _, r := range results {
		if r != nil {
			check = append(check, r.File)
		}
	}
	check = append(check, first.Head.Configs...)
	for _, sf := range first.Split {
		for _, tn := range sf.Tensors {
			pr := havePart[tn]
			if pr == nil {
				u := partUnit[tn]
				return nil, nil, fmt.Errorf("%w: unit %s (tensor %s, worker %d/%d) is missing", ErrAssemble, u.Name, tn, u.Worker, n)
			}
			rel, _ := filepath.Rel(dir, partPath(dir, tn))
			check = append(check, manifest.FileEntry{Name: rel, Size: pr.Size, SHA256: pr.SHA256})
			unitOf[rel] = partUnit[tn]
		}
	}
	return results, check, nil
}
