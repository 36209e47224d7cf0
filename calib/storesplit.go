package calib

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/jsonx"
	"github.com/ttquant/ttquant/internal/par"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/safetensors"
)

// A store build split across workers (StoreOptions.Shard) divides the
// calibration sequences into units of consecutive sequences, assigns the
// units to the workers with shard.Partition (cost: the unit's tokens), and
// has each worker run the forward pass over its own sequences only (the
// BF16 forward of a sequence depends on no other sequence). A worker's
// site writers receive the rows of its sequences and write, for every site
// and unit, the unit's rows in the store's dtype as one part file in the
// worker's directory, partial/shard-IIIII-of-NNNNN/parts/; its record
// (partial/shard-IIIII-of-NNNNN.json) lists them with their sha256s.
// AssembleStore checks the records and writes the shard files from the
// parts, with the same boundaries and bytes as one process, then the index.
//
// The unit is a range of sequences, not a shard file: a shard's rows are a
// fixed count per site (the shard size over the row size, which differs
// between sites), and a next_token-aligned site (the MTP layer) has one row
// fewer per sequence, so no split of the sequences matches every site's
// shard boundaries.

// StorePartialDir is the directory inside an unfinished store that holds
// what resumes or assembles it: a single process's records, and the
// workers' records, locks and parts of a split build. It is removed once
// the index is written.
const StorePartialDir = "partial"

const (
	storeWorkerFormat  = "ttquant-calibration-worker"
	storeWorkerVersion = 1
)

// StoreUnit is one unit of a split store build: sequences First … End−1.
type StoreUnit struct {
	Name   string `json:"name"`
	First  int    `json:"first_sequence"`
	End    int    `json:"end_sequence"`
	Worker int    `json:"worker"`
}

// storeFileRef is a whole file of a split build (the sequences file,
// written by worker 0) with its size and sha256.
type storeFileRef struct {
	File   string `json:"file"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// storeWorkerRecord is what one worker of a split store build leaves in
// StorePartialDir: written when it starts (Done false) and again when its
// sites are finished.
type storeWorkerRecord struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	Shard   string `json:"shard"`
	Index   int    `json:"index"`
	Count   int    `json:"count"`
	Done    bool   `json:"done"`
	Tool    string `json:"tool"`
	// Build is the builder's own description of the build (model, data,
	// options), compared as it is.
	Build           json.RawMessage `json:"build,omitempty"`
	Provenance      Provenance      `json:"provenance"`
	SequenceLengths []int           `json:"sequence_lengths"`
	DType           string          `json:"dtype"`
	ShardBytes      int64           `json:"shard_bytes"`
	Units           []StoreUnit     `json:"units"`
	Sequences       *storeFileRef   `json:"sequences,omitempty"`
	// Sites are the worker's parts: every site's Shards are its parts,
	// with the rows (of the whole site) each holds and their sha256s.
	Sites []SiteInfo `json:"sites,omitempty"`
}

func storeWorkerName(s shard.Spec) string {
	return s.FileName("shard", "")
}

// StoreWorkerDir is the directory of worker s's own files in a split store
// build: its parts, and whatever its builder keeps to resume.
func StoreWorkerDir(store string, s shard.Spec) string {
	return filepath.Join(store, StorePartialDir, storeWorkerName(s))
}

// LockStoreWorker takes worker s's lock: workers of different indices run
// at once, a second process with the same index fails at once naming the
// first.
func LockStoreWorker(store string, s shard.Spec) (*fslock.Lock, error) {
	return fslock.AcquireNamed(filepath.Join(store, StorePartialDir), storeLockName(s))
}

func storeLockName(s shard.Spec) string { return storeWorkerName(s) + ".lock" }

func storeRecordPath(store string, s shard.Spec) string {
	return filepath.Join(store, StorePartialDir, storeWorkerName(s)+".json")
}

// splitStoreUnits divides sequences of the given lengths into units of
// consecutive sequences for n workers and assigns them by shard.Partition:
// one sequence a unit, or k consecutive sequences while there would be more
// than eight units a worker (k = sequences ÷ 8n, rounded down), so that a
// worker's parts stay few.
func splitStoreUnits(lens []int, n int) ([]StoreUnit, error) {
	per := max(1, len(lens)/(8*n))
	var units []StoreUnit
	var costs []float64
	for f := 0; f < len(lens); f += per {
		e := min(len(lens), f+per)
		name := fmt.Sprintf("sequence %d", f)
		if e-f > 1 {
			name = fmt.Sprintf("sequences %d–%d", f, e-1)
		}
		var tok float64
		for _, l := range lens[f:e] {
			tok += float64(l)
		}
		units = append(units, StoreUnit{Name: name, First: f, End: e})
		costs = append(costs, tok)
	}
	asg, err := shard.Partition(costs, n)
	if err != nil {
		return nil, err
	}
	for w, us := range asg {
		for _, k := range us {
			units[k].Worker = w
		}
	}
	return units, nil
}

// storePart is the state of a StoreWriter that is one worker of a split
// build.
type storePart struct {
	spec  shard.Spec
	units []StoreUnit
	mine  []int // this worker's units, ascending
	rec   *storeWorkerRecord
}

// sequences lists the worker's sequences, ascending.
func (p *storePart) sequences() []int {
	var out []int
	for _, k := range p.mine {
		for s := p.units[k].First; s < p.units[k].End; s++ {
			out = append(out, s)
		}
	}
	return out
}

// partPlan is one part a worker's site writes: unit k's rows of the site.
type partPlan struct {
	unit        int
	first, rows int64
}

// partName is the file name of unit k's part of a site.
func partName(layer int, site string, k int) string {
	return fmt.Sprintf("layer%03d.%s.unit%05d.part", layer, site, k)
}

// partFile is the path, relative to the store and slash-separated, of
// worker s's part of unit k.
func partFile(s shard.Spec, layer int, site string, k int) string {
	return path.Join(StorePartialDir, storeWorkerName(s), "parts", partName(layer, site, k))
}

// plans lists the parts of the worker's units for a site with alignment
// align, skipping units without rows there.
func (p *storePart) plans(ro []int64) []partPlan {
	var out []partPlan
	for _, k := range p.mine {
		u := p.units[k]
		if n := ro[u.End] - ro[u.First]; n > 0 {
			out = append(out, partPlan{unit: k, first: ro[u.First], rows: n})
		}
	}
	return out
}

// startPart starts this worker's storePart: it checks the records other
// workers left (the same build, the same split) and writes its own, not
// done. Worker 0 also writes the sequences file, which is every worker's.
func (w *StoreWriter) startPart(tokenIDs [][]int32) error {
	spec := w.opt.Shard
	units, err := splitStoreUnits(w.lens, spec.Count)
	if err != nil {
		return err
	}
	p := &storePart{spec: spec, units: units}
	for k, u := range units {
		if u.Worker == spec.Index {
			p.mine = append(p.mine, k)
		}
	}
	p.rec = &storeWorkerRecord{Format: storeWorkerFormat, Version: storeWorkerVersion,
		Shard: spec.String(), Index: spec.Index, Count: spec.Count, Tool: w.opt.Tool, Build: w.opt.Build,
		Provenance: w.prov, SequenceLengths: w.lens, DType: w.opt.DType.String(), ShardBytes: w.opt.ShardBytes, Units: units}
	others, err := readStoreRecords(w.dir)
	if err != nil {
		return err
	}
	for _, o := range others {
		if o.Index == spec.Index && o.Count == spec.Count {
			continue // this worker's own, from an earlier run
		}
		if d := p.rec.differences(o); len(d) > 0 {
			return fmt.Errorf("calib: %s holds the records of worker %s of another store build (a different %s); run every worker with the same model, data and options, or choose another --out",
				w.dir, o.Shard, strings.Join(d, ", "))
		}
	}
	if spec.Index == 0 {
		if err := writeSequencesFile(w.dir, w.prov, w.lens, tokenIDs); err != nil {
			return err
		}
		n, sum, err := atomicfile.HashFile(filepath.Join(w.dir, StoreSequencesName))
		if err != nil {
			return fmt.Errorf("calib: %w", err)
		}
		p.rec.Sequences = &storeFileRef{File: StoreSequencesName, Size: n, SHA256: sum}
	}
	w.part = p
	return writeStoreRecord(w.dir, p.rec, w.opt.Faults)
}

// checkWrittenParts checks a site an earlier run of this worker finished:
// its parts are the worker's units' parts of the site, each file of the
// size its rows give (AssembleStore checks their sha256s).
func (w *StoreWriter) checkWrittenParts(si SiteInfo) error {
	key := siteKey(si)
	plans := w.part.plans(si.Alignment.rowOffsets(w.lens))
	if len(si.Shards) != len(plans) {
		return fmt.Errorf("calib: store: site %s lists %d parts, worker %s has %d", key, len(si.Shards), w.part.spec, len(plans))
	}
	rb := rowBytes(si.Cols, w.opt.DType)
	for i, p := range plans {
		sh := si.Shards[i]
		name := partFile(w.part.spec, si.Layer, si.Site, p.unit)
		if sh.File != name || sh.FirstToken != p.first || sh.Tokens != p.rows || len(sh.SHA256) != 64 {
			return fmt.Errorf("calib: store: site %s: part %q of rows [%d, +%d) is not worker %s's part %s of rows [%d, +%d)", key, sh.File, sh.FirstToken, sh.Tokens, w.part.spec, name, p.first, p.rows)
		}
		fi, err := os.Stat(filepath.Join(w.dir, filepath.FromSlash(name)))
		if err != nil {
			return fmt.Errorf("calib: store: site %s: %w", key, err)
		}
		if fi.Size() != p.rows*rb {
			return fmt.Errorf("calib: store: site %s: part %s is %d bytes, its rows are %d", key, name, fi.Size(), p.rows*rb)
		}
	}
	return nil
}

// closePart writes the worker's record, done, with its parts.
func (w *StoreWriter) closePart() error {
	rec := *w.part.rec
	rec.Done = true
	rec.Sites = w.sites
	return writeStoreRecord(w.dir, &rec, w.opt.Faults)
}

// Sequences lists the sequences whose rows the writer's sites receive, in
// order: every sequence of the store, or a split build's worker's own.
func (w *StoreWriter) Sequences() []int {
	if w.part != nil {
		return w.part.sequences()
	}
	out := make([]int, len(w.lens))
	for i := range out {
		out[i] = i
	}
	return out
}

// Split describes a worker's share of a split store build: the units of
// the build, the worker's units, sequences and tokens.
type Split struct {
	Units       int   `json:"units"`
	WorkerUnits int   `json:"worker_units"`
	Sequences   int   `json:"sequences"`
	Tokens      int64 `json:"tokens"`
}

// SplitShares returns the share of every one of n workers of a split
// store build of sequences of the given lengths: the partition each
// worker computes for itself.
func SplitShares(lens []int, n int) ([]Split, error) {
	units, err := splitStoreUnits(lens, n)
	if err != nil {
		return nil, err
	}
	out := make([]Split, n)
	for _, u := range units {
		s := &out[u.Worker]
		s.WorkerUnits++
		for _, l := range lens[u.First:u.End] {
			s.Sequences++
			s.Tokens += int64(l)
		}
	}
	for i := range out {
		out[i].Units = len(units)
	}
	return out, nil
}

// Split returns the worker's share, or nil for a whole store.
func (w *StoreWriter) Split() *Split {
	if w.part == nil {
		return nil
	}
	s := &Split{Units: len(w.part.units), WorkerUnits: len(w.part.mine)}
	for _, i := range w.part.sequences() {
		s.Sequences++
		s.Tokens += int64(w.lens[i])
	}
	return s
}

func writeStoreRecord(dir string, r *storeWorkerRecord, faults atomicfile.Faults) error {
	if err := faults.WriteJSON(storeRecordPath(dir, shard.Spec{Index: r.Index, Count: r.Count}), r); err != nil {
		return fmt.Errorf("calib: %w", err)
	}
	return nil
}

// readStoreRecords reads the records of a split store build in dir, by
// worker; a damaged record is an error naming it.
func readStoreRecords(dir string) ([]*storeWorkerRecord, error) {
	pdir := filepath.Join(dir, StorePartialDir)
	ents, err := os.ReadDir(pdir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("calib: %w", err)
	}
	var out []*storeWorkerRecord
	for _, e := range ents {
		if e.IsDir() || !strings.HasPrefix(e.Name(), "shard-") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(pdir, e.Name())
		r := &storeWorkerRecord{}
		if err := jsonx.ReadFile(p, r); err != nil {
			return nil, fmt.Errorf("calib: %w", err)
		}
		if r.Format != storeWorkerFormat || r.Version != storeWorkerVersion {
			return nil, fmt.Errorf("calib: %s: format %q version %d, want %q version %d", p, r.Format, r.Version, storeWorkerFormat, storeWorkerVersion)
		}
		if s := (shard.Spec{Index: r.Index, Count: r.Count}); !s.Valid() || storeWorkerName(s)+".json" != e.Name() {
			return nil, fmt.Errorf("calib: %s: the record names worker %d/%d", p, r.Index, r.Count)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// HasSplitRecords reports whether dir holds the records of workers of a
// split store build.
func HasSplitRecords(dir string) bool {
	m, _ := filepath.Glob(filepath.Join(dir, StorePartialDir, "shard-*.json"))
	return len(m) > 0
}

// differences names what two workers' records build differently.
func (r *storeWorkerRecord) differences(o *storeWorkerRecord) []string {
	var d []string
	p, q := r.Provenance, o.Provenance
	if r.Count != o.Count {
		d = append(d, fmt.Sprintf("worker count (%d, now %d)", o.Count, r.Count))
	}
	if r.Tool != o.Tool {
		d = append(d, fmt.Sprintf("tool (%s, now %s)", o.Tool, r.Tool))
	}
	if p.Model != q.Model || p.Revision != q.Revision {
		d = append(d, "source model")
	}
	if p.Sequences != q.Sequences || p.Tokens != q.Tokens || p.TokenIDsSHA256 != q.TokenIDsSHA256 || !slices.Equal(r.SequenceLengths, o.SequenceLengths) ||
		!bytes.Equal(jsonx.Compact(p.Data), jsonx.Compact(q.Data)) || p.Synthetic != q.Synthetic {
		d = append(d, "calibration data")
	}
	if r.DType != o.DType || r.ShardBytes != o.ShardBytes {
		d = append(d, fmt.Sprintf("store option (dtype %s, shard bytes %d; now %s, %d)", o.DType, o.ShardBytes, r.DType, r.ShardBytes))
	} else if len(d) == 0 && !bytes.Equal(jsonx.Compact(r.Build), jsonx.Compact(o.Build)) {
		// The builder's description holds the source and the data too:
		// said once above when they differ.
		d = append(d, "build option")
	}
	if len(d) == 0 && !slices.Equal(r.Units, o.Units) {
		d = append(d, "partition of the units")
	}
	return d
}

// StoreAssembleOptions configure AssembleStore.
type StoreAssembleOptions struct {
	Dir     string // the store directory the workers wrote (their --out)
	Workers int    // sites written (their parts hashed) at once (0: 1)
	// Faults as in StoreOptions.
	Faults atomicfile.Faults
}

// Validate reports the first option out of range: no directory, or a
// negative worker count.
func (o StoreAssembleOptions) Validate() error {
	switch {
	case o.Dir == "":
		return fmt.Errorf("calib: assemble: no store directory")
	case o.Workers < 0:
		return fmt.Errorf("calib: assemble: workers %d: want ≥ 0", o.Workers)
	}
	return nil
}

// StoreAssembly is the result of AssembleStore.
type StoreAssembly struct {
	Store *Store
	// Workers and Units of the split; AlreadyComplete when the directory
	// held the assembled store and no records (nothing was done).
	Workers, Units  int
	AlreadyComplete bool
}

// AssembleStore finishes a split store build: it checks that every worker
// of the split finished, that their records agree (tool, source model,
// calibration data, options, partition), that every unit's part of every
// site was produced exactly once by the worker the partition names, and
// that every part and the sequences file have the size and sha256 recorded;
// it writes the shard files from the parts, the bytes one process writes,
// hashing each part once as it copies it (into StorePartialDir until every
// part has passed), then moves them into place, writes the index and
// removes StorePartialDir. A refusal wraps
// shard.ErrAssemble (and shard.ErrUnitDamaged for a file that differs from
// its record), names the worker, unit and file, and writes nothing. A
// directory that holds a store and no records is left as it is.
func AssembleStore(ctx context.Context, opt StoreAssembleOptions) (*StoreAssembly, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	dir := opt.Dir
	lk, err := fslock.AcquireExisting(dir)
	if err != nil {
		return nil, err
	}
	defer lk.Release()
	recs, err := readStoreRecords(dir)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		if _, err := os.Stat(filepath.Join(dir, StoreIndexName)); err == nil {
			st, err := OpenStore(dir)
			if err != nil {
				return nil, err
			}
			return &StoreAssembly{Store: st, AlreadyComplete: true}, nil
		}
	}
	ws := make([]shard.Worker, len(recs))
	for i, r := range recs {
		ws[i] = shard.Worker{Index: r.Index, Count: r.Count, Done: r.Done}
	}
	n, release, err := shard.CheckWorkers(ws, filepath.Join(dir, StorePartialDir), shard.FileLocks(filepath.Join(dir, StorePartialDir), storeLockName))
	defer release()
	if err != nil {
		return nil, err
	}
	byIndex := map[int]*storeWorkerRecord{}
	for _, r := range recs {
		byIndex[r.Index] = r
	}
	first := byIndex[0]
	for i := 1; i < n; i++ {
		if d := byIndex[i].differences(first); len(d) > 0 {
			return nil, fmt.Errorf("%w: worker %d/%d's units are of another build than worker 0/%d's: it has a different %s", shard.ErrAssemble, i, n, n, strings.Join(d, ", "))
		}
	}
	sopt := StoreOptions{ShardBytes: first.ShardBytes, Faults: opt.Faults}
	var ok bool
	if sopt.DType, ok = storeDType(first.DType); !ok {
		return nil, fmt.Errorf("%w: the records give the store dtype %q (want BF16 or F32)", shard.ErrAssemble, first.DType)
	}
	a, err := gatherParts(dir, byIndex, n)
	if err != nil {
		return nil, err
	}
	if err := a.check(ctx, dir, first, sopt.DType); err != nil {
		return nil, err
	}
	sites, err := a.write(ctx, dir, first.Provenance, sopt, opt.Workers)
	if err != nil {
		return nil, err
	}
	if err := writeStoreIndex(dir, first.Provenance, first.SequenceLengths, sites, opt.Faults); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(filepath.Join(dir, StorePartialDir)); err != nil {
		return nil, fmt.Errorf("calib: the store is assembled, but removing %s failed: %w", filepath.Join(dir, StorePartialDir), err)
	}
	st, err := OpenStore(dir)
	if err != nil {
		return nil, err
	}
	return &StoreAssembly{Store: st, Workers: n, Units: len(first.Units)}, nil
}

// write writes the shard files of every site from the parts into a
// directory of the bookkeeping, workers sites at once, each part hashed as
// it is copied: a part that differs from its record refuses the assembly
// with nothing of the store written. Only then do the files move into
// place.
func (a *assembly) write(ctx context.Context, dir string, prov Provenance, sopt StoreOptions, workers int) ([]SiteInfo, error) {
	stage := filepath.Join(dir, StorePartialDir, "assembly")
	if err := os.RemoveAll(stage); err != nil {
		return nil, fmt.Errorf("calib: %w", err)
	}
	if err := os.MkdirAll(stage, 0o755); err != nil {
		return nil, fmt.Errorf("calib: %w", err)
	}
	sites := make([]SiteInfo, len(a.sites))
	err := par.For(ctx, len(a.sites), workers, func(i int) error {
		var err error
		sites[i], err = a.writeSite(ctx, dir, stage, prov, a.sites[i], sopt)
		return err
	})
	if err != nil {
		os.RemoveAll(stage)
		return nil, err
	}
	for _, si := range sites {
		for _, sh := range si.Shards {
			if err := os.Rename(filepath.Join(stage, sh.File), filepath.Join(dir, sh.File)); err != nil {
				return nil, fmt.Errorf("calib: %w", err)
			}
		}
	}
	atomicfile.SyncDir(dir)
	return sites, nil
}

func siteKey(si SiteInfo) string { return fmt.Sprintf("%d/%s", si.Layer, si.Site) }

// assembly is what the workers' records say was produced: every site
// (layer, then name) and its parts in row order, with their units.
type assembly struct {
	sites []SiteInfo
	parts map[string][]ShardInfo
	unit  map[string]string // part file → unit name
}

// gatherParts collects the parts the workers produced (shard.CheckClaims):
// refused are a part that is no unit's, one produced twice or by a worker
// the partition does not give it to, one whose rows are not its unit's,
// and a missing one. The sites are every worker's; they must agree.
func gatherParts(dir string, byIndex map[int]*storeWorkerRecord, n int) (*assembly, error) {
	first := byIndex[0]
	sites := map[string]SiteInfo{}
	for i := 0; i < n; i++ {
		for _, si := range byIndex[i].Sites {
			k := siteKey(si)
			if o, ok := sites[k]; ok && (o.Cols != si.Cols || o.Alignment != si.Alignment || o.DType != si.DType || o.Tokens != si.Tokens) {
				return nil, fmt.Errorf("%w: site %s is %d columns of %s (%s-aligned) in worker %d/%d's record and %d of %s (%s-aligned) in an earlier worker's", shard.ErrAssemble, k, si.Cols, si.DType, si.Alignment, i, n, o.Cols, o.DType, o.Alignment)
			}
			if !si.Alignment.Valid() || si.Cols <= 0 || si.DType != first.DType {
				return nil, fmt.Errorf("%w: worker %d/%d's record describes site %s as %d columns of %s (%s-aligned)", shard.ErrAssemble, i, n, k, si.Cols, si.DType, si.Alignment)
			}
			sites[k] = si
		}
	}
	a := &assembly{parts: map[string][]ShardInfo{}, unit: map[string]string{}}
	for _, si := range sites {
		a.sites = append(a.sites, SiteInfo{Layer: si.Layer, Site: si.Site, Cols: si.Cols, Tokens: si.Tokens, DType: si.DType, Alignment: si.Alignment})
	}
	sortSites(a.sites)
	// The parts every unit must have, named by site and unit, and the rows
	// each holds.
	want := map[string]ShardInfo{}
	planned := make([]shard.Planned, len(first.Units))
	for k, u := range first.Units {
		planned[k] = shard.Planned{Name: u.Name, Worker: u.Worker}
	}
	for _, si := range a.sites {
		ro := si.Alignment.rowOffsets(first.SequenceLengths)
		if si.Tokens != ro[len(ro)-1] {
			return nil, fmt.Errorf("%w: site %s has %d rows, the store's sequences give %d", shard.ErrAssemble, siteKey(si), si.Tokens, ro[len(ro)-1])
		}
		for k, u := range first.Units {
			if u.First < 0 || u.End > len(first.SequenceLengths) || u.First >= u.End {
				return nil, fmt.Errorf("%w: unit %s covers sequences %d..%d of %d", shard.ErrAssemble, u.Name, u.First, u.End-1, len(first.SequenceLengths))
			}
			if ro[u.End] == ro[u.First] {
				continue
			}
			name := partFile(shard.Spec{Index: u.Worker, Count: n}, si.Layer, si.Site, k)
			planned[k].Outputs = append(planned[k].Outputs, name)
			want[name] = ShardInfo{File: name, FirstToken: ro[u.First], Tokens: ro[u.End] - ro[u.First]}
			a.unit[name] = u.Name
		}
	}
	// A part is claimed by the path its record gives, which is in the
	// directory of the worker the partition gives its unit to.
	claims := func(w int) []string {
		var out []string
		for _, si := range byIndex[w].Sites {
			for _, sh := range si.Shards {
				out = append(out, sh.File)
			}
		}
		return out
	}
	if _, err := shard.CheckClaims(planned, n, claims, "part"); err != nil {
		return nil, fmt.Errorf("%w: %w", shard.ErrAssemble, err)
	}
	for w := 0; w < n; w++ {
		for _, si := range byIndex[w].Sites {
			for _, sh := range si.Shards {
				p := want[sh.File]
				if sh.FirstToken != p.FirstToken || sh.Tokens != p.Tokens {
					return nil, fmt.Errorf("%w: unit %s: part %s holds rows [%d, +%d), the unit's are [%d, +%d)", shard.ErrAssemble, a.unit[sh.File], sh.File, sh.FirstToken, sh.Tokens, p.FirstToken, p.Tokens)
				}
				a.parts[siteKey(si)] = append(a.parts[siteKey(si)], sh)
			}
		}
	}
	for k := range a.parts {
		sort.Slice(a.parts[k], func(i, j int) bool { return a.parts[k][i].FirstToken < a.parts[k][j].FirstToken })
	}
	return a, nil
}

// check hashes the sequences file against worker 0's record and checks
// the size of every part against its rows (before any byte of the store
// is written; writeSiteFromParts hashes the parts as it copies them).
func (a *assembly) check(ctx context.Context, dir string, first *storeWorkerRecord, dt safetensors.DType) error {
	if first.Sequences == nil || first.Sequences.File != StoreSequencesName {
		return fmt.Errorf("%w: worker 0/%d's record lists no %s", shard.ErrAssemble, first.Count, StoreSequencesName)
	}
	seq := shard.Expected{What: "worker 0's file " + StoreSequencesName, Path: filepath.Join(dir, StoreSequencesName), Size: first.Sequences.Size, SHA256: first.Sequences.SHA256}
	if err := shard.Verify(ctx, []shard.Expected{seq}, 1, atomicfile.HashFileContext); err != nil {
		return err
	}
	for _, si := range a.sites {
		rb := rowBytes(si.Cols, dt)
		for _, sh := range a.parts[siteKey(si)] {
			f := a.expected(dir, sh, rb)
			fi, err := os.Stat(f.Path)
			var n int64
			if err == nil {
				n = fi.Size()
			}
			if err := f.Check(n, "", err); err != nil {
				return err
			}
		}
	}
	return nil
}

// expected is what the record of part sh of a site of rows of rb bytes
// says of its file.
func (a *assembly) expected(dir string, sh ShardInfo, rb int64) shard.Expected {
	return shard.Expected{What: fmt.Sprintf("unit %s: part %s", a.unit[sh.File], sh.File),
		Path: filepath.Join(dir, filepath.FromSlash(sh.File)), Size: sh.Tokens * rb, SHA256: sh.SHA256}
}

// writeSite writes into stage the shard files of site si from its parts
// (in row order, covering every row), with the boundaries a single
// process's SiteWriter gives them, and returns the site with its shards.
// Each part is read once, in order, and hashed as it is copied: one that
// differs from its record (shard.Expected.Check) is the error.
func (a *assembly) writeSite(ctx context.Context, dir, stage string, prov Provenance, si SiteInfo, opt StoreOptions) (SiteInfo, error) {
	parts := a.parts[siteKey(si)]
	rb := rowBytes(si.Cols, opt.DType)
	per := max(1, opt.ShardBytes/rb)
	p := 0
	var (
		ph     hash.Hash // part p's hash so far
		got    int64     // and its bytes read
		f      *os.File  // part p, open
		failed error     // a part that differs from its record
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for first := int64(0); first < si.Tokens; first += per {
		rows := min(per, si.Tokens-first)
		name := ShardName(si.Layer, si.Site, len(si.Shards))
		fw, err := createShardFile(stage, name, prov, si, opt, first, rows, func(dst io.Writer) error {
			for r := first; r < first+rows; {
				for p < len(parts) && parts[p].FirstToken+parts[p].Tokens <= r {
					p++
				}
				if p == len(parts) || parts[p].FirstToken > r {
					return fmt.Errorf("calib: site %s: no part holds row %d", siteKey(si), r)
				}
				sh := parts[p]
				if r == sh.FirstToken {
					var err error
					if f, err = os.Open(filepath.Join(dir, filepath.FromSlash(sh.File))); err != nil {
						return err
					}
					ph, got = sha256.New(), 0
				}
				end := min(first+rows, sh.FirstToken+sh.Tokens)
				n, err := io.Copy(io.MultiWriter(dst, ph), atomicfile.ContextReader(ctx, io.NewSectionReader(f, (r-sh.FirstToken)*rb, (end-r)*rb)))
				if got += n; err != nil {
					return err
				}
				if end == sh.FirstToken+sh.Tokens || n < (end-r)*rb {
					f.Close()
					f = nil
					if failed = a.expected(dir, sh, rb).Check(got, hex.EncodeToString(ph.Sum(nil)), nil); failed != nil {
						return failed
					}
				}
				r = end
			}
			return nil
		})
		if err != nil {
			return si, err
		}
		if err := fw.Close(); err != nil {
			if failed != nil || ctx.Err() != nil {
				return si, cmp.Or(failed, ctx.Err())
			}
			return si, fmt.Errorf("calib: store: writing %s: %w", name, err)
		}
		si.Shards = append(si.Shards, ShardInfo{File: name, FirstToken: first, Tokens: rows})
	}
	return si, nil
}
