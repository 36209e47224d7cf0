package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model/forward"
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
	// Calib and CalibOptions give the calibration text the checkpoints
	// were made with (the calibration set dataset.Build makes of them):
	// the overlap check indexes it. Nil: the checkpoints' manifests are
	// consulted, and a checkpoint calibrated on text that is not given is
	// reported as unchecked.
	Calib        *dataset.Spec
	CalibOptions dataset.Options
	// AllowOverlap turns an overlap between evaluation and calibration
	// text from an error into a warning.
	AllowOverlap bool
	// OverlapRun is the length in tokens of a shared run that counts as
	// overlap (0: eval.DefaultOverlapRun).
	OverlapRun int

	// Window is the longest window in tokens (0: eval.DefaultWindow);
	// longer sequences are cut into several windows, each from a fresh
	// state.
	Window int
	// Numerics is how the checkpoints' runs compute: NumericsCPU or ""
	// (the same), or device numerics "device" or "device:LoFi|HiFi2|
	// HiFi3|HiFi4" (ParseNumerics). The reference and the Self candidate
	// always run in float32.
	Numerics string
	// KVCache is the checkpoints' runs' key-value cache format of
	// full-attention layers: "" or KVCacheF32 (float32), or KVCacheBFP8.
	KVCache string
	// Workers is the number of goroutines of the kernels and the scorer
	// (0: GOMAXPROCS). Results do not depend on it.
	Workers int
	// Chunk is the number of positions scored at a time (0: 16).
	Chunk int
	// Stream reads every layer's weights from the checkpoints for each
	// window instead of keeping every run's float32 weights in memory
	// after first use (which needs 4 bytes per parameter per run: fine for
	// small models, not for a 35B one). Results are the same.
	Stream bool

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
	Window     int         `json:"window"`
	Windows    int         `json:"windows"`
	Split      int         `json:"split_sequences"`
	Unscorable int         `json:"unscorable_masked_tokens"`
	Overlap    OverlapInfo `json:"overlap"`
}

// OverlapInfo records the check of evaluation against calibration text.
type OverlapInfo struct {
	// Checked says whether calibration text was indexed; Calibration is
	// its provenance.
	Checked     bool                `json:"checked"`
	Run         int                 `json:"run_tokens,omitempty"`
	Calibration *dataset.Provenance `json:"calibration,omitempty"`
	// Windows is the number of evaluation windows sharing a run with it,
	// First up to 10 of them.
	Windows int            `json:"windows"`
	First   []eval.Overlap `json:"first,omitempty"`
	// Unchecked lists the candidates whose manifest records a
	// calibration whose text was not given.
	Unchecked []string `json:"unchecked,omitempty"`
	Warnings  []string `json:"warnings,omitempty"`
}

// Settings is recorded as the result's Settings.
type Settings struct {
	// Numerics is the candidates' numerics (Numerics.String); KVCache the
	// KV cache format.
	Numerics string `json:"numerics"`
	KVCache  string `json:"kv_cache"`
	Chunk    int    `json:"chunk"`
}

// OverlapError is returned when evaluation windows share text with the
// calibration text and AllowOverlap is not set.
type OverlapError struct {
	Windows int
	Run     int
	// Where is the data file (and line) of the first window's text.
	Where string
	First []eval.Overlap
}

func (e *OverlapError) Error() string {
	s := fmt.Sprintf("%d evaluation windows share text (runs of %d tokens) with the calibration text", e.Windows, e.Run)
	if len(e.First) > 0 {
		s += ", first at " + e.First[0].String()
		if e.Where != "" {
			s += " (" + e.Where + ")"
		}
	}
	return s + "; evaluate on other text, or allow it explicitly"
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
	if o.DataOptions.Evaluation.Sequences <= 0 {
		return errors.New("harness: the data options request no evaluation sequences")
	}
	if o.Calib != nil && o.CalibOptions.Calibration.Sequences <= 0 {
		return errors.New("harness: the calibration data options request no calibration sequences")
	}
	if _, err := ParseNumerics(o.Numerics, o.KVCache); err != nil {
		return err
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
	return nil
}

// Run evaluates the checkpoints against the source model. Every check that
// can refuse the run (options, checkpoints, data, overlap) happens before
// the first window runs.
func Run(ctx context.Context, opt Options) (*Report, error) {
	if err := opt.check(); err != nil {
		return nil, err
	}
	num, _ := ParseNumerics(opt.Numerics, opt.KVCache)
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
	prev := kernels.SetWorkers(workers)
	defer kernels.SetWorkers(prev)

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
		opt.log("candidate %s: %s (%d tensors substituted, identity %.16s)", label, dir, ns.Len(), id.Identity)
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
	info := DataInfo{Provenance: data.Provenance, Window: window}
	var windows []eval.Window
	var labels []string
	for i, s := range data.Evaluation.Sequences {
		if s.Label == eval.AllCorpus {
			return nil, fmt.Errorf("harness: corpus label %q is reserved for the row covering every corpus", s.Label)
		}
		if !seen["corpus:"+s.Label] {
			seen["corpus:"+s.Label] = true
			labels = append(labels, s.Label)
		}
		ws, st, err := eval.MaskedWindows(s.Label, []eval.Record{{Tokens: s.IDs, Mask: s.Mask}}, window)
		if err != nil {
			return nil, err
		}
		for k := range ws {
			ws[k].Record = i
		}
		info.Split += st.Split
		info.Unscorable += st.Unscorable
		windows = append(windows, ws...)
	}
	info.Windows = len(windows)
	for i := range windows {
		for _, id := range windows[i].Tokens {
			if int(id) >= cfg.Vocab {
				return nil, fmt.Errorf("harness: %s sequence %d: token id %d outside the model's vocabulary of %d", windows[i].Corpus, windows[i].Record, id, cfg.Vocab)
			}
		}
	}

	// Overlap with the calibration text, before anything runs.
	var warnings []string
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
		w, err := checkOverlap(cal.Calibration.IDs(), &cal.Provenance, windows, data, &opt, &info)
		if err != nil {
			return nil, err
		}
		warnings = append(warnings, w...)
	} else if len(calibed) > 0 {
		// The manifests record the calibration text's provenance: where
		// its files are still there, with the recorded hashes, the
		// calibration sequences are rebuilt and checked.
		var seqs [][]int32
		var unchecked, reasons []string
		var provs []dataset.Provenance
		for i, label := range calibed {
			ids, prov, why := rebuildCalibration(calibInfos[i], tok, workers)
			if why != "" {
				unchecked = append(unchecked, label)
				reasons = append(reasons, label+": "+why)
				continue
			}
			opt.log("candidate %s: calibration text rebuilt from its manifest (%d sequences, token ids sha256 %.16s)", label, len(ids), prov.Calibration.TokenIDsSHA256)
			seqs = append(seqs, ids...)
			provs = append(provs, *prov)
		}
		if len(seqs) > 0 {
			w, err := checkOverlap(seqs, &provs[0], windows, data, &opt, &info)
			if err != nil {
				return nil, err
			}
			warnings = append(warnings, w...)
		}
		if len(unchecked) > 0 {
			info.Overlap.Unchecked = unchecked
			warnings = append(warnings, fmt.Sprintf("candidates %q were calibrated on text this evaluation was not given and that could not be rebuilt from their manifests (%s): overlap not checked", unchecked, strings.Join(reasons, "; ")))
		}
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
	opt.log("evaluating %d windows (%d sequences) with %d candidates", len(windows), len(data.Evaluation.Sequences), len(cands))
	refRun := newRunner(ref)
	err = eval.Evaluate(ctx, scorer, refRun, cands, windows, eval.EvalOptions{Chunk: chunk, Progress: opt.Progress})
	refRun.wait()
	for _, c := range cands {
		c.(*runner).wait()
	}
	if err != nil {
		return nil, err
	}
	refInfo := eval.RunInfo{Label: "BF16", Numerics: "cpu-fp32",
		Identity: ReferenceIdentity{Dir: opt.Model, Family: cfg.Family.String(), Layers: cfg.Layers, Vocab: cfg.Vocab, Tokenize: tok.SHA256()}}
	res, err := eval.NewResult(refInfo, infos, scorer, info, Settings{Numerics: num.String(), KVCache: kv, Chunk: chunk})
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
}

func newRunner(m *forward.Model) *runner { return &runner{m: m} }

// Forward implements eval.Model.
func (r *runner) Forward(ctx context.Context, tokens []int32) (eval.WindowLogits, error) {
	if r.done != nil {
		<-r.done // the previous window's pass (abandoned after an error)
	}
	r.n, r.hf, r.err = len(tokens), nil, nil
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		r.hf, r.err = r.forward(ctx, tokens)
	}()
	return r, nil
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
	return r.m.Logits(r.hf[lo*H:hi*H], func(row0, rows int, lg []float32) error {
		copy(dst[row0*V:], lg[:rows*V])
		return nil
	})
}

// checkOverlap indexes the calibration sequences and checks every
// evaluation window against them, recording the outcome in info: an
// overlap is an *OverlapError unless allowed, then a warning.
func checkOverlap(seqs [][]int32, prov *dataset.Provenance, windows []eval.Window, data *dataset.Result, opt *Options, info *DataInfo) ([]string, error) {
	x, err := eval.NewOverlapIndex(seqs, opt.OverlapRun)
	if err != nil {
		return nil, err
	}
	first, total := x.CheckOverlap(windows, 10)
	info.Overlap = OverlapInfo{Checked: true, Run: x.Run(), Calibration: prov, Windows: total, First: first}
	if total == 0 {
		return nil, nil
	}
	oe := &OverlapError{Windows: total, Run: x.Run(), First: first}
	if recs := data.Evaluation.Sequences[first[0].Record].Records; len(recs) > 0 {
		oe.Where = recs[0].Where
	}
	if !opt.AllowOverlap {
		return nil, oe
	}
	return []string{"allowed: " + oe.Error()}, nil
}

// rebuildCalibration rebuilds the calibration sequences a checkpoint's
// manifest records: the dataset provenance names the sources, their files'
// sha256s and the options; the sequences count only if their token-id hash
// is the one recorded. It returns why not otherwise.
func rebuildCalibration(ci *manifest.CalibInfo, tok *tokenizer.Tokenizer, workers int) ([][]int32, *dataset.Provenance, string) {
	if len(ci.Data) == 0 {
		return nil, nil, "the manifest does not record the calibration text (a calibration store without text provenance)"
	}
	var prov dataset.Provenance
	if err := json.Unmarshal(ci.Data, &prov); err != nil {
		return nil, nil, "the manifest's calibration provenance does not decode: " + err.Error()
	}
	if prov.Calibration == nil || len(prov.Sources) == 0 {
		return nil, nil, "the manifest's calibration provenance names no calibration set"
	}
	if prov.Tokenizer.SHA256 != "" && prov.Tokenizer.SHA256 != tok.SHA256() {
		return nil, nil, "the checkpoint was calibrated with another tokenizer"
	}
	spec := &dataset.Spec{}
	for _, src := range prov.Sources {
		spec.Sources = append(spec.Sources, src.Source)
		if src.Path == "" {
			return nil, nil, "the manifest records the calibration text by content, not by path"
		}
		if _, err := os.Stat(src.Path); err != nil {
			return nil, nil, fmt.Sprintf("calibration source %s is not here", src.Path)
		}
	}
	dopt := prov.Options
	dopt.Evaluation = dataset.SetOptions{}
	dopt.Workers = workers
	res, err := dataset.Build(spec, tok, dopt)
	if err != nil {
		return nil, nil, "rebuilding the calibration text: " + err.Error()
	}
	for i, src := range res.Provenance.Sources {
		if i >= len(prov.Sources) || !sameFiles(src.Files, prov.Sources[i].Files) {
			return nil, nil, fmt.Sprintf("calibration source %s changed since the checkpoint was built", src.Path)
		}
	}
	want := ci.TokenIDsSHA256
	if want == "" {
		want = prov.Calibration.TokenIDsSHA256
	}
	if res.Calibration == nil || res.Provenance.Calibration.TokenIDsSHA256 != want {
		return nil, nil, "the rebuilt calibration sequences do not have the recorded token-id hash"
	}
	return res.Calibration.IDs(), &res.Provenance, ""
}

func sameFiles(a, b []dataset.FileInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].SHA256 != b[i].SHA256 || a[i].Path != b[i].Path {
			return false
		}
	}
	return true
}
