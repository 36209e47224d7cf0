package selection

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/jsonx"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/build"
)

// A measurement split across workers (MeasureShard) runs in a directory
// the workers share, in two stages that each end with ttquant assemble
// DIR:
//
//   - the measurement builds: every worker is worker i of N of every
//     format's store GPTQ build (build.GPTQ with BuildOptions.Shard) in
//     DIR/measure-FORMAT; AssembleMeasurement assembles them;
//   - with WeightMeasure, the single-change evaluations, once the builds
//     are assembled: the changes (one per key) go to the workers by
//     shard.Partition of their cost (the layers a change runs, and the LM
//     head); each worker scores its own on the held-out windows and writes
//     their results to its record; AssembleMeasurement merges the records.
//
// The sensitivity file the assembly writes is the bytes MeasurePrepared's result saves for
// the same inputs. A measurement from calibration text (sequential
// builds) is not split.

// MeasureHeadName is the file, in the directory of a split measurement,
// that names what is measured: the prepared sensitivity, the weights
// asked for, the worker count and the sensitivity file to write.
const MeasureHeadName = "measurement.json"

const (
	measureHeadFormat   = "ttquant-sensitivity-measurement"
	changesRecordFormat = "ttquant-sensitivity-changes"
	measureSplitVersion = 1
)

// headLayers is the cost of a change's LM head in layers: the head costs
// about eight layers a scored token (docs/projections.md, "Evaluation":
// 56.0 cpu-ms against 6.93–7.43 for a layer).
const headLayers = 8

// measureHead is MeasureHeadName's content.
type measureHead struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	Workers int    `json:"workers"`
	// SensitivityFile is where the assembly writes the sensitivity file
	// (absolute).
	SensitivityFile string                  `json:"sensitivity_file"`
	Weights         *weightsAsked           `json:"weights,omitempty"`
	Prepared        *Sensitivity            `json:"prepared"`
	Formats         []manifest.StoredFormat `json:"formats"`
}

// weightsAsked is a WeightMeasure's options, as recorded.
type weightsAsked struct {
	Mode      string `json:"mode"`
	Sequences int    `json:"sequences"`
	SeqLen    int    `json:"seq_len"`
}

// changesRecord is one worker's record of the single-change evaluations:
// written when it starts (Done false) and when its changes are scored.
type changesRecord struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	Shard   string `json:"shard"`
	Index   int    `json:"index"`
	Count   int    `json:"count"`
	Done    bool   `json:"done"`
	// Measurement is the sha256 of the sensitivity the builds measured
	// (kl_weights left out), which the changes' losses come from.
	Measurement    string         `json:"measurement_sha256"`
	Candidate      string         `json:"candidate"`
	TokenIDsSHA256 string         `json:"token_ids_sha256"`
	Units          []changeUnit   `json:"units"`
	Scored         int64          `json:"scored_tokens"`
	Results        []changeResult `json:"results,omitempty"`
}

// changeUnit is a change of the split and the worker the partition gives
// it to.
type changeUnit struct {
	Key    string `json:"key"`
	Worker int    `json:"worker"`
}

func changesName(s shard.Spec) string {
	return s.FileName("changes", "")
}

func changesLockName(s shard.Spec) string { return changesName(s) + ".lock" }

// IsMeasurementDir reports whether dir is the directory of a split
// measurement.
func IsMeasurementDir(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, MeasureHeadName))
	return err == nil
}

// SplitRule is a rule of the options of a split measurement that a
// SplitError says was broken.
type SplitRule int

const (
	// SplitBadShard: the shard names no worker (index outside 0..count−1).
	SplitBadShard SplitRule = iota + 1
	// SplitFromText: a measurement from calibration text (sequential
	// builds, each layer's inputs from the layers quantized before it) is
	// not split; one from a calibration store is.
	SplitFromText
	// SplitNoParts: a worker needs the directory the workers share.
	SplitNoParts
	// SplitPartsAlone: that directory is for a worker only.
	SplitPartsAlone
)

// SplitNames are what the options of a split measurement are called in a
// SplitError's message: the fields of RunOptions by default, a command's
// flags for its users (SplitError.Message).
type SplitNames struct {
	Shard, Parts, Data, Calib string
}

// SplitError is the refusal of a split measurement's options: which rule
// (CheckSplit) they break. Its Message calls the options by the names a
// caller gives; Error by the fields of RunOptions.
type SplitError = shard.RuleError[SplitRule, SplitNames]

// splitRules are the split measurement's rules' messages.
var splitRules = &shard.Rules[SplitRule, SplitNames]{Pkg: "selection", Names: SplitNames{Shard: "Shard", Parts: "Parts", Data: "Measure.Data", Calib: "Measure.Calib"}, Say: splitMessage}

// splitMessage says what breaking rule means for worker s.
func splitMessage(rule SplitRule, s shard.Spec, names SplitNames) string {
	switch rule {
	case SplitBadShard:
		return fmt.Sprintf("%s %d/%d names no worker", names.Shard, s.Index, s.Count)
	case SplitFromText:
		return fmt.Sprintf("%s splits a measurement from a calibration store (%s); the sequential builds of %s stay on one machine", names.Shard, names.Calib, names.Data)
	case SplitNoParts:
		return fmt.Sprintf("%s %s needs %s, the directory the workers share the measurement in", names.Shard, s, names.Parts)
	case SplitPartsAlone:
		return fmt.Sprintf("%s is for the workers of a split measurement (%s i/N)", names.Parts, names.Shard)
	}
	return fmt.Sprintf("split measurement rule %d broken", rule)
}

// CheckSplit checks the options of a split measurement: a worker (any
// shard given, 0/1 included) measures from a calibration store, not from
// calibration text, and writes to parts, the directory the workers share;
// parts is for a worker only. A *SplitError says which rule is broken.
func CheckSplit(s shard.Spec, fromText bool, parts string) error {
	var rule SplitRule
	switch {
	case s != (shard.Spec{}) && !s.Valid():
		rule = SplitBadShard
	case s.Count > 0 && fromText:
		rule = SplitFromText
	case s.Count > 0 && parts == "":
		rule = SplitNoParts
	case s.Count == 0 && parts != "":
		rule = SplitPartsAlone
	default:
		return nil
	}
	return splitRules.Broken(rule, s)
}

// ShardOptions say which worker of a split measurement a process is.
type ShardOptions struct {
	Spec shard.Spec
	// Dir is the directory the workers share (created when missing).
	Dir string
	// SensitivityFile is where the assembly writes the sensitivity file.
	SensitivityFile string
}

// Validate reports a missing worker or sensitivity file (the rules that
// pair the worker with the data and the directory are CheckSplit's).
func (so ShardOptions) Validate() error {
	switch {
	case so.Spec.Count == 0:
		return errors.New("selection: MeasureShard needs a worker (ShardOptions.Spec)")
	case so.SensitivityFile == "":
		return errors.New("selection: a split measurement needs the sensitivity file")
	}
	return nil
}

// ShardReport is what one worker of a split measurement did.
type ShardReport struct {
	Worker  int    `json:"worker"`
	Workers int    `json:"workers"`
	Dir     string `json:"dir"`
	// Builds are the worker's shares of the measurement builds.
	Builds []BuildShare `json:"builds"`
	// BuildsAssembled: every measurement build is assembled, so the
	// single-change evaluations could run.
	BuildsAssembled bool `json:"builds_assembled"`
	// Changes and WorkerChanges count the single-change evaluations and
	// this worker's (0 before the builds are assembled or without weights).
	Changes       int `json:"changes"`
	WorkerChanges int `json:"worker_changes"`
	// KeptChanges: this worker's evaluations were finished by an earlier run.
	KeptChanges bool `json:"kept_changes"`
	// Assembled is the whole measurement's result when this is the only
	// worker (N = 1), which assembles it at once.
	Assembled *MeasureAssembly `json:"assembled,omitempty"`
}

// BuildShare is a worker's share of one measurement build.
type BuildShare struct {
	Format          manifest.StoredFormat `json:"format"`
	Dir             string                `json:"dir"`
	Files           int                   `json:"files"`
	Kept            int                   `json:"kept"`
	AlreadyComplete bool                  `json:"already_complete"`
}

// MeasureShard runs worker so.Spec's share of the measurement of s (from
// Prepare, for the same options): its units of every measurement build
// and, once those are assembled, its single-change evaluations. A worker
// run again keeps what it finished. The only worker of a split into one
// (0/1) assembles the measurement itself.
func MeasureShard(ctx context.Context, opt MeasureOptions, s *Sensitivity, so ShardOptions) (*ShardReport, error) {
	if opt.ExpertsPerFile == 0 {
		opt.ExpertsPerFile = manifest.DefaultExpertsPerFile
	}
	if opt.Workers == 0 {
		opt.Workers = 1
	}
	if err := CheckSplit(so.Spec, opt.Data != nil, so.Dir); err != nil {
		return nil, err
	}
	if err := so.Validate(); err != nil {
		return nil, err
	}
	if s == nil || !s.sizesOnly {
		return nil, errors.New("selection: MeasureShard needs the result of Prepare")
	}
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	sens, err := filepath.Abs(so.SensitivityFile)
	if err != nil {
		return nil, err
	}
	head := &measureHead{Format: measureHeadFormat, Version: measureSplitVersion, Workers: so.Spec.Count, SensitivityFile: sens, Prepared: s, Formats: bfpFormats(opt.Candidates)}
	if w := opt.Weights; w != nil {
		head.Weights = &weightsAsked{Mode: w.Mode, Sequences: w.Sequences, SeqLen: w.SeqLen}
	}
	// The held-out text before any long work, as MeasurePrepared does.
	var ho *heldOut
	if opt.Weights != nil {
		if ho, err = prepareHeldOut(opt); err != nil {
			return nil, err
		}
	}
	lk, err := fslock.AcquireNamed(so.Dir, changesLockName(so.Spec))
	if err != nil {
		return nil, err
	}
	defer lk.Release()
	if err := writeHead(so.Dir, head); err != nil {
		return nil, err
	}
	rep := &ShardReport{Worker: so.Spec.Index, Workers: so.Spec.Count, Dir: so.Dir, BuildsAssembled: true}
	for _, f := range head.Formats {
		out := measureDir(so.Dir, f)
		br, err := build.GPTQ(ctx, measurementBuild(opt, f, out, so.Spec))
		if err != nil {
			return nil, fmt.Errorf("selection: measuring %s: %w", f, err)
		}
		rep.Builds = append(rep.Builds, BuildShare{Format: f, Dir: out, Files: br.Files, Kept: br.Kept, AlreadyComplete: br.AlreadyComplete})
		if _, err := os.Stat(filepath.Join(out, manifest.ManifestName)); err != nil {
			rep.BuildsAssembled = false
		}
	}
	if rep.BuildsAssembled && opt.Weights != nil {
		if err := runChanges(ctx, opt, head, ho, so, rep); err != nil {
			return nil, err
		}
	}
	if so.Spec.Count == 1 {
		lk.Release()
		if rep.Assembled, err = AssembleMeasurement(ctx, MeasureAssembleOptions{Dir: so.Dir, Workers: opt.Workers}); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// writeHead writes the head of a split measurement, or checks that the
// one there is the same.
func writeHead(dir string, h *measureHead) error {
	data, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	old, err := readHead(dir)
	if errors.Is(err, os.ErrNotExist) {
		// Workers started at once all find no head: the first to write
		// it places it, the others compare theirs with it.
		var created bool
		if created, err = atomicfile.WriteNew(filepath.Join(dir, MeasureHeadName), data); err != nil || created {
			return err
		}
		old, err = readHead(dir)
	}
	if err != nil {
		return err
	}
	if d := h.differences(old); len(d) > 0 {
		return fmt.Errorf("selection: %s holds a split measurement of other inputs (a different %s); run every worker with the same flags, or choose another --parts", dir, strings.Join(d, ", "))
	}
	return nil
}

func readHead(dir string) (*measureHead, error) {
	var h measureHead
	if err := jsonx.ReadFile(filepath.Join(dir, MeasureHeadName), &h); err != nil {
		return nil, fmt.Errorf("selection: %w", err)
	}
	if h.Format != measureHeadFormat || h.Version != measureSplitVersion || h.Prepared == nil {
		return nil, fmt.Errorf("selection: %s: format %q version %d, want %q version %d", filepath.Join(dir, MeasureHeadName), h.Format, h.Version, measureHeadFormat, measureSplitVersion)
	}
	return &h, nil
}

// differences names what two heads measure differently.
func (h *measureHead) differences(o *measureHead) []string {
	var d []string
	p, q := h.Prepared, o.Prepared
	if h.Workers != o.Workers {
		d = append(d, fmt.Sprintf("worker count (%d, now %d)", o.Workers, h.Workers))
	}
	if p.Model != q.Model {
		d = append(d, "source model")
	}
	if p.BasePlan != q.BasePlan || p.ExpertsPerFile != q.ExpertsPerFile || !jsonx.Same(h.Formats, o.Formats) {
		d = append(d, "base plan, layout or candidates")
	}
	if !jsonx.Same(h.Weights, o.Weights) {
		d = append(d, "weight measurement (--weights, --eval-sequences, --eval-seq-len)")
	}
	if h.SensitivityFile != o.SensitivityFile {
		d = append(d, fmt.Sprintf("sensitivity file (%s, now %s)", o.SensitivityFile, h.SensitivityFile))
	}
	if len(d) == 0 && !jsonx.Same(p, q) {
		d = append(d, "set of matrices")
	}
	return d
}

// measured is the sensitivity the assembled measurement builds in dir
// give head's prepared one (without weights).
func (h *measureHead) measured(dir string) (*Sensitivity, error) {
	raw, err := json.Marshal(h.Prepared)
	if err != nil {
		return nil, err
	}
	s := &Sensitivity{}
	if err := json.Unmarshal(raw, s); err != nil {
		return nil, err
	}
	s.beginMeasurement()
	for _, f := range h.Formats {
		path := filepath.Join(measureDir(dir, f), manifest.ManifestName)
		data, err := manifest.ReadManifestFile(path, 0)
		if err != nil {
			return nil, fmt.Errorf("selection: the %s measurement build: %w", f, err)
		}
		m, err := manifest.DecodeManifest(data)
		if err != nil {
			return nil, fmt.Errorf("selection: %s: %w", path, err)
		}
		if err := s.addMeasurement(f, m); err != nil {
			return nil, err
		}
	}
	s.finishMeasurement()
	return s, nil
}

// measurementSHA256 identifies a measured sensitivity without weights.
func measurementSHA256(s *Sensitivity) (string, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:]), nil
}

// measuredChanges is the single changes of a measured sensitivity, to
// the change format of its measurement.
func measuredChanges(s *Sensitivity, w *weightsAsked) ([]*changeGroup, Candidate, error) {
	f, err := changeFormat(s.Measured)
	if err != nil {
		return nil, Candidate{}, err
	}
	cand := Candidate{f, manifest.MethodGPTQ}
	groups, err := changeGroups(s, w.Mode, cand)
	return groups, cand, err
}

// partitionChanges assigns the changes to n workers by their cost: the
// layers a change runs from its first to the last of the model's layers,
// and the LM head.
func partitionChanges(groups []*changeGroup, layers, n int) ([]changeUnit, error) {
	costs := make([]float64, len(groups))
	for i, g := range groups {
		costs[i] = float64(layers-g.firstLayer()) + headLayers
	}
	asg, err := shard.Partition(costs, n)
	if err != nil {
		return nil, err
	}
	units := make([]changeUnit, len(groups))
	for wk, ks := range asg {
		for _, k := range ks {
			units[k] = changeUnit{Key: groups[k].key, Worker: wk}
		}
	}
	return units, nil
}

// runChanges scores this worker's single changes and records them,
// unless an earlier run of the same worker did.
func runChanges(ctx context.Context, opt MeasureOptions, head *measureHead, ho *heldOut, so ShardOptions, rep *ShardReport) error {
	s, err := head.measured(so.Dir)
	if err != nil {
		return err
	}
	sum, err := measurementSHA256(s)
	if err != nil {
		return err
	}
	groups, cand, err := measuredChanges(s, head.Weights)
	if err != nil {
		return err
	}
	units, err := partitionChanges(groups, ho.layers, so.Spec.Count)
	if err != nil {
		return err
	}
	rec := &changesRecord{Format: changesRecordFormat, Version: measureSplitVersion, Shard: so.Spec.String(), Index: so.Spec.Index, Count: so.Spec.Count,
		Measurement: sum, Candidate: cand.String(), TokenIDsSHA256: ho.idsSHA256(), Units: units}
	var mine []*changeGroup
	for k, u := range units {
		if u.Worker == so.Spec.Index {
			mine = append(mine, groups[k])
		}
	}
	rep.Changes, rep.WorkerChanges = len(groups), len(mine)
	path := filepath.Join(so.Dir, changesName(so.Spec)+".json")
	var old changesRecord
	if jsonx.ReadFile(path, &old) == nil && old.Done && old.agrees(rec) == "" {
		rep.KeptChanges = true
		return nil
	}
	if err := atomicfile.Faults(nil).WriteJSON(path, rec); err != nil {
		return err
	}
	if len(mine) > 0 {
		if rec.Results, rec.Scored, err = evaluateChanges(ctx, opt, ho, measureDir(so.Dir, cand.Format), cand, mine); err != nil {
			return err
		}
	}
	rec.Done = true
	return atomicfile.Faults(nil).WriteJSON(path, rec)
}

// agrees names what of another record's evaluation differs from r's
// ("" when they are of the same evaluation).
func (r *changesRecord) agrees(o *changesRecord) string {
	switch {
	case r.Count != o.Count:
		return fmt.Sprintf("worker count (%d and %d)", r.Count, o.Count)
	case r.Measurement != o.Measurement:
		return "measurement (the builds' losses, model, calibration or base plan)"
	case r.Candidate != o.Candidate || r.TokenIDsSHA256 != o.TokenIDsSHA256:
		return "weight measurement (change format or held-out text)"
	case !jsonx.Same(r.Units, o.Units):
		return "partition of the changes"
	}
	return ""
}

// MeasureAssembleOptions configure AssembleMeasurement.
type MeasureAssembleOptions struct {
	Dir     string // the workers' directory (their --parts)
	Workers int    // files hashed at once by the builds' assembly (0: 1)
}

// Validate reports a missing directory or a negative worker count.
func (o MeasureAssembleOptions) Validate() error {
	if o.Dir == "" || o.Workers < 0 {
		return fmt.Errorf("selection: assemble: directory %q, workers %d", o.Dir, o.Workers)
	}
	return nil
}

// MeasureAssembly is what AssembleMeasurement did.
type MeasureAssembly struct {
	Dir string `json:"dir"`
	// Assembled are the measurement builds assembled by this run.
	Assembled []manifest.StoredFormat `json:"assembled_builds"`
	// Pending: the builds are assembled, the single-change evaluations
	// are still to run (the workers again, then the assembly again).
	Pending bool `json:"evaluations_pending"`
	// SensitivityFile is the file written, when not Pending; Unchanged
	// when it already held these bytes.
	SensitivityFile string       `json:"sensitivity_file,omitempty"`
	Unchanged       bool         `json:"unchanged,omitempty"`
	Workers         int          `json:"workers"`
	Changes         int          `json:"changes"`
	Sensitivity     *Sensitivity `json:"-"`
}

// AssembleMeasurement finishes a stage of a split measurement: it
// assembles every measurement build not yet assembled (build.Assemble,
// with its checks and refusals); without weights it then writes the
// sensitivity file. With weights, once the builds were assembled by an
// earlier run and the workers have scored their changes, it checks the
// workers' records (every worker finished, the same measurement, every
// change scored once, by the worker the partition names) and writes the
// sensitivity file, the bytes a single process saves. A refusal wraps
// shard.ErrAssemble, names the worker and the change, and writes nothing.
func AssembleMeasurement(ctx context.Context, opt MeasureAssembleOptions) (*MeasureAssembly, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	dir := opt.Dir
	lk, err := fslock.AcquireExisting(dir)
	if err != nil {
		return nil, err
	}
	defer lk.Release()
	head, err := readHead(dir)
	if err != nil {
		return nil, err
	}
	res := &MeasureAssembly{Dir: dir, Workers: head.Workers}
	for _, f := range head.Formats {
		out := measureDir(dir, f)
		if _, err := os.Stat(filepath.Join(out, manifest.ManifestName)); err == nil {
			continue
		}
		if _, err := build.Assemble(ctx, build.AssembleOptions{Dir: out, Workers: opt.Workers}); err != nil {
			return nil, fmt.Errorf("selection: the %s measurement build: %w", f, err)
		}
		res.Assembled = append(res.Assembled, f)
	}
	s, err := head.measured(dir)
	if err != nil {
		return nil, err
	}
	if head.Weights != nil {
		if len(res.Assembled) > 0 {
			res.Pending = true
			return res, nil
		}
		if s.KL, res.Changes, err = mergeChanges(dir, head, s); err != nil {
			return nil, err
		}
	}
	res.SensitivityFile, res.Sensitivity = head.SensitivityFile, s
	now, err := s.marshal()
	if err != nil {
		return nil, err
	}
	if old, err := os.ReadFile(head.SensitivityFile); err == nil && bytes.Equal(old, now) {
		res.Unchanged = true
		return res, nil
	}
	if _, err := atomicfile.WriteFile(head.SensitivityFile, now); err != nil {
		return nil, err
	}
	return res, nil
}

// mergeChanges checks the workers' records of the single changes and
// returns the weights they measured and the number of changes.
func mergeChanges(dir string, head *measureHead, s *Sensitivity) (*KLWeights, int, error) {
	recs, err := readChangesRecords(dir)
	if err != nil {
		return nil, 0, err
	}
	ws := make([]shard.Worker, len(recs))
	for i, r := range recs {
		ws[i] = shard.Worker{Index: r.Index, Count: r.Count, Done: r.Done}
	}
	n, release, err := shard.CheckWorkers(ws, dir, shard.FileLocks(dir, changesLockName))
	defer release()
	if err != nil {
		return nil, 0, err
	}
	sum, err := measurementSHA256(s)
	if err != nil {
		return nil, 0, err
	}
	byIndex := map[int]*changesRecord{}
	for _, r := range recs {
		byIndex[r.Index] = r
	}
	first := byIndex[0]
	if first.Measurement != sum {
		return nil, 0, fmt.Errorf("%w: worker 0/%d's changes are of another measurement than the builds in %s", shard.ErrAssemble, n, dir)
	}
	for i := 1; i < n; i++ {
		if d := byIndex[i].agrees(first); d != "" {
			return nil, 0, fmt.Errorf("%w: worker %d/%d's changes are of another evaluation than worker 0/%d's: it has a different %s", shard.ErrAssemble, i, n, n, d)
		}
	}
	// The changes the builds give must be the ones the workers divided.
	groups, cand, err := measuredChanges(s, head.Weights)
	if err != nil {
		return nil, 0, err
	}
	if len(groups) != len(first.Units) || cand.String() != first.Candidate {
		return nil, 0, fmt.Errorf("%w: the workers' records list %d changes to %s, the measurement %d to %s", shard.ErrAssemble, len(first.Units), first.Candidate, len(groups), cand)
	}
	planned := make([]shard.Planned, len(first.Units))
	for k, u := range first.Units {
		if u.Key != groups[k].key {
			return nil, 0, fmt.Errorf("%w: the workers' change %d is %s, the measurement's %s", shard.ErrAssemble, k, u.Key, groups[k].key)
		}
		planned[k] = shard.Planned{Name: u.Key, Worker: u.Worker, Outputs: []string{u.Key}}
	}
	claims := func(w int) []string {
		var out []string
		for _, r := range byIndex[w].Results {
			out = append(out, r.Key)
		}
		return out
	}
	if _, err := shard.CheckClaims(planned, n, claims, "change"); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", shard.ErrAssemble, err)
	}
	results := map[string]changeResult{}
	scored := int64(-1)
	for i := 0; i < n; i++ {
		r := byIndex[i]
		if len(r.Results) == 0 {
			continue
		}
		if scored >= 0 && r.Scored != scored {
			return nil, 0, fmt.Errorf("%w: worker %d/%d scored %d positions, an earlier worker %d", shard.ErrAssemble, i, n, r.Scored, scored)
		}
		scored = r.Scored
		for _, c := range r.Results {
			results[c.Key] = c
		}
	}
	w := &WeightMeasure{Mode: head.Weights.Mode, Sequences: head.Weights.Sequences, SeqLen: head.Weights.SeqLen}
	return klWeights(w, cand, first.TokenIDsSHA256, scored, groups, results), len(groups), nil
}

// readChangesRecords reads the workers' records in dir, by worker; a
// damaged one (or one with a field this version does not know) is an
// error naming it.
func readChangesRecords(dir string) ([]*changesRecord, error) {
	names, err := filepath.Glob(filepath.Join(dir, "changes-*-of-*.json"))
	if err != nil {
		return nil, err
	}
	var out []*changesRecord
	for _, p := range names {
		r := &changesRecord{}
		if err := jsonx.ReadFile(p, r); err != nil {
			return nil, fmt.Errorf("%w: %w (truncated or damaged: run its worker again)", shard.ErrAssemble, err)
		}
		if r.Format != changesRecordFormat || r.Version != measureSplitVersion {
			return nil, fmt.Errorf("%w: %s: format %q version %d, want %q version %d", shard.ErrAssemble, p, r.Format, r.Version, changesRecordFormat, measureSplitVersion)
		}
		if sp := (shard.Spec{Index: r.Index, Count: r.Count}); !sp.Valid() || changesName(sp)+".json" != filepath.Base(p) {
			return nil, fmt.Errorf("%w: %s: the record names worker %d/%d", shard.ErrAssemble, p, r.Index, r.Count)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}
