package build

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/par"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

// BuildOptions configure Convert and GPTQ.
type BuildOptions struct {
	// Source is the source checkpoint: a .safetensors file, a directory or
	// a *.index.json.
	Source string
	// Out is the output directory. It is created if needed; an existing
	// unfinished build of the same inputs there is resumed.
	Out string
	// Plan is the precision plan.
	Plan *plan.Plan
	// Workers is the number of files produced at once (default 1). The
	// output does not depend on it.
	Workers int
	// ExpertsPerFile (default DefaultExpertsPerFile) and DenseShardBytes
	// (default DefaultDenseShardBytes) shape the layout.
	ExpertsPerFile  int
	DenseShardBytes int64
	// Progress, when set, receives progress events from the calling
	// goroutine's workers; it must be safe for concurrent use.
	Progress func(ProgressEvent)

	// Exponent is the rule choosing each BFP group's shared exponent, in
	// GPTQ and in every tensor rounded to nearest (0: gptq.ExpMax, the
	// packer's rule). With gptq.ExpSearch, rounding is weighted by the
	// diagonal of the tensor's input Hessian when the build has
	// calibration rows and the tensor a calibration site, unweighted
	// otherwise. A rule other than ExpMax for a plan without BFP tensors
	// is an error.
	Exponent gptq.ExponentRule

	// GPTQ builds (and Convert's Calib).

	// Calib is the calibration store path (the store build: every layer's
	// inputs come from the source model). Convert accepts one only with
	// Exponent gptq.ExpSearch, to weight the rounding.
	Calib string
	// Data, instead of Calib, makes the build sequential: the calibration
	// text is tokenized with the source's tokenizer and packed as
	// DataOptions says (its calibration set only), the model runs on the
	// CPU layer by layer, and each layer is quantized against the inputs
	// the already-quantized layers before it produce.
	Data        *dataset.Spec
	DataOptions dataset.Options
	// AllowShortData builds with what the text gives when it gives fewer
	// calibration tokens than DataOptions ask for; without it such text is
	// refused (dataset.ErrShortText) before anything is written.
	AllowShortData bool
	// Asymmetric fits every GPTQ'd matrix to the source model's outputs on
	// the source model's inputs rather than to the source weights' outputs
	// on the inputs it is given: each matrix is moved to the least-squares
	// fit of that output on its real input before GPTQ
	// (calib.AsymmetricTarget). In a sequential build the source model
	// runs alongside on every calibration sequence (a second forward pass
	// and residual stream) and every matrix is fitted; in a store build the
	// inputs are the source model's, so only down projections change: they
	// are fitted through the quantized gate and up projections before them.
	Asymmetric bool
	// AllowSyntheticCalibration accepts a calibration store whose
	// provenance says it holds synthetic activations (calib.SynthesizeStore).
	// Without it such a store is refused with ErrSyntheticCalibration
	// before anything is written: GPTQ on synthetic activations can be
	// worse than rounding.
	AllowSyntheticCalibration bool
	// Layers selects the matrices GPTQ handles: "experts", "dense", "all",
	// "plan" (the matrices the plan gives method gptq, the others rounded)
	// or a regular expression over stored tensor names.
	Layers string
	// GPTQOptions are the solver options (zero value: gptq.DefaultOptions).
	// Their Exponent must be 0 or equal Exponent.
	GPTQOptions *gptq.Options
	// Hessians, when set, supplies the Hessians instead of Calib (the demo
	// and tests use it).
	Hessians HessianSource
	// CalibInfo identifies the Hessians' calibration data when Hessians is
	// set.
	CalibInfo *manifest.CalibInfo

	// HeldOutSequences is the number of final calibration sequences kept
	// out of the Hessians to measure each GPTQ layer's held-out block
	// error (0: none, no held-out statistics).
	HeldOutSequences int

	// AllowNonFinite stores tensors whose source holds NaN or Inf (rounded
	// as they come: a BFP block with one loses its other values) instead
	// of refusing the build; the manifest lists them under
	// ttquant.nonfinite_tensors and BuildResult.NonFinite names them.
	AllowNonFinite bool

	// DryRun plans the work and reports it without reading tensor data or
	// writing anything.
	DryRun bool
	// Tool identifies the program recorded in the manifest: commands pass
	// their build information; the zero value records "ttquant (devel)".
	Tool manifest.ToolInfo
	// Faults, when set, wraps the writer of every file the build writes
	// (atomicfile.Faults): fault injection for tests, which make writes
	// fail as a full disk would. Nil in normal use.
	Faults atomicfile.Faults
	// Parent is the sha256 of the manifest this checkpoint derives from.
	Parent string
	// Family is the source's model family (default model.Qwen3): its
	// tensor roles, config.json and calibration sites.
	Family model.Family

	// Shard, when it names one of several workers (Count > 1), makes this
	// process one worker of a split build: the build's files are divided
	// into units (shard.go), every worker computes the same partition, and
	// this one writes only its units' files and a record of them; Assemble
	// then writes the manifest. The zero value (and 0/1) is the whole
	// build. Sequential builds (Data) are not split: every layer depends on
	// the quantized layers before it.
	Shard shard.Spec

	// testHook, when set, is called after every tensor written (with the
	// file and tensor name) and after every file committed (tensor "").
	testHook func(file, tensor string)
	// freeSpace, when set, stands in for the free space of the output's
	// file system (freeAt).
	freeSpace func(dir string) (int64, string)
}

// HessianSource supplies the Hessian of a stored matrix: a cols×cols matrix
// over the input features, and the number of tokens behind it. A nil
// Hessian with a fallback reason (a *calib.FallbackError, of kind
// calib.ErrNoInputs for missing inputs) means GPTQ cannot run for that
// matrix; the builder falls back to RTN and records the reason. err is a
// failure that stops the build.
type HessianSource interface {
	Hessian(ctx context.Context, tensor string, layer, expert int, cols int) (h []float64, tokens int64, fallback *calib.FallbackError, err error)
}

// BuildResult is what a build produced.
type BuildResult struct {
	Dir      string
	Identity string
	CacheKey string
	Files    int
	Tensors  int
	Bytes    int64
	// Kept is the number of data files a resumed run kept.
	Kept int
	// AlreadyComplete is set when the directory already held this
	// checkpoint and nothing was written.
	AlreadyComplete bool
	Manifest        *manifest.Manifest
	// NonFinite names the stored tensors whose source holds NaN or Inf
	// (only with BuildOptions.AllowNonFinite).
	NonFinite []string
	// Work is the planned work (always set; the only result of a dry run).
	Work *WorkSummary
}

// WorkSummary describes the work a build does.
type WorkSummary struct {
	Plan          string         `json:"plan"`
	SourceTensors int            `json:"source_tensors"`
	Tensors       int            `json:"stored_tensors"`
	Files         int            `json:"files"`
	ExpertFiles   int            `json:"expert_files"`
	DenseFiles    int            `json:"dense_files"`
	Methods       map[string]int `json:"tensors_by_method"`
	Formats       map[string]int `json:"tensors_by_format"`
	SourceBytes   int64          `json:"source_bytes"`
	OutputBytes   int64          `json:"output_bytes"`
	GPTQMatrices  int            `json:"gptq_matrices"`
	// GPTQFlops is an estimate of the solver's floating-point work: per
	// matrix the Cholesky and inverse of the Hessian (cols³) plus the
	// column updates (2·rows·cols²).
	GPTQFlops float64 `json:"gptq_flops"`
	Layers    []int   `json:"layers"`
	// MoE sizes the routed experts that GPTQ handles (nil when none).
	MoE *MoEWork `json:"moe,omitempty"`
	// Sequential sizes a sequential build from text (dry runs with
	// BuildOptions.Data; nil otherwise).
	Sequential *SequentialWork `json:"sequential,omitempty"`
	// Shards is the partition of a split build (BuildOptions.Shard).
	Shards *ShardWork `json:"shards,omitempty"`
}

// MoEWork is the shape of the GPTQ expert work: layers, experts per layer,
// hidden size and expert width.
type MoEWork struct {
	Layers          int `json:"layers"`
	ExpertsPerLayer int `json:"experts_per_layer"`
	Hidden          int `json:"hidden"`
	ExpertWidth     int `json:"expert_width"`
}

// buildKind distinguishes Convert from GPTQ.
type buildKind int

const (
	kindConvert buildKind = iota
	kindGPTQ
)

// Convert builds a native checkpoint with round-to-nearest for every
// quantized tensor.
func Convert(ctx context.Context, opt BuildOptions) (*BuildResult, error) {
	return build(ctx, kindConvert, opt)
}

// GPTQ builds a native checkpoint with GPTQ for the matrices opt.Layers
// selects and round-to-nearest for the other quantized ones.
func GPTQ(ctx context.Context, opt BuildOptions) (*BuildResult, error) {
	return build(ctx, kindGPTQ, opt)
}

type builder struct {
	kind     buildKind
	opt      BuildOptions
	model    *safetensors.Model
	tensors  []*storedTensor
	jobs     []*job
	params   manifest.BuildParams
	gopt     gptq.Options
	selector func(*storedTensor) bool
	hess     HessianSource
	calib    *manifest.CalibInfo
	// rule is the exponent rule of every BFP tensor (BuildOptions.Exponent,
	// gptq.ExpMax for 0).
	rule     gptq.ExponentRule
	progress func(ProgressEvent)
	track    *tracker // the running build's progress (run)

	// GPTQ expert layers: their expert files are produced per layer by the
	// calibration driver.
	gptqLayers map[int]bool
	store      *calib.Store
	modelCfg   *model.Config
	// seq runs a sequential build (BuildOptions.Data).
	seq *sequential
	// wasFinished is set when the output directory held a finished build
	// of the same inputs.
	wasFinished bool
	// srcInfo and srcConfigs are the source's hashes, computed once;
	// srcBad the non-finite elements the hashing found, per source tensor.
	srcInfo    *manifest.SourceInfo
	srcConfigs []string
	srcBad     map[string]*sourceBad

	// A worker of a split build (shard.go): the units and their workers,
	// this worker's jobs and, per GPTQ layer, its routed experts.
	units        []shardUnit
	unitOwner    []int
	owned        map[int]bool
	layerExperts map[int][]int
	ownedParts   []*storedTensor
	shardWork    *ShardWork
}

// fingerprint is what a resumed build must share with the interrupted one.
type fingerprint struct {
	Command     string               `json:"command"`
	Tool        manifest.ToolInfo    `json:"tool"`
	Source      string               `json:"source_identity"`
	Plan        string               `json:"plan_sha256"`
	Calibration string               `json:"calibration_sha256,omitempty"`
	Options     manifest.BuildParams `json:"options"`
	Parent      string               `json:"parent,omitempty"`
}

// fileRecord is the bookkeeping of one finished file of an unfinished
// build: enough to rebuild its part of the manifest without redoing it.
type fileRecord struct {
	File     manifest.FileEntry     `json:"file"`
	Tensors  []manifest.TensorEntry `json:"tensors"`
	Matrices []manifest.MatrixStats `json:"matrices,omitempty"`
}

// MaxExpertsPerFile bounds BuildOptions.ExpertsPerFile.
const MaxExpertsPerFile = 1 << 16

// Validate reports the first option out of range, before any I/O: a
// missing source, output directory or plan, an invalid plan, negative
// workers, experts per file or dense shard size, a parent that is not a
// sha256, an invalid layer selection, negative held-out sequences or
// invalid GPTQ options (gptq.Options.Validate). Zero values select the
// defaults. Convert and GPTQ call it first.
func (opt BuildOptions) Validate() error {
	switch {
	case opt.Source == "":
		return errors.New("build: no source checkpoint given")
	case opt.Out == "" && !opt.DryRun:
		return errors.New("build: no output directory given")
	case opt.Plan == nil:
		return errors.New("build: no plan given")
	case opt.Workers < 0:
		return fmt.Errorf("build: workers %d: want at least 1 (0 for the default)", opt.Workers)
	case opt.ExpertsPerFile < 0 || opt.ExpertsPerFile > MaxExpertsPerFile:
		return fmt.Errorf("build: experts per file %d: want 1 to %d (0 for the default %d)", opt.ExpertsPerFile, MaxExpertsPerFile, manifest.DefaultExpertsPerFile)
	case opt.DenseShardBytes < 0:
		return fmt.Errorf("build: dense shard bytes %d: want at least 1 (0 for the default %d)", opt.DenseShardBytes, manifest.DefaultDenseShardBytes)
	case opt.HeldOutSequences < 0:
		return fmt.Errorf("build: held-out sequences %d: want 0 or more", opt.HeldOutSequences)
	case opt.Data != nil && opt.Calib != "":
		return errors.New("build: calibration text (sequential GPTQ) and a calibration store are exclusive")
	case opt.Asymmetric && opt.Hessians != nil:
		return errors.New("build: --asymmetric (BuildOptions.Asymmetric) needs calibration rows; a Hessian source has none")
	case opt.Asymmetric && opt.Data == nil && opt.Calib == "" && !opt.DryRun:
		return errors.New("build: --asymmetric (BuildOptions.Asymmetric) needs calibration rows: calibration text (--data) or a calibration store (--calib)")
	case opt.Data != nil && opt.Hessians != nil:
		return errors.New("build: calibration text (sequential GPTQ) and a Hessian source are exclusive")
	case opt.Shard != (shard.Spec{}) && !opt.Shard.Valid():
		return fmt.Errorf("build: shard %d/%d names no worker: want 0 ≤ i < N ≤ %d", opt.Shard.Index, opt.Shard.Count, shard.MaxCount)
	case opt.Shard.Count > 1 && opt.Data != nil:
		return errors.New("build: a sequential build (calibration text, --data) cannot be split into shards: each layer is quantized against the quantized layers before it; split a store build (--calib) instead")
	case opt.Shard.Count > 1 && opt.Hessians != nil:
		return errors.New("build: a build from a Hessian source cannot be split into shards")
	case opt.Parent != "" && !hexRe.MatchString(opt.Parent):
		return fmt.Errorf("build: parent %q is not the sha256 (64 lowercase hex digits) of a manifest", opt.Parent)
	}
	if _, err := opt.Plan.Validate(); err != nil {
		return err
	}
	if opt.GPTQOptions != nil {
		if err := opt.GPTQOptions.Validate(); err != nil {
			return err
		}
	}
	if err := checkExponent(opt.Exponent, opt.Plan, opt.GPTQOptions); err != nil {
		return err
	}
	if opt.Layers != "" {
		if _, err := layerSelector(opt.Layers); err != nil {
			return err
		}
	}
	return nil
}

func build(ctx context.Context, kind buildKind, opt BuildOptions) (*BuildResult, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if kind == kindConvert && opt.Calib != "" && opt.Exponent != gptq.ExpSearch {
		return nil, ErrConvertCalib
	}
	if opt.Workers == 0 {
		opt.Workers = 1
	}
	if opt.Family == nil {
		opt.Family = model.Qwen3
	}
	if opt.ExpertsPerFile == 0 {
		opt.ExpertsPerFile = manifest.DefaultExpertsPerFile
	}
	if opt.DenseShardBytes == 0 {
		opt.DenseShardBytes = manifest.DefaultDenseShardBytes
	}
	if !opt.DryRun && opt.Shard.Count > 1 {
		// One process per worker of a split build; the workers share the
		// directory.
		lk, err := shardLock(opt.Out, opt.Shard)
		if err != nil {
			return nil, err
		}
		defer lk.Release()
	} else if !opt.DryRun {
		// One writer per output directory, before anything looks at it.
		lk, err := fslock.Acquire(opt.Out)
		if err != nil {
			return nil, err
		}
		defer lk.Release()
	}
	b := &builder{kind: kind, opt: opt, progress: opt.Progress}
	if b.progress == nil {
		b.progress = func(ProgressEvent) {}
	}
	b.rule = opt.Exponent
	if b.rule == 0 {
		b.rule = gptq.ExpMax
	}
	b.params = manifest.BuildParams{ExpertsPerFile: opt.ExpertsPerFile, DenseShard: opt.DenseShardBytes, BFPExponent: exponentParam(b.rule)}
	if kind == kindGPTQ {
		if err := b.gptqParams(); err != nil {
			return nil, err
		}
	}

	m, err := safetensors.OpenModel(opt.Source)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	b.model = m
	if b.modelCfg, err = checkSourceConfig(opt.Source, m, opt.Family); err != nil {
		return nil, err
	}
	if b.tensors, err = resolveStored(opt.Plan, m, plan.ResolveOptions{ExpertsPerFile: opt.ExpertsPerFile, DenseShardBytes: opt.DenseShardBytes, Family: opt.Family, Config: b.modelCfg}); err != nil {
		return nil, err
	}
	if err := b.assignMethods(); err != nil {
		return nil, err
	}
	if b.jobs, err = planJobs(b.tensors, opt.ExpertsPerFile, opt.DenseShardBytes); err != nil {
		return nil, err
	}
	work := b.summary()
	if opt.Shard.Count > 1 && opt.DryRun {
		if _, _, work.Shards, err = b.partition(); err != nil {
			return nil, err
		}
	}
	if opt.DryRun {
		if kind == kindGPTQ && work.GPTQMatrices > 0 && opt.Data != nil {
			if _, err := b.sequentialTokenizer(); err != nil {
				return nil, err
			}
			work.Sequential = b.sequentialWork(b.modelCfg, work.GPTQMatrices, work.OutputBytes)
		}
		return &BuildResult{Work: work}, nil
	}
	if err := b.openInputs(ctx, work); err != nil {
		return nil, err
	}
	res, err := b.run(ctx)
	if res != nil {
		res.Work = work
		work.Shards = b.shardWork
	}
	return res, err
}

// gptqParams sets a GPTQ build's solver options, layer selection and the
// parameters recorded for them.
func (b *builder) gptqParams() error {
	if b.opt.GPTQOptions != nil {
		b.gopt = *b.opt.GPTQOptions
	} else {
		b.gopt = gptq.DefaultOptions()
	}
	b.gopt.Exponent = b.rule
	layers := b.opt.Layers
	if layers == "" {
		layers = "experts"
	}
	sel, err := layerSelector(layers)
	if err != nil {
		return err
	}
	b.selector = sel
	b.params.Layers = layers
	b.params.BlockSize = b.gopt.BlockSize
	b.params.PercDamp = b.gopt.PercDamp
	b.params.ActOrder = b.gopt.ActOrder
	b.params.StaticGroups = b.gopt.StaticGroups
	b.params.Float64 = b.gopt.Float64
	b.params.NoProxyLoss = b.gopt.NoProxyLoss
	b.params.HeldOut = b.opt.HeldOutSequences
	b.params.Asymmetric = b.opt.Asymmetric
	return nil
}

// openInputs opens what the build's matrices are quantized from: the
// calibration text of a sequential build or the calibration store (in a
// conversion, the store that weights the rounding of gptq.ExpSearch).
func (b *builder) openInputs(ctx context.Context, work *WorkSummary) error {
	switch {
	case b.kind == kindGPTQ && work.GPTQMatrices > 0 && b.opt.Data != nil:
		return b.openSequential(ctx)
	case b.kind == kindGPTQ && work.GPTQMatrices > 0, b.kind == kindConvert && b.opt.Calib != "":
		return b.openCalibration(ctx)
	}
	return nil
}

// assignMethods gives each stored BFP tensor its method: in a GPTQ build
// GPTQ for the matrices --layers selects among those the plan quantizes,
// rounding for the rest; rounding everywhere in a conversion. It records
// the layers whose expert files GPTQ writes (gptqLayers).
func (b *builder) assignMethods() error {
	if b.kind == kindGPTQ {
		selected := 0
		for _, st := range b.tensors {
			if st.isBFP && st.method == manifest.MethodGPTQ && !b.selector(st) {
				st.method = manifest.MethodRTN
			} else if st.isBFP && st.method != manifest.MethodNone && b.selector(st) {
				st.method = manifest.MethodGPTQ
				selected++
			}
		}
		if selected == 0 {
			return fmt.Errorf("manifest: --layers %q selects no matrix that plan %q quantizes", b.params.Layers, b.opt.Plan.Name)
		}
	} else {
		for _, st := range b.tensors {
			if st.isBFP {
				st.method = manifest.MethodRTN
			}
		}
	}
	b.gptqLayers = map[int]bool{}
	for _, st := range b.tensors {
		if st.isBFP && st.method == manifest.MethodGPTQ && st.isExpertMatrix() {
			b.gptqLayers[st.layer] = true
		}
	}
	return nil
}

func (b *builder) summary() *WorkSummary {
	w := &WorkSummary{Plan: b.opt.Plan.Name, Methods: map[string]int{}, Formats: map[string]int{}}
	srcSeen := map[string]bool{}
	layers := map[int]bool{}
	for _, st := range b.tensors {
		for _, p := range st.parts {
			if !srcSeen[p.tensor] {
				srcSeen[p.tensor] = true
				w.SourceTensors++
			}
		}
		w.Tensors++
		w.Methods[string(st.method)]++
		w.Formats[st.format]++
		w.SourceBytes += st.srcLen
		w.OutputBytes += st.outSize
		if st.layer >= 0 {
			layers[st.layer] = true
		}
		if st.method == manifest.MethodGPTQ {
			w.GPTQMatrices++
			_, r, c := manifest.MatDims(st.shape)
			fr, fc := float64(r), float64(c)
			w.GPTQFlops += fc*fc*fc + 2*fr*fc*fc
		}
	}
	for _, j := range b.jobs {
		w.Files++
		if j.role == manifest.FileExperts {
			w.ExpertFiles++
		} else {
			w.DenseFiles++
		}
	}
	for l := range layers {
		w.Layers = append(w.Layers, l)
	}
	experts := map[int]map[int]bool{}
	for _, st := range b.tensors {
		if st.method != manifest.MethodGPTQ || !st.isExpertMatrix() || model.Role(st.role) != model.RoleExpertGateUp || len(st.shape) != 2 {
			continue
		}
		if experts[st.layer] == nil {
			experts[st.layer] = map[int]bool{}
		}
		experts[st.layer][st.expert] = true
		if w.MoE == nil {
			w.MoE = &MoEWork{Hidden: int(st.shape[1]), ExpertWidth: int(st.shape[0] / 2)}
		}
	}
	if w.MoE != nil {
		w.MoE.Layers = len(experts)
		for _, e := range experts {
			w.MoE.ExpertsPerLayer = max(w.MoE.ExpertsPerLayer, len(e))
		}
	}
	sort.Ints(w.Layers)
	return w
}

// layerSelector parses --layers.
func layerSelector(s string) (func(*storedTensor) bool, error) {
	switch s {
	case "experts":
		// The MLP block: routed and shared experts, or a dense layer's
		// MLP, which stands where the experts of an MoE layer do.
		return func(st *storedTensor) bool { return st.isExpertMatrix() || st.isMLPMatrix() }, nil
	case "dense":
		return func(st *storedTensor) bool { return !st.isExpertMatrix() && !st.isMLPMatrix() }, nil
	case "all":
		return func(*storedTensor) bool { return true }, nil
	case "plan":
		// Exactly the matrices the plan gives method gptq: a plan that
		// chooses GPTQ or RTN per matrix (ttquant select) is built as is.
		return func(st *storedTensor) bool { return st.method == manifest.MethodGPTQ }, nil
	}
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, fmt.Errorf("manifest: --layers %q is neither experts, dense, all, plan nor a valid regular expression: %w", s, err)
	}
	return func(st *storedTensor) bool { return re.MatchString(st.name) }, nil
}

// configPatterns name the non-weight files copied from the source
// directory.
var configPatterns = []string{
	"config.json", "generation_config.json", "preprocessor_config.json",
	"video_preprocessor_config.json", "chat_template.*", "tokenizer*",
	"special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
}

// sourceFiles lists the source checkpoint's files: shards, the index and the
// config/tokenizer files, with their paths.
func sourceFiles(src string, m *safetensors.Model) (shards []string, index string, configs []string, err error) {
	for _, f := range m.Files() {
		shards = append(shards, f.Path())
	}
	sort.Strings(shards)
	dir := src
	if fi, statErr := os.Stat(src); statErr == nil && !fi.IsDir() {
		dir = filepath.Dir(src)
		if strings.HasSuffix(src, ".index.json") {
			index = src
		}
	} else if statErr != nil {
		return nil, "", nil, statErr
	} else {
		idx, _ := filepath.Glob(filepath.Join(dir, "*.safetensors.index.json"))
		if len(idx) > 0 {
			sort.Strings(idx)
			index = idx[0]
		}
	}
	seen := map[string]bool{}
	for _, p := range configPatterns {
		ms, _ := filepath.Glob(filepath.Join(dir, p))
		for _, mm := range ms {
			fi, e := os.Stat(mm)
			if e != nil || !fi.Mode().IsRegular() || seen[mm] || strings.HasSuffix(mm, ".safetensors") {
				continue
			}
			seen[mm] = true
			configs = append(configs, mm)
		}
	}
	sort.Strings(configs)
	return shards, index, configs, nil
}

// sourceIdentity hashes the source files (in parallel) and returns the
// source section of the manifest and the config files to copy.
func (b *builder) sourceIdentity(ctx context.Context) (manifest.SourceInfo, []string, error) {
	if b.srcInfo != nil {
		return *b.srcInfo, b.srcConfigs, nil
	}
	si, configs, err := b.hashSource(ctx)
	if err == nil {
		b.srcInfo, b.srcConfigs = &si, configs
	}
	return si, configs, err
}

func (b *builder) hashSource(ctx context.Context) (manifest.SourceInfo, []string, error) {
	shards, index, configs, err := sourceFiles(b.opt.Source, b.model)
	if err != nil {
		return manifest.SourceInfo{}, nil, err
	}
	all := append(append([]string(nil), shards...), configs...)
	if index != "" {
		all = append(all, index)
	}
	// The hashing pass reads every byte of the shards: it also finds the
	// float tensors' NaN and Inf, so that a damaged source is refused
	// before the first layer (checkSourcesFinite).
	byPath := map[string]*safetensors.File{}
	if b.model != nil {
		for _, f := range b.model.Files() {
			byPath[filepath.Clean(f.Path())] = f
		}
	}
	entries := make([]manifest.FileEntry, len(all))
	scans := make([]*finiteScan, len(all))
	err = par.For(ctx, len(all), b.opt.Workers, func(i int) error {
		var scan func(int64, []byte)
		if f := byPath[filepath.Clean(all[i])]; f != nil && i < len(shards) {
			scans[i] = newFiniteScan(f)
			scan = scans[i].chunk
		}
		n, sum, err := manifest.HashFileScan(ctx, all[i], scan)
		if err != nil {
			return err
		}
		entries[i] = manifest.FileEntry{Name: filepath.Base(all[i]), Size: n, SHA256: sum}
		return nil
	})
	if err != nil {
		return manifest.SourceInfo{}, nil, err
	}
	b.srcBad = map[string]*sourceBad{}
	for _, sc := range scans {
		if sc != nil {
			for name, bad := range sc.bad {
				b.srcBad[name] = bad
			}
		}
	}
	si := manifest.SourceInfo{Format: "safetensors"}
	for i, p := range all {
		e := entries[i]
		switch {
		case p == index:
			e.Role = "index"
			si.Index = &e
		case i < len(shards):
			e.Role = "shard"
			si.Files = append(si.Files, e)
		default:
			e.Role = manifest.FileConfig
			si.Files = append(si.Files, e)
		}
	}
	sort.Slice(si.Files, func(i, j int) bool { return si.Files[i].Name < si.Files[j].Name })
	idb, _ := json.Marshal(struct {
		F []manifest.FileEntry
		I *manifest.FileEntry
	}{si.Files, si.Index})
	si.Identity = manifest.SHA256Hex(idb)
	return si, configs, nil
}

// readSlice reads the source bytes of a stored tensor: its parts,
// concatenated.
func readSlice(st *storedTensor) ([]byte, error) {
	buf := make([]byte, st.srcLen)
	pos := int64(0)
	for _, p := range st.parts {
		if err := readPart(p.file, p.tensor, buf[pos:pos+p.len], p.off); err != nil {
			return nil, err
		}
		pos += p.len
	}
	return buf, nil
}

// readPart reads len(dst) bytes of a source tensor's data from offset off.
func readPart(f *safetensors.File, tensor string, dst []byte, off int64) error {
	sr, err := f.SectionReader(tensor)
	if err != nil {
		return err
	}
	if n, err := sr.ReadAt(dst, off); err != nil && !(errors.Is(err, io.EOF) && n == len(dst)) {
		return fmt.Errorf("reading %s from %s: %w", tensor, f.Path(), err)
	}
	return nil
}

// hexRe matches a sha256 in hex.
var hexRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

func intPtr(v int) *int { return &v }
