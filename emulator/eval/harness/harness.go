package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
	"github.com/ttquant/ttquant/manifest"
)

// NumericsCPU is the default numerics mode: decoded weights, float32
// activations and matmuls. The other is device numerics, "device" or
// "device:FIDELITY" (see ParseNumerics).
const NumericsCPU = "cpu"

// Options describe an evaluation. Model, Checkpoints (or Self) and Data are
// required.
type Options struct {
	// Model is the Hugging Face source directory (config.json, safetensors,
	// tokenizer.json): the reference, and the base the checkpoints'
	// decoded tensors are substituted into.
	Model string
	// Checkpoints are the native checkpoint directories, one candidate
	// each.
	Checkpoints []string
	// Labels name the candidates in tables; empty: the directories' base
	// names.
	Labels []string
	// Self adds the source model itself as a candidate labelled "self"
	// (a check of the harness: ΔPPL 0, top-1 1, KL 0 exactly).
	Self bool

	// Data and DataOptions give the evaluation text: the evaluation set
	// that dataset.Build makes of them (DataOptions.Calibration is
	// ignored).
	Data        *dataset.Spec
	DataOptions dataset.Options
	// HeldOutOfCalibration: when a file of Data is a file a candidate's
	// manifest records as its calibration text, only the records that
	// calibration's seeded split held out are scored (its eval fraction
	// and seed replace DataOptions'). For a default that scores a
	// dedicated evaluation file whole and the held-out share of a
	// calibration file.
	HeldOutOfCalibration bool
	// Calib and CalibOptions give the calibration text the checkpoints
	// were made with (the calibration set dataset.Build makes of them):
	// the overlap check fingerprints it. Nil: the fingerprints the
	// checkpoints' manifests record are used, and a checkpoint calibrated
	// on text its manifest does not fingerprint is reported as unchecked.
	Calib        *dataset.Spec
	CalibOptions dataset.Options
	// MaxOverlap is the largest share of the scored tokens that may lie
	// in text shared with the calibration text (0: DefaultMaxOverlap).
	MaxOverlap float64
	// AllowOverlap turns an overlap above MaxOverlap from an error into a
	// warning; AllowedBy names who allowed it, for the messages (empty:
	// "the caller").
	AllowOverlap bool
	AllowedBy    string
	// OverlapRun is the length in tokens of a shared run that counts as
	// overlap with Calib's text (0: dataset.FingerprintRun); a manifest's
	// fingerprint carries its own.
	OverlapRun int

	// Window is the longest window in tokens (0: eval.DefaultWindow);
	// longer sequences are cut into several windows, each from a fresh
	// state.
	Window int
	// Numerics is how the checkpoints' runs compute and keep their
	// key-value cache, as ParseNumerics parses it once from its two
	// spellings; the zero value is float32 on the CPU with a float32
	// cache. The reference and the Self candidate always run in float32.
	Numerics Numerics
	// Workers is the number of goroutines Run starts for itself: windows
	// and candidates evaluated, weights decoded, the scorer's (0:
	// GOMAXPROCS). Run sets no process-wide setting from it: how many
	// goroutines the kernels under the forward pass use is
	// kernels.SetWorkers, the program's to choose. Results depend on
	// neither.
	Workers int
	// Chunk is the number of positions scored at a time (0: 16).
	Chunk int
	// Stream reads every layer's weights from the checkpoints for each
	// window instead of keeping every run's float32 weights in memory
	// after first use (which needs 4 bytes per parameter per run: fine for
	// small models, not for a 35B one). Results are the same.
	Stream bool

	// Shard, when it names one of several workers (Count > 1), makes the
	// run one worker of a split evaluation: it scores only its share of
	// the windows and writes their scores to Parts (split.go); a run with
	// Assemble then merges the shares into the table one process computes,
	// bit for bit. Every other option must be the same in every run.
	Shard shard.Spec
	Parts string
	// Assemble is the directory of a split evaluation's parts: the windows
	// are not run again but their recorded scores merged.
	Assemble string

	// Progress receives eval.Evaluate's progress after every window.
	Progress func(eval.Progress)
	// Log receives one line per step and every warning (for stderr).
	Log func(msg string)
}

// Report is the outcome: the result tables and what was checked.
type Report struct {
	*eval.Result
	// Warnings are also in the result's Data (overlap and unchecked
	// calibration).
	Warnings []string `json:"-"`
	// Part, for a worker of a split evaluation, is the part it wrote (and
	// Result is nil).
	Part *PartInfo `json:"-"`
}

// ReferenceIdentity identifies the source model run as the reference.
type ReferenceIdentity struct {
	Dir      string `json:"dir"`
	Family   string `json:"family"`
	Layers   int    `json:"layers"`
	Vocab    int    `json:"vocab"`
	Tokenize string `json:"tokenizer_json_sha256"`
}

// CandidateIdentity identifies a checkpoint run as a candidate.
type CandidateIdentity struct {
	Dir string `json:"dir"`
	// Identity is the checkpoint's identity (manifest.Identity); empty for
	// the source model evaluated against itself.
	Identity       string              `json:"identity,omitempty"`
	SourceIdentity string              `json:"source_identity,omitempty"`
	Plan           string              `json:"plan,omitempty"`
	Command        string              `json:"command,omitempty"`
	Calibration    *manifest.CalibInfo `json:"calibration,omitempty"`
	Tensors        int                 `json:"tensors_substituted"`
}

// DataInfo is recorded as the result's Data.
type DataInfo struct {
	Provenance dataset.Provenance `json:"provenance"`
	// Window is the longest window; Windows the number run; Split the
	// number of sequences cut into several windows; Unscorable the masked
	// tokens nothing predicts (each window's first token).
	// Selection says which records were scored and why.
	Selection  string      `json:"selection"`
	Window     int         `json:"window"`
	Windows    int         `json:"windows"`
	Split      int         `json:"split_sequences"`
	Unscorable int         `json:"unscorable_masked_tokens"`
	Overlap    OverlapInfo `json:"overlap"`
}

// DefaultMaxOverlap is the largest share of the scored tokens that may lie
// in text shared with the calibration text.
const DefaultMaxOverlap = 0.01

// OverlapInfo records the check of evaluation against calibration text.
type OverlapInfo struct {
	// Checked says whether a calibration fingerprint was checked against;
	// From says where each came from ("--calib-data", or the manifest of
	// a candidate) and Shingles how many sampled runs they hold.
	Checked  bool     `json:"checked"`
	Run      int      `json:"run_tokens,omitempty"`
	From     []string `json:"from,omitempty"`
	Shingles int      `json:"calibration_shingles,omitempty"`
	// SharedTokens of the ScoredTokens lie in a run shared with the
	// calibration text (boilerplate excepted): Share of them, refused
	// above MaxShare unless AllowedBy allowed it.
	ScoredTokens int64   `json:"scored_tokens"`
	SharedTokens int64   `json:"shared_tokens"`
	Share        float64 `json:"share"`
	MaxShare     float64 `json:"max_share"`
	AllowedBy    string  `json:"allowed_by,omitempty"`
	// Windows is the number of evaluation windows with a shared token,
	// First up to 10 of them.
	Windows int         `json:"windows"`
	First   []OverlapAt `json:"first,omitempty"`
	// Unchecked lists the candidates calibrated on text this run has no
	// fingerprint of, with why.
	Unchecked []string `json:"unchecked,omitempty"`
	Warnings  []string `json:"warnings,omitempty"`
}

// OverlapAt names an evaluation window holding text shared with the
// calibration text: the sequence it was cut from, the position of its
// first shared token in it, and the data file (and line) of that text.
type OverlapAt struct {
	Window   int    `json:"window"`
	Corpus   string `json:"corpus"`
	Sequence int    `json:"sequence"`
	At       int    `json:"at"`
	Where    string `json:"where,omitempty"`
}

func (o OverlapAt) String() string {
	s := fmt.Sprintf("%s sequence %d, token %d", o.Corpus, o.Sequence, o.At)
	if o.Where != "" {
		s += " (" + o.Where + ")"
	}
	return s
}

// Settings is recorded as the result's Settings.
type Settings struct {
	// Numerics is the candidates' numerics (Numerics.String); KVCache the
	// KV cache format.
	Numerics string `json:"numerics"`
	KVCache  string `json:"kv_cache"`
	Chunk    int    `json:"chunk"`
}

// OverlapError is returned when more than the allowed share of the scored
// tokens lies in text shared with the calibration text and AllowOverlap is
// not set.
type OverlapError struct {
	Info OverlapInfo
}

func (e *OverlapError) Error() string {
	return overlapText(&e.Info) + "; evaluate on other text"
}

// overlapText says how much of the evaluation text is shared, with what,
// and the limit.
func overlapText(o *OverlapInfo) string {
	s := fmt.Sprintf("%.2f%% of the scored tokens (%d of %d, in %d windows) lie in runs of %d tokens shared with the calibration text (fingerprint from %s)",
		100*o.Share, o.SharedTokens, o.ScoredTokens, o.Windows, o.Run, strings.Join(o.From, ", "))
	if len(o.First) > 0 {
		s += ", first at " + o.First[0].String()
	}
	return s + fmt.Sprintf(", above the %.2f%% allowed", 100*o.MaxShare)
}

func (o *Options) log(format string, args ...any) {
	if o.Log != nil {
		o.Log(fmt.Sprintf(format, args...))
	}
}

func (o *Options) check() error {
	if o.Model == "" {
		return errors.New("harness: no source model")
	}
	if len(o.Checkpoints) == 0 && !o.Self {
		return errors.New("harness: no checkpoint to evaluate")
	}
	if o.Labels != nil && len(o.Labels) != len(o.Checkpoints) {
		return fmt.Errorf("harness: %d labels for %d checkpoints", len(o.Labels), len(o.Checkpoints))
	}
	if o.Data == nil {
		return errors.New("harness: no evaluation data")
	}
	if !o.DataOptions.Evaluation.Requested() {
		return errors.New("harness: the data options request no evaluation sequences")
	}
	if o.Calib != nil && !o.CalibOptions.Calibration.Requested() {
		return errors.New("harness: the calibration data options request no calibration sequences")
	}
	if err := o.Numerics.validate(); err != nil {
		return err
	}
	if !(o.MaxOverlap >= 0 && o.MaxOverlap < 1) {
		return fmt.Errorf("harness: maximum overlap %v: want a share 0 ≤ f < 1", o.MaxOverlap)
	}
	if o.OverlapRun < 0 || o.OverlapRun == 1 {
		return fmt.Errorf("harness: overlap runs of %d tokens; want at least 2", o.OverlapRun)
	}
	if o.Window < 0 || o.Window == 1 {
		return fmt.Errorf("harness: window of %d tokens; want at least 2", o.Window)
	}
	if o.Workers < 0 || o.Chunk < 0 {
		return fmt.Errorf("harness: workers %d, chunk %d: want ≥ 0", o.Workers, o.Chunk)
	}
	switch {
	case o.Shard != (shard.Spec{}) && !o.Shard.Valid():
		return fmt.Errorf("harness: shard %d/%d names no worker", o.Shard.Index, o.Shard.Count)
	case o.Shard.Count > 1 && o.Parts == "":
		return errors.New("harness: a worker of a split evaluation needs a directory for its part")
	case o.Shard.Count <= 1 && o.Parts != "":
		return errors.New("harness: a directory for parts is for the workers of a split evaluation")
	case o.Assemble != "" && o.Shard.Count > 1:
		return errors.New("harness: a worker of a split evaluation does not also merge the parts")
	}
	return nil
}

// Run evaluates the checkpoints against the source model. Every check that
// can refuse the run (options, checkpoints, data, overlap) happens before
// the first window runs.
func Run(ctx context.Context, opt Options) (*Report, error) {
	if err := opt.check(); err != nil {
		return nil, err
	}
	num := opt.Numerics
	kv := KVCacheF32
	if num.KVBFP8 {
		kv = KVCacheBFP8
	}
	window := opt.Window
	if window == 0 {
		window = eval.DefaultWindow
	}
	chunk := opt.Chunk
	if chunk == 0 {
		chunk = 16
	}
	workers := opt.Workers
	if workers == 0 {
		workers = runtime.GOMAXPROCS(0)
	}

	ref, err := forward.Open(opt.Model)
	if err != nil {
		return nil, err
	}
	defer ref.Close()
	ref.Resident = !opt.Stream
	cfg := ref.Config
	tok, err := tokenizer.Load(opt.Model)
	if err != nil {
		return nil, err
	}

	// Candidates: the checkpoints' decoded tensors over the source.
	var (
		cands   []eval.Model
		infos   []eval.RunInfo
		names   []string
		calibed []string
		// calibInfos are the calibrated candidates' calibration sections.
		calibInfos []*manifest.CalibInfo
	)
	for i, dir := range opt.Checkpoints {
		ns, err := OpenNative(dir)
		if err != nil {
			return nil, err
		}
		if err := checkSource(opt.Model, dir, ns.Checkpoint().Manifest().Source); err != nil {
			return nil, err
		}
		m, err := forward.New(cfg, forward.Overlay{ns, ref.Src})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		m.Resident = !opt.Stream
		if err := num.apply(m, ns, workers, !opt.Stream); err != nil {
			return nil, err
		}
		label := filepath.Base(filepath.Clean(dir))
		if opt.Labels != nil && opt.Labels[i] != "" {
			label = opt.Labels[i]
		}
		mf := ns.Checkpoint().Manifest()
		id := CandidateIdentity{Dir: dir, Identity: ns.Checkpoint().Identity(), SourceIdentity: mf.Source.Identity,
			Plan: mf.Plan.Name, Command: mf.TTQuant.Command, Calibration: mf.TTQuant.Calibration, Tensors: ns.Len()}
		if mf.TTQuant.Calibration != nil {
			calibed = append(calibed, label)
			calibInfos = append(calibInfos, mf.TTQuant.Calibration)
		}
		if n := len(mf.Tensors); n != ns.Len() {
			opt.log("candidate %s: %s (%d stored tensors substituted under %d names: a stored fused expert gate_up is also the expert's gate and up; identity %.16s)", label, dir, n, ns.Len(), id.Identity)
		} else {
			opt.log("candidate %s: %s (%d tensors substituted, identity %.16s)", label, dir, n, id.Identity)
		}
		cands = append(cands, newRunner(m))
		infos = append(infos, eval.RunInfo{Label: label, Identity: id, Numerics: num.String()})
		names = append(names, label)
	}
	if opt.Self {
		m, err := forward.New(cfg, ref.Src)
		if err != nil {
			return nil, err
		}
		m.Resident = !opt.Stream
		cands = append(cands, newRunner(m))
		infos = append(infos, eval.RunInfo{Label: "self", Identity: CandidateIdentity{Dir: opt.Model}, Numerics: "cpu-fp32"})
		names = append(names, "self")
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return nil, fmt.Errorf("harness: two candidates are labelled %q; give distinct labels", n)
		}
		seen[n] = true
	}

	// The evaluation text.
	dopt := opt.DataOptions
	dopt.Calibration = dataset.SetOptions{}
	dopt.Workers = workers
	if dopt.Progress == nil && opt.Log != nil {
		dopt.Progress = func(s string) { opt.log("data: %s", s) }
	}
	data, err := dataset.Build(opt.Data, tok, dopt)
	if err != nil {
		return nil, err
	}
	selection := selectionText(dopt, window)
	if opt.HeldOutOfCalibration {
		if label, cp, ok := calibrationFile(data.Provenance, calibed, calibInfos); ok {
			dopt.EvalFraction, dopt.Seed = cp.Options.EvalFraction, cp.Options.Seed
			if dopt.EvalFraction >= 1 {
				return nil, fmt.Errorf("harness: the evaluation data is candidate %s's calibration text, with no records held out", label)
			}
			if data, err = dataset.Build(opt.Data, tok, dopt); err != nil {
				return nil, err
			}
			selection = fmt.Sprintf("the %g%% of the records that candidate %s's calibration split held out (eval fraction %g, seed %d): the evaluation data holds its calibration file; ",
				100*dopt.EvalFraction, label, dopt.EvalFraction, dopt.Seed) + selectionText(dopt, window)
		}
	}
	opt.log("scoring %s", selection)
	info := DataInfo{Provenance: data.Provenance, Selection: selection, Window: window}
	windows, labels, st, err := Windows(data.Evaluation, window, cfg)
	if err != nil {
		return nil, err
	}
	info.Split, info.Unscorable, info.Windows = st.Split, st.Unscorable, len(windows)

	// Overlap with the calibration text, before anything runs.
	var warnings []string
	var idx *dataset.FingerprintIndex
	var from []string
	shingles := 0
	if opt.Calib != nil {
		copt := opt.CalibOptions
		copt.Evaluation = dataset.SetOptions{}
		copt.Workers = workers
		if copt.Progress == nil && opt.Log != nil {
			copt.Progress = func(s string) { opt.log("calibration data: %s", s) }
		}
		cal, err := dataset.Build(opt.Calib, tok, copt)
		if err != nil {
			return nil, fmt.Errorf("calibration data: %w", err)
		}
		fp, err := dataset.NewFingerprint(cal.Calibration, opt.OverlapRun)
		if err != nil {
			return nil, err
		}
		if idx, err = fp.Index(); err != nil {
			return nil, err
		}
		from, shingles = []string{"the calibration data given"}, fp.Shingles
	} else if len(calibed) > 0 {
		var unchecked []string
		for i, label := range calibed {
			fp, why := manifestFingerprint(calibInfos[i], tok)
			if why != "" {
				unchecked = append(unchecked, label+": "+why)
				continue
			}
			x, err := fp.Index()
			if err == nil && idx != nil {
				x, err = idx.Merge(x)
			}
			if err != nil {
				return nil, fmt.Errorf("candidate %s: %w", label, err)
			}
			idx = x
			from, shingles = append(from, "the manifest of "+label), shingles+fp.Shingles
		}
		if len(unchecked) > 0 {
			info.Overlap.Unchecked = unchecked
			warnings = append(warnings, fmt.Sprintf("overlap with the calibration text not checked for %s", strings.Join(unchecked, "; ")))
		}
	}
	if idx != nil {
		w, err := checkOverlap(idx, from, shingles, windows, data, &opt, &info)
		if err != nil {
			return nil, err
		}
		warnings = append(warnings, w...)
	}
	info.Overlap.Warnings = warnings
	for _, w := range warnings {
		opt.log("warning: %s", w)
	}

	scorer, err := eval.NewScorer(cfg.Vocab, names, eval.ScorerOptions{Workers: workers})
	if err != nil {
		return nil, err
	}
	if err := scorer.Accumulator().SetOrder(labels); err != nil {
		return nil, err
	}
	refInfo := eval.RunInfo{Label: "BF16", Numerics: "cpu-fp32",
		Identity: ReferenceIdentity{Dir: opt.Model, Family: cfg.Arch.String(), Layers: cfg.Layers, Vocab: cfg.Vocab, Tokenize: tok.SHA256()}}
	settings := Settings{Numerics: num.String(), KVCache: kv, Chunk: chunk}
	// A split evaluation's key hashes every window: only a worker or the
	// merge needs it.
	var sp *splitRun
	if opt.Assemble != "" || opt.Shard.Count > 1 {
		sp = &splitRun{key: splitKey(refInfo, infos, info, settings, windows), windows: windows}
	}
	if opt.Assemble != "" {
		if err := sp.merge(opt.Assemble, scorer); err != nil {
			return nil, err
		}
	} else {
		eo := eval.EvalOptions{Chunk: chunk, Progress: opt.Progress}
		if opt.Shard.Count > 1 {
			if eo.Windows, err = sp.share(opt.Shard); err != nil {
				return nil, err
			}
			eo.Record = func(ws eval.WindowScores) { sp.scores = append(sp.scores, ws) }
		}
		opt.log("evaluating %d windows (%d sequences) with %d candidates", len(windows), len(data.Evaluation.Sequences), len(cands))
		refRun := newRunner(ref)
		err = eval.Evaluate(ctx, scorer, refRun, cands, windows, eo)
		refRun.wait()
		for _, c := range cands {
			c.(*runner).wait()
		}
		if err != nil {
			return nil, err
		}
		if opt.Shard.Count > 1 {
			path, err := sp.write(opt.Parts, opt.Shard)
			if err != nil {
				return nil, err
			}
			return &Report{Part: &PartInfo{Path: path, Worker: opt.Shard.Index, Workers: opt.Shard.Count, Windows: len(eo.Windows), Of: len(windows)}, Warnings: warnings}, nil
		}
	}
	res, err := eval.NewResult(refInfo, infos, scorer, info, settings)
	if err != nil {
		return nil, err
	}
	return &Report{Result: res, Warnings: warnings}, nil
}

// runner adapts a forward.Model to eval.Model: one window from a fresh
// state, its final-normed hidden states kept, logits computed on demand.
// Forward starts the window's forward pass and returns at once; the first
// Logits call waits for it. eval.Evaluate starts the reference and every
// candidate before it asks for logits, so the runs of one window proceed
// concurrently (each also using the kernels' goroutines).
type runner struct {
	m    *forward.Model
	hf   []float32
	n    int
	err  error
	done chan struct{}
	// lg holds the logits of positions [b0, b1) of the window. Every
	// product reads the whole LM head, and eval.Evaluate asks for a few
	// positions at a time, so the runner computes forward.LogitChunk
	// positions at once and serves the next requests from them.
	lg     []float32
	b0, b1 int
}

func newRunner(m *forward.Model) *runner { return &runner{m: m} }

// Forward implements eval.Model.
func (r *runner) Forward(ctx context.Context, tokens []int32) (eval.WindowLogits, error) {
	r.start(len(tokens), func() ([]float32, error) { return r.forward(ctx, tokens) })
	return r, nil
}

// start runs pass, which returns the final-normed hidden states of a
// window of n tokens, in the background.
func (r *runner) start(n int, pass func() ([]float32, error)) {
	if r.done != nil {
		<-r.done // the previous window's pass (abandoned after an error)
	}
	r.n, r.hf, r.err = n, nil, nil
	r.b0, r.b1 = 0, 0
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		r.hf, r.err = pass()
	}()
}

func (r *runner) forward(ctx context.Context, tokens []int32) ([]float32, error) {
	x, err := r.m.Embed(tokens)
	if err != nil {
		return nil, err
	}
	b := &forward.Batch{Lens: []int{len(tokens)}, X: x}
	if err := r.m.Trunk(b, nil, func(int, []float32) error { return ctx.Err() }); err != nil {
		return nil, err
	}
	return r.m.FinalNorm(b.X)
}

// wait waits for the pending pass; the runner is then idle.
func (r *runner) wait() {
	if r.done != nil {
		<-r.done
	}
}

// Logits implements eval.WindowLogits.
func (r *runner) Logits(dst []float32, lo, hi int) error {
	r.wait()
	if r.err != nil {
		return r.err
	}
	H, V := r.m.Config.Hidden, r.m.Config.Vocab
	if lo < 0 || hi > r.n || lo > hi || len(dst) != (hi-lo)*V {
		return fmt.Errorf("harness: logits of positions [%d,%d) of a %d-token window into %d values", lo, hi, r.n, len(dst))
	}
	if hi-lo >= forward.LogitChunk {
		return r.m.LogitRows(dst, r.hf[lo*H:hi*H])
	}
	for p := lo; p < hi; {
		if p < r.b0 || p >= r.b1 {
			b1 := min(r.n, p+forward.LogitChunk)
			if cap(r.lg) < (b1-p)*V {
				r.lg = make([]float32, forward.LogitChunk*V)
			}
			r.b0, r.b1 = 0, 0
			if err := r.m.LogitRows(r.lg[:(b1-p)*V], r.hf[p*H:b1*H]); err != nil {
				return err
			}
			r.b0, r.b1 = p, b1
		}
		q := min(hi, r.b1)
		copy(dst[(p-lo)*V:], r.lg[(p-r.b0)*V:(q-r.b0)*V])
		p = q
	}
	return nil
}

// selectionText says how the evaluation set is cut into windows.
func selectionText(dopt dataset.Options, window int) string {
	e := dopt.Evaluation
	what := "the evaluation records"
	if dopt.EvalFraction == 1 {
		what = "every record"
	}
	if e.AllRecords {
		return fmt.Sprintf("%s, each its own window of up to %d tokens (longer ones split)", what, window)
	}
	return fmt.Sprintf("%d sequences (%s, %d tokens) of %s, windows of up to %d tokens", e.Sequences, e.Mode, e.SeqLen, what, window)
}

// calibrationFile reports the first calibrated candidate whose recorded
// calibration text shares a file (by sha256) with the evaluation data,
// and that calibration's provenance.
func calibrationFile(data dataset.Provenance, labels []string, infos []*manifest.CalibInfo) (string, *dataset.Provenance, bool) {
	files := map[string]bool{}
	for _, s := range data.Sources {
		for _, f := range s.Files {
			files[f.SHA256] = true
		}
	}
	for i, ci := range infos {
		var p dataset.Provenance
		if len(ci.Data) == 0 || json.Unmarshal(ci.Data, &p) != nil {
			continue
		}
		for _, s := range p.Sources {
			for _, f := range s.Files {
				if files[f.SHA256] {
					return labels[i], &p, true
				}
			}
		}
	}
	return "", nil, false
}

// checkOverlap checks the evaluation text against a calibration
// fingerprint, recording the outcome in info: a shared share above the
// maximum is an *OverlapError unless allowed, then a warning naming who
// allowed it.
func checkOverlap(idx *dataset.FingerprintIndex, from []string, shingles int, windows []eval.Window, data *dataset.Result, opt *Options, info *DataInfo) ([]string, error) {
	maxShare := opt.MaxOverlap
	if maxShare == 0 {
		maxShare = DefaultMaxOverlap
	}
	unchecked := info.Overlap.Unchecked
	o := OverlapInfo{Checked: true, Run: idx.Run(), From: from, Shingles: shingles, MaxShare: maxShare, Unchecked: unchecked}
	shared := idx.Shared(data.Evaluation)
	for i := range windows {
		w := &windows[i]
		seq := shared[w.Record]
		first := -1
		for k, sc := range w.Score {
			if !sc {
				continue
			}
			o.ScoredTokens++
			// Position k predicts token k+1 of the window.
			if seq[w.Start+k+1] {
				o.SharedTokens++
				if first < 0 {
					first = w.Start + k + 1
				}
			}
		}
		if first >= 0 {
			o.Windows++
			if len(o.First) < 10 {
				at := OverlapAt{Window: i, Corpus: w.Corpus, Sequence: w.Record, At: first}
				if recs := data.Evaluation.Sequences[w.Record].Records; len(recs) > 0 {
					at.Where = recs[0].Where
				}
				o.First = append(o.First, at)
			}
		}
	}
	if o.ScoredTokens > 0 {
		o.Share = float64(o.SharedTokens) / float64(o.ScoredTokens)
	}
	info.Overlap = o
	opt.log("overlap: %d of %d scored tokens (%.2f%%) shared with the calibration text (fingerprint from %s; at most %.2f%% allowed)",
		o.SharedTokens, o.ScoredTokens, 100*o.Share, strings.Join(from, ", "), 100*maxShare)
	if o.Share <= maxShare {
		return nil, nil
	}
	if !opt.AllowOverlap {
		return nil, &OverlapError{Info: o}
	}
	by := opt.AllowedBy
	if by == "" {
		by = "the caller"
	}
	info.Overlap.AllowedBy = by
	return []string{overlapText(&o) + "; allowed by " + by}, nil
}

// manifestFingerprint returns the calibration fingerprint a checkpoint's
// manifest records, or why there is none to check against.
func manifestFingerprint(ci *manifest.CalibInfo, tok *tokenizer.Tokenizer) (*dataset.Fingerprint, string) {
	if len(ci.Data) == 0 {
		return nil, "its manifest records no calibration text (a calibration store without text provenance)"
	}
	var prov dataset.Provenance
	if err := json.Unmarshal(ci.Data, &prov); err != nil {
		return nil, "its manifest's calibration provenance does not decode: " + err.Error()
	}
	if prov.Calibration == nil || prov.Calibration.Fingerprint == nil {
		return nil, "its manifest records no fingerprint of the calibration text (built before fingerprints were recorded)"
	}
	if prov.Tokenizer.SHA256 != "" && prov.Tokenizer.SHA256 != tok.SHA256() {
		return nil, "it was calibrated with another tokenizer"
	}
	return prov.Calibration.Fingerprint, ""
}
