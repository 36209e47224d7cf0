package selection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

// SchemaVersion is the version of the sensitivity file and of the
// selection report; it changes when a field is removed or changes meaning.
const SchemaVersion = 2

// sensitivityKind marks a sensitivity file.
const sensitivityKind = "ttquant-sensitivity"

// ErrMismatch is wrapped by the error Check returns for a sensitivity file
// measured on another model, other calibration data, another base plan or
// another layout.
var ErrMismatch = errors.New("sensitivity file does not belong to these inputs")

// Sensitivity is what Measure finds: for every matrix the base plan
// quantizes, its proxy loss under each measured precision, its routed
// tokens and its stored size per format; with the identities of the inputs.
type Sensitivity struct {
	SchemaVersion int    `json:"schema_version"`
	Kind          string `json:"kind"`
	// Model is calib.ModelIdentity of the source directory (config.json
	// and the safetensors files).
	Model string `json:"model"`
	// Calibration identifies the store: its sha256 as a build records it
	// (build.StoreIdentity), its tokens and sequences.
	Calibration manifest.CalibInfo `json:"calibration"`
	// BasePlan is the plan whose quantized matrices are measured; its
	// sha256 is the one a build of it records (build.PlanSHA256).
	BasePlan       PlanRef `json:"base_plan"`
	ExpertsPerFile int     `json:"experts_per_file"`
	// Options are the solver options of the measurement builds.
	Options manifest.BuildParams `json:"options"`
	// Measured lists the BFP formats measured (one store build each).
	Measured []manifest.StoredFormat `json:"measured"`
	Tensors  []TensorSensitivity     `json:"tensors"`
	// KL, when measured, are the weights of the role classes (per layer)
	// from single-change evaluations on held-out calibration text.
	KL *KLWeights `json:"kl_weights,omitempty"`

	// sizesOnly marks Prepare's result: sizes without losses.
	sizesOnly bool
}

// PlanRef names a plan and its content hash.
type PlanRef struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// TensorSensitivity is one quantized matrix of the base plan.
type TensorSensitivity struct {
	Name        string     `json:"name"`
	Role        model.Role `json:"role"`
	Layer       int        `json:"layer"`
	MTP         bool       `json:"mtp,omitempty"`
	Expert      int        `json:"expert"`
	ExpertKind  string     `json:"expert_kind,omitempty"`
	ExpertGroup int        `json:"expert_group"`
	Elements    int64      `json:"elements"`
	Rows        int64      `json:"rows"`
	// Tokens is the number of calibration tokens behind the matrix's
	// Hessian (the routed tokens for a routed expert).
	Tokens int64 `json:"tokens"`
	// Loss maps a candidate ("BFP4_b:gptq", "BFP8_b:rtn", …) to the
	// proxy loss ½·tr(ΔW·H·ΔWᵀ) the build reported, H the per-token
	// Hessian of the matrix's own tokens. Empty when Unmeasured is set.
	Loss map[string]float64 `json:"loss,omitempty"`
	// Bytes maps a stored format to the tensor's stored size in it.
	Bytes map[manifest.StoredFormat]int64 `json:"bytes"`
	// Unmeasured says why the matrix has no loss (no calibration inputs).
	Unmeasured string `json:"unmeasured,omitempty"`
}

// Frequency is the matrix's share of the calibration tokens: 1 for a
// matrix every token passes through, the routing frequency for a routed
// expert.
func (t *TensorSensitivity) Frequency(calibTokens int64) float64 {
	if calibTokens <= 0 || t.Tokens <= 0 {
		return 0
	}
	return min(1, float64(t.Tokens)/float64(calibTokens))
}

// WeightedLoss is the matrix's added error per calibration token under c:
// the proxy loss times Frequency. ok is false when c was not measured.
func (t *TensorSensitivity) WeightedLoss(c Candidate, calibTokens int64) (float64, bool) {
	if c.Format == manifest.StoreAsIs {
		return 0, true
	}
	l, ok := t.Loss[c.String()]
	return l * t.Frequency(calibTokens), ok
}

// MeasureOptions say what Measure measures.
type MeasureOptions struct {
	// Source is the model directory, Calib the calibration store; or,
	// instead of Calib, Data and DataOptions give calibration text (its
	// calibration set), measured by sequential builds.
	Source, Calib string
	// SourceIdentity, when set, is ModelIdentity(Source) as the caller
	// already computed it (hashing a large model twice costs a full read).
	SourceIdentity string
	Data           *dataset.Spec
	DataOptions    dataset.Options
	AllowShortData bool
	// Base is the plan whose quantized matrices are measured; the
	// selected plan keeps its rules for everything else.
	Base       *plan.Plan
	Candidates []Candidate
	// Scratch is an empty directory for the measurement builds (one
	// subdirectory per format); the caller removes it.
	Scratch                   string
	Workers                   int
	ExpertsPerFile            int
	GPTQOptions               *gptq.Options
	AllowSyntheticCalibration bool
	Progress                  func(build.ProgressEvent)
	Family                    model.Family
	// Weights, when set, also measures the weights (KL per unit of proxy
	// loss) by single-change evaluations after the builds.
	Weights *WeightMeasure
}

// Validate checks the options before any I/O.
func (o *MeasureOptions) Validate() error {
	switch {
	case o.Source == "":
		return errors.New("selection: no source model")
	case o.Calib == "" && o.Data == nil:
		return errors.New("selection: no calibration store or text")
	case o.Calib != "" && o.Data != nil:
		return errors.New("selection: a calibration store and calibration text are exclusive")
	case o.Base == nil:
		return errors.New("selection: no base plan")
	case len(bfpFormats(o.Candidates)) == 0:
		return errors.New("selection: no BFP candidate to measure")
	case o.Workers < 0:
		return fmt.Errorf("selection: %d workers", o.Workers)
	}
	if _, err := o.Base.Validate(); err != nil {
		return err
	}
	if o.Weights != nil {
		if err := o.Weights.Validate(); err != nil {
			return err
		}
	}
	if o.GPTQOptions != nil {
		return o.GPTQOptions.Validate()
	}
	return nil
}

// ModelIdentity is the identity a sensitivity file records for a source
// (a directory, or a file whose directory is taken).
func ModelIdentity(src string) (string, error) {
	if _, err := os.Stat(src); err != nil {
		return "", err
	}
	return calib.ModelIdentity(model.Dir(src))
}

// measurementPlan is base with every quantized rule in format f with GPTQ:
// its build reports, per matrix, GPTQ's and rounding's proxy loss in f.
func measurementPlan(base *plan.Plan, f manifest.StoredFormat) *plan.Plan {
	p := &plan.Plan{Name: base.Name + "-measure-" + string(f), Description: "sensitivity measurement: every quantized matrix of " + base.Name + " in " + string(f) + " with GPTQ"}
	for _, r := range base.Rules {
		if r.Format.IsBFP() {
			r.Format, r.Method = f, manifest.MethodGPTQ
		}
		p.Rules = append(p.Rules, r)
	}
	return p
}

// Prepare resolves the base plan and the measurement plans against the
// model's headers: every quantized matrix with its sizes, no losses. A
// matrix without calibration inputs (no site, outside the layers) is marked
// unmeasured as the build will find it. It reads no tensor data, so a
// command checks a byte budget against it before measuring.
func Prepare(opt MeasureOptions) (*Sensitivity, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	base, _ := opt.Base.Validate()
	if opt.ExpertsPerFile == 0 {
		opt.ExpertsPerFile = manifest.DefaultExpertsPerFile
	}
	modelID := opt.SourceIdentity
	if modelID == "" {
		var err error
		if modelID, err = ModelIdentity(opt.Source); err != nil {
			return nil, fmt.Errorf("selection: model identity of %s: %w", opt.Source, err)
		}
	}
	planSHA := build.PlanSHA256(opt.Base)
	m, err := safetensors.OpenModel(opt.Source)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	fam := opt.Family
	if fam == nil {
		fam = model.Qwen3
	}
	cfg, err := plan.ConfigBeside(m, fam) // once, for every plan resolved below
	if err != nil {
		return nil, err
	}
	ropt := plan.ResolveOptions{ExpertsPerFile: opt.ExpertsPerFile, Family: fam, Config: cfg}
	res, err := base.ResolveWith(m, ropt)
	if err != nil {
		return nil, err
	}
	s := &Sensitivity{SchemaVersion: SchemaVersion, Kind: sensitivityKind, Model: modelID,
		BasePlan: PlanRef{base.Name, planSHA}, ExpertsPerFile: opt.ExpertsPerFile, Measured: bfpFormats(opt.Candidates)}
	byName := map[string]int{}
	for _, t := range res.Tensors {
		if !t.IsBFP() {
			continue
		}
		byName[t.Name] = len(s.Tensors)
		ts := TensorSensitivity{Name: t.Name, Role: t.Role, Layer: t.Layer, MTP: t.MTP,
			Expert: t.Expert, ExpertKind: t.ExpertKind, ExpertGroup: t.ExpertGroup, Elements: t.Elements(), Rows: t.Shape[0],
			Loss: map[string]float64{}, Bytes: map[manifest.StoredFormat]int64{manifest.StoreAsIs: t.SourceBytes}}
		down := t.Role == model.RoleSharedDown || t.Role == model.RoleMLPDown
		if t.Layer < 0 || (!down && fam.Site(t.Role) == "") {
			ts.Unmeasured = "no calibration inputs are defined for this matrix"
		}
		s.Tensors = append(s.Tensors, ts)
	}
	if len(s.Tensors) == 0 {
		return nil, fmt.Errorf("selection: plan %q quantizes no matrix of %s", base.Name, opt.Source)
	}
	for _, f := range s.Measured {
		mres, err := measurementPlan(base, f).ResolveWith(m, ropt)
		if err != nil {
			return nil, err
		}
		for _, t := range mres.Tensors {
			if i, ok := byName[t.Name]; ok {
				s.Tensors[i].Bytes[f] = t.StoredBytes
			}
		}
	}
	s.sizesOnly = true
	return s, nil
}

// MeasurePrepared runs one GPTQ build per BFP format among the candidates
// and completes what Prepare returned for the same options with every
// quantized matrix's proxy losses (and, with opt.Weights, the measured
// weights): the model is not hashed nor the plans resolved again. Run is
// the whole selection around it.
func MeasurePrepared(ctx context.Context, opt MeasureOptions, s *Sensitivity) (*Sensitivity, error) {
	if opt.ExpertsPerFile == 0 {
		opt.ExpertsPerFile = manifest.DefaultExpertsPerFile
	}
	if opt.Workers == 0 {
		opt.Workers = 1
	}
	if opt.Scratch == "" {
		return nil, errors.New("selection: no scratch directory for the measurement builds")
	}
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if s == nil || !s.sizesOnly {
		return nil, errors.New("selection: MeasurePrepared needs the result of Prepare")
	}
	var ho *heldOut
	if opt.Weights != nil {
		var err error
		if ho, err = prepareHeldOut(opt); err != nil {
			return nil, err
		}
	}
	s.beginMeasurement()
	for _, f := range bfpFormats(opt.Candidates) {
		br, err := build.GPTQ(ctx, measurementBuild(opt, f, measureDir(opt.Scratch, f), shard.Spec{}))
		if err != nil {
			return nil, fmt.Errorf("selection: measuring %s: %w", f, err)
		}
		if err := s.addMeasurement(f, br.Manifest); err != nil {
			return nil, err
		}
	}
	s.finishMeasurement()
	if opt.Weights != nil {
		f, err := changeFormat(s.Measured)
		if err != nil {
			return nil, err
		}
		if s.KL, err = measureWeights(ctx, s, opt, ho, f, measureDir(opt.Scratch, f)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// measureDir is the measurement build of format f in scratch.
func measureDir(scratch string, f manifest.StoredFormat) string {
	return filepath.Join(scratch, "measure-"+string(f))
}

// measurementBuild is the options of the measurement build of format f
// into out (worker sp of a split one, or the whole build).
func measurementBuild(opt MeasureOptions, f manifest.StoredFormat, out string, sp shard.Spec) build.BuildOptions {
	base, _ := opt.Base.Validate()
	return build.BuildOptions{Source: opt.Source, Out: out, Plan: measurementPlan(base, f),
		Workers: opt.Workers, ExpertsPerFile: opt.ExpertsPerFile, Calib: opt.Calib, Layers: "all", GPTQOptions: opt.GPTQOptions,
		Data: opt.Data, DataOptions: opt.DataOptions, AllowShortData: opt.AllowShortData,
		AllowSyntheticCalibration: opt.AllowSyntheticCalibration, Progress: opt.Progress, Family: opt.Family, Shard: sp}
}

// beginMeasurement clears what Prepare guessed of s before the
// measurement builds' results are added.
func (s *Sensitivity) beginMeasurement() {
	s.sizesOnly = false
	s.Measured = nil
	for i := range s.Tensors {
		s.Tensors[i].Unmeasured = ""
		if s.Tensors[i].Loss == nil {
			s.Tensors[i].Loss = map[string]float64{}
		}
	}
}

// addMeasurement adds the proxy losses the measurement build of format f
// recorded in its manifest m.
func (s *Sensitivity) addMeasurement(f manifest.StoredFormat, m *manifest.Manifest) error {
	tq := m.TTQuant
	if tq.Calibration == nil {
		return fmt.Errorf("selection: the %s measurement build recorded no calibration", f)
	}
	if s.Calibration.SHA256 == "" {
		s.Calibration = manifest.CalibInfo{Sequences: tq.Calibration.Sequences, Tokens: tq.Calibration.Tokens, SHA256: tq.Calibration.SHA256, Mode: tq.Calibration.Mode}
		s.Options = tq.Options
		s.Options.Layers = ""
	}
	s.Measured = append(s.Measured, f)
	byName := make(map[string]int, len(s.Tensors))
	for i := range s.Tensors {
		byName[s.Tensors[i].Name] = i
	}
	for _, ms := range tq.Matrices {
		i, ok := byName[ms.Tensor]
		if !ok {
			continue
		}
		t := &s.Tensors[i]
		if ms.Method != manifest.MethodGPTQ {
			t.Unmeasured = ms.Fallback
			if t.Unmeasured == "" {
				t.Unmeasured = "rounded to nearest in the measurement build"
			}
			continue
		}
		t.Tokens = ms.Tokens
		t.Loss[Candidate{f, manifest.MethodGPTQ}.String()] = ms.ProxyLoss
		t.Loss[Candidate{f, manifest.MethodRTN}.String()] = ms.RTNProxyLoss
	}
	return nil
}

// finishMeasurement marks the matrices no build measured.
func (s *Sensitivity) finishMeasurement() {
	for i := range s.Tensors {
		t := &s.Tensors[i]
		if t.Unmeasured == "" && len(t.Loss) == 0 {
			t.Unmeasured = "no statistics in the measurement build"
		}
		if t.Unmeasured != "" {
			t.Loss = nil
		}
	}
}

// CalibrationIdentity is the identity a build records for the calibration
// data of opt (manifest.CalibInfo.SHA256), which Check compares: the hash
// of a store's files, or the sha256 of the token ids of the text's
// calibration set (tokenized here, nothing else run).
func CalibrationIdentity(ctx context.Context, opt MeasureOptions) (string, error) {
	if opt.Data == nil {
		return build.StoreIdentity(ctx, opt.Calib, opt.Workers)
	}
	tok, err := tokenizer.Load(opt.Source)
	if err != nil {
		return "", err
	}
	dopt := opt.DataOptions
	dopt.Evaluation = dataset.SetOptions{}
	res, _, err := dataset.BuildCalibration(opt.Data, tok, dopt, opt.AllowShortData, nil)
	if err != nil {
		return "", err
	}
	return res.Provenance.Calibration.TokenIDsSHA256, nil
}

// Save writes s as indented JSON (write-then-rename).
func (s *Sensitivity) Save(path string) error {
	b, err := s.marshal()
	if err != nil {
		return err
	}
	_, err = atomicfile.WriteFile(path, b)
	return err
}

// marshal is the bytes Save writes.
func (s *Sensitivity) marshal() ([]byte, error) {
	b, err := json.MarshalIndent(s, "", "  ")
	return append(b, '\n'), err
}

// LoadSensitivity reads a sensitivity file; unknown fields, another kind
// or schema version are errors.
func LoadSensitivity(path string) (*Sensitivity, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var s Sensitivity
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("selection: %s: %w", path, err)
	}
	switch {
	case s.Kind != sensitivityKind:
		return nil, fmt.Errorf("selection: %s is not a sensitivity file (kind %q)", path, s.Kind)
	case s.SchemaVersion != SchemaVersion:
		return nil, fmt.Errorf("selection: %s has schema_version %d, want %d", path, s.SchemaVersion, SchemaVersion)
	case len(s.Tensors) == 0:
		return nil, fmt.Errorf("selection: %s lists no matrix", path)
	}
	return &s, nil
}

// Check refuses s when it was measured on another model, store, base plan
// or expert layout than the ones given.
func (s *Sensitivity) Check(modelID, storeID string, base *plan.Plan, expertsPerFile int) error {
	planSHA := build.PlanSHA256(base)
	switch {
	case s.Model != modelID:
		return fmt.Errorf("selection: %w: measured on model %s, not %s", ErrMismatch, s.Model, modelID)
	case s.Calibration.SHA256 != storeID:
		what := "calibration store"
		if s.Calibration.Mode == manifest.CalibModeSequential {
			what = "calibration text (the sha256 of its token ids)"
		}
		return fmt.Errorf("selection: %w: measured on %s %s, not %s", ErrMismatch, what, s.Calibration.SHA256, storeID)
	case s.BasePlan.SHA256 != planSHA:
		return fmt.Errorf("selection: %w: measured for base plan %q (sha256 %s), not %q (%s)", ErrMismatch, s.BasePlan.Name, s.BasePlan.SHA256, base.Name, planSHA)
	case s.ExpertsPerFile != expertsPerFile:
		return fmt.Errorf("selection: %w: measured with %d experts per file, not %d", ErrMismatch, s.ExpertsPerFile, expertsPerFile)
	}
	return nil
}
