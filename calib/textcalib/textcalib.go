// Package textcalib builds a calibration store from text: it tokenizes and
// packs the data (internal/text/dataset), runs the BF16 model one layer at
// a time over every calibration sequence (internal/model/forward) and
// writes each layer's calibration sites into a calib store, with the text's
// provenance and the model's identity. docs/calibration.md describes the
// result.
package textcalib

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ttquant/ttquant/internal/model"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
	"github.com/ttquant/ttquant/safetensors"
)

// Options configures Build.
type Options struct {
	Model string // model directory: config.json, weights, tokenizer
	Out   string // store directory to create (or to resume)
	// Data and DataOptions give the text; only the calibration set is
	// built (DataOptions.Calibration.Sequences > 0).
	Data        *dataset.Spec
	DataOptions dataset.Options
	// AllowShort lets the build proceed when the text gives fewer tokens
	// than asked (Sequences × SeqLen): with the whole sequences the text
	// gives. Without it such a build is refused before anything is
	// written.
	AllowShort bool
	// Store sets the stored dtype and shard size.
	Store calib.StoreOptions
	// Progress, when set, receives one line per finished layer.
	Progress func(msg string)
	// Shard, naming one of several workers (Count > 1), makes the build
	// that worker of a split store build: it runs the forward pass over
	// its own sequences only and writes their rows as parts, which
	// calib.AssembleStore joins into the store (Store.Shard is set from
	// it). Its bookkeeping is its own (calib.StoreWorkerDir), so workers
	// of different indices run at once in one directory. The zero Spec and
	// 0/1 are the whole build.
	Shard shard.Spec

	// afterStep, when set (tests), runs after step k's record is written;
	// an error stops the build there, as an interruption would.
	afterStep func(step int) error
}

// Result describes a built store.
type Result struct {
	Store *calib.Store
	// Layers is the number of trunk layers whose sites were written;
	// MTPLayers the number of MTP layers whose sites were written (the
	// forward pass runs the first MTP layer only, so at most 1) and
	// MTPSkipped the MTP layers without sites.
	Layers, MTPLayers, MTPSkipped int
	// ResumedAt is the first layer this run computed: 0 for a fresh
	// build, k when layers 0 … k−1 came from an interrupted run.
	ResumedAt int
	// AskedTokens is Sequences × SeqLen; the store's provenance says how
	// many tokens it holds (fewer only with AllowShort).
	AskedTokens int64
	Data        dataset.Provenance
	// Split, for a worker of a split build, is its share; Store is then
	// nil (the store exists once it is assembled). AlreadyAssembled
	// reports a worker run on the assembled store of the same build: it
	// did nothing.
	Split            *calib.Split
	AlreadyAssembled bool
}

// ErrNoCalibration is returned when the options ask for no calibration
// sequences.
var ErrNoCalibration = errors.New("textcalib: the data options build no calibration sequences")

// ErrShortData is wrapped when the text gives fewer tokens than asked and
// Options.AllowShort is not set.
var ErrShortData = dataset.ErrShortText

// Build writes the calibration store. Everything that can refuse the run
// (configuration, tokenizer, data, existing store, a different earlier
// build in the directory) is checked before anything is written.
//
// A build that stops (an error, a cancelled ctx, a killed process) leaves
// its finished layers in the store directory with the residual stream
// entering the next one (PartialDir); running Build again with the same
// model, data and options resumes at the first unfinished layer and
// produces the same bytes as an uninterrupted build.
func Build(ctx context.Context, opt Options) (_ *Result, err error) {
	if opt.DataOptions.Calibration.Sequences <= 0 {
		return nil, ErrNoCalibration
	}
	split := opt.Shard.Count > 1
	if opt.Shard != (shard.Spec{}) && !opt.Shard.Valid() {
		return nil, fmt.Errorf("textcalib: worker %s names no worker", opt.Shard)
	}
	_, err = os.Stat(filepath.Join(opt.Out, calib.StoreIndexName))
	assembled := err == nil
	if assembled && !split {
		return nil, fmt.Errorf("textcalib: %s already holds a calibration store", opt.Out)
	}
	// The forward pass refuses an unsupported config before reading any
	// weight.
	m, err := forward.Open(opt.Model)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	tok, err := tokenizer.Load(opt.Model)
	if err != nil {
		return nil, err
	}
	res, asked, err := buildData(opt, tok)
	if err != nil {
		return nil, err
	}
	set := res.Calibration
	cfg := m.Config
	ids := set.IDs()
	lens := make([]int, len(ids))
	var tokens int64
	for i, s := range ids {
		for t, id := range s {
			if id < 0 || int(id) >= cfg.Vocab {
				return nil, fmt.Errorf("textcalib: sequence %d token %d: id %d outside the model's vocabulary 0..%d", i, t, id, cfg.Vocab-1)
			}
		}
		lens[i] = len(s)
		tokens += int64(len(s))
	}
	ident, err := ModelIdentity(opt.Model)
	if err != nil {
		return nil, err
	}
	dataProv, err := json.Marshal(res.Provenance)
	if err != nil {
		return nil, err
	}
	prov := calib.Provenance{
		Model:     filepath.Base(filepath.Clean(opt.Model)),
		Revision:  ident,
		Sequences: len(ids), Tokens: tokens,
		TokenIDsSHA256: res.Provenance.Calibration.TokenIDsSHA256,
		Data:           dataProv,
	}
	// The MTP layer has a row per token that has a successor; with only
	// one-token sequences it has none and is left out.
	mtp := 0
	if cfg.MTPLayers > 0 && tokens > int64(len(ids)) {
		mtp = 1
	}
	sopt := opt.Store
	if sopt.DType == 0 {
		sopt.DType = safetensors.BF16
	}
	if sopt.ShardBytes == 0 {
		sopt.ShardBytes = 256 << 20
	}
	rec := &buildRecord{Format: buildRecordFormat, Version: buildRecordVer, Model: prov.Model, ModelRevision: ident,
		Sequences: prov.Sequences, Tokens: tokens, TokenIDsSHA256: prov.TokenIDsSHA256,
		DType: sopt.DType.String(), ShardBytes: sopt.ShardBytes, Steps: cfg.Layers + mtp, Data: dataProv}
	if assembled {
		// A worker run again after the assembly: nothing to do if the
		// store is this build's.
		st, err := calib.OpenStore(opt.Out)
		if err != nil {
			return nil, err
		}
		if p := st.Provenance(); p.Model != prov.Model || p.Revision != prov.Revision || p.TokenIDsSHA256 != prov.TokenIDsSHA256 || p.Tokens != prov.Tokens {
			return nil, fmt.Errorf("textcalib: %s already holds a calibration store of other inputs (model %s, token ids %s)", opt.Out, p.Revision, p.TokenIDsSHA256)
		}
		return &Result{Store: st, Layers: cfg.Layers, MTPLayers: mtp, MTPSkipped: cfg.MTPLayers - mtp, AskedTokens: asked, Data: res.Provenance, AlreadyAssembled: true}, nil
	}
	sopt.Shard = opt.Shard
	if split {
		if sopt.Build, err = json.Marshal(rec); err != nil {
			return nil, err
		}
	}
	// pdir holds what resumes the build: the store's for one process, the
	// worker's own for a worker of a split build.
	pdir := filepath.Join(opt.Out, PartialDir)
	if split {
		pdir = calib.StoreWorkerDir(opt.Out, opt.Shard)
	}
	// One build at a time per directory. The lock is released on return;
	// a refusal leaves the directory as it was (one the lock created is
	// removed again).
	_, statErr := os.Stat(opt.Out)
	created := os.IsNotExist(statErr) && !split
	var lk *fslock.Lock
	if split {
		lk, err = calib.LockStoreWorker(opt.Out, opt.Shard)
	} else {
		lk, err = fslock.Acquire(opt.Out)
	}
	if err != nil {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	defer lk.Release()
	if err := checkSplitMix(opt.Out, split); err != nil {
		return nil, err
	}
	partial, err := readPartial(pdir)
	if err != nil {
		return nil, fmt.Errorf("%w (remove %s to start over)", err, pdir)
	}
	if partial != nil {
		if d := rec.diff(partial.build); len(d) > 0 {
			return nil, fmt.Errorf("textcalib: %s holds an unfinished build of different inputs: %s; run with the same model, data and options to resume it, or remove %s to start over",
				opt.Out, strings.Join(d, "; "), opt.Out)
		}
	} else if stray, err := strayShards(opt.Out, nil); err != nil {
		return nil, err
	} else if len(stray) > 0 {
		return nil, fmt.Errorf("textcalib: %s holds shard files (%s) but no record of the build that wrote them (%s/%s); remove them or choose another --out",
			opt.Out, stray[0], PartialDir, buildRecordName)
	}
	// Weights are read layer by layer below; a NaN or infinity would only
	// show up as non-finite activations, so it is refused here, before the
	// store is created.
	if err := m.CheckFinite(); err != nil {
		return nil, err
	}
	w, err := calib.CreateStore(opt.Out, prov, lens, ids, sopt)
	if err != nil {
		return nil, err
	}
	// A worker computes its own sequences only.
	if split {
		sel := w.Sequences()
		wids, wlens := make([][]int32, len(sel)), make([]int, len(sel))
		tokens = 0
		for i, s := range sel {
			wids[i], wlens[i] = ids[s], lens[s]
			tokens += int64(lens[s])
		}
		ids, lens = wids, wlens
	}
	finished := 0 // layers recorded, by earlier runs and this one
	defer func() {
		if err == nil {
			return
		}
		w.Abort()
		switch {
		case errors.Is(err, errDamaged) && split:
			// The other workers' files are not this worker's to remove.
			err = fmt.Errorf("%w; worker %s's unfinished share in %s cannot be resumed: remove %s to start it over", err, opt.Shard, pdir, pdir)
		case errors.Is(err, errDamaged):
			err = fmt.Errorf("%w; the unfinished build in %s cannot be resumed: remove %s to start over", err, opt.Out, opt.Out)
		case split:
			err = fmt.Errorf("%w (worker %s is unfinished: its finished layers are kept in %s; run it again to resume)", err, opt.Shard, pdir)
		case created && finished == 0:
			// Nothing finished: leave nothing behind.
			os.RemoveAll(opt.Out)
			err = fmt.Errorf("%w (no layer was finished; the unfinished store was removed)", err)
		default:
			err = fmt.Errorf("%w (%s is not a store yet: its finished layers are kept in %s; run the same command again to resume, or remove %s to start over)",
				err, opt.Out, pdir, opt.Out)
		}
	}()
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	if partial == nil {
		if err := writeJSONFile(filepath.Join(pdir, buildRecordName), rec, sopt.Faults); err != nil {
			return nil, err
		}
		partial = &partialState{build: rec}
	}
	H := cfg.Hidden
	var x []float32
	keepInput := ""
	start := len(partial.steps)
	finished = start
	if start > rec.Steps {
		return nil, fmt.Errorf("%w: %s records %d finished layers, the build has %d", errDamaged, pdir, start, rec.Steps)
	}
	keep := map[string]bool{}
	for _, sr := range partial.steps {
		for _, si := range sr.Sites {
			if err := w.AddWrittenSite(si); err != nil {
				return nil, fmt.Errorf("%w: %w", errDamaged, err)
			}
			for _, sh := range si.Shards {
				keep[sh.File] = true
			}
		}
	}
	if start > 0 {
		last := partial.steps[start-1]
		if start < rec.Steps {
			if last.Next == nil {
				return nil, fmt.Errorf("%w: %s: the record of layer %d has no residual stream", errDamaged, pdir, start-1)
			}
			if x, err = readStream(pdir, last.Next, tokens*int64(H)); err != nil {
				return nil, fmt.Errorf("%w: %w", errDamaged, err)
			}
			keepInput = last.Next.File
		}
		opt.progress("resuming %s at layer %d of %d: layers 0..%d were finished by an earlier run", opt.Out, start, rec.Steps, start-1)
	} else {
		x = make([]float32, 0, int(tokens)*H)
		for _, s := range ids {
			e, err := m.Embed(s)
			if err != nil {
				return nil, err
			}
			x = append(x, e...)
		}
	}
	// Whatever an interrupted step left: its shards (a worker's parts),
	// records and streams.
	if split {
		if err := cleanParts(opt.Out, pdir, keep); err != nil {
			return nil, err
		}
	} else {
		stray, err := strayShards(opt.Out, keep)
		if err != nil {
			return nil, err
		}
		for _, n := range stray {
			if err := os.Remove(filepath.Join(opt.Out, n)); err != nil {
				return nil, fmt.Errorf("textcalib: %w", err)
			}
		}
	}
	if err := cleanPartial(pdir, start, keepInput); err != nil {
		return nil, err
	}

	began := time.Now()
	for k := start; k < rec.Steps && len(ids) > 0; k++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var sites []calib.SiteInfo
		if k < cfg.Layers {
			sites, err = trunkStep(ctx, m, w, k, lens, x)
		} else {
			sites, err = mtpStep(ctx, m, w, k, ids, lens, &x)
		}
		if err != nil {
			return nil, err
		}
		sr := &stepRecord{Step: k, Layer: k, Sites: sites}
		if k+1 < rec.Steps {
			if sr.Next, err = writeStream(filepath.Join(pdir, inputName(k+1)), x, sopt.Faults); err != nil {
				return nil, err
			}
		}
		if err := writeJSONFile(filepath.Join(pdir, stepRecordName(k)), sr, sopt.Faults); err != nil {
			return nil, err
		}
		finished = k + 1
		if k > 0 {
			// The stream entering step k is no longer needed.
			os.Remove(filepath.Join(pdir, inputName(k)))
		}
		if opt.Progress != nil {
			el := time.Since(began)
			done := k + 1 - start
			eta := el / time.Duration(done) * time.Duration(rec.Steps-k-1)
			what := "layer"
			if k >= cfg.Layers {
				what = "MTP layer"
			}
			opt.progress("%s %d written (%d/%d; %s elapsed, about %s left)", what, k, k+1, rec.Steps, el.Round(time.Second), eta.Round(time.Second))
		}
		if opt.afterStep != nil {
			if err := opt.afterStep(k); err != nil {
				return nil, err
			}
		}
	}
	if len(ids) == 0 && start < rec.Steps {
		opt.progress("worker %s has no sequences: the split has more workers than units", opt.Shard)
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if split {
		// The worker's records stay for a rerun and for the assembly.
		return &Result{Layers: cfg.Layers, MTPLayers: mtp, MTPSkipped: cfg.MTPLayers - mtp, ResumedAt: start,
			AskedTokens: asked, Data: res.Provenance, Split: w.Split()}, nil
	}
	if err := os.RemoveAll(pdir); err != nil {
		return nil, fmt.Errorf("textcalib: the store is complete, but removing %s failed: %w", pdir, err)
	}
	st, err := calib.OpenStore(opt.Out)
	if err != nil {
		return nil, err
	}
	return &Result{Store: st, Layers: cfg.Layers, MTPLayers: mtp, MTPSkipped: cfg.MTPLayers - mtp, ResumedAt: start,
		AskedTokens: asked, Data: res.Provenance}, nil
}

// errDamaged marks a partial directory that does not hold what its
// records say.
var errDamaged = errors.New("textcalib: resuming")

func (o *Options) progress(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(fmt.Sprintf(format, args...))
	}
}

// siteSink streams one layer's sites to the store as the layer produces
// them: the mixer's sites per group of sequences, the MoE input at once.
type siteSink struct {
	ctx   context.Context
	layer int
	w     map[forward.Site]*calib.SiteWriter
	cols  map[forward.Site]int
	next  map[forward.Site]int // the row each site expects next
}

func newSiteSink(ctx context.Context, w *calib.StoreWriter, layer int, outSite string, align calib.Alignment, cols map[forward.Site]int) (*siteSink, error) {
	s := &siteSink{ctx: ctx, layer: layer, w: map[forward.Site]*calib.SiteWriter{}, cols: cols, next: map[forward.Site]int{}}
	for _, c := range []struct {
		site forward.Site
		name string
	}{{forward.SiteAttnIn, calib.SiteAttn}, {forward.SiteMLPIn, calib.SiteMoE}, {forward.SiteAttnOut, outSite}} {
		sw, err := w.BeginAlignedSite(layer, c.name, cols[c.site], align)
		if err != nil {
			s.abort()
			return nil, err
		}
		s.w[c.site] = sw
	}
	return s, nil
}

func (s *siteSink) hook(a *forward.Activations) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	sw := s.w[a.Site]
	if sw == nil {
		return nil // routed rows and a dense down input follow from mlp
	}
	if a.Cols != s.cols[a.Site] {
		return fmt.Errorf("textcalib: layer %d site %s: %d columns arrived, the configuration gives %d", s.layer, a.Site, a.Cols, s.cols[a.Site])
	}
	if a.Row0 != s.next[a.Site] {
		return fmt.Errorf("textcalib: layer %d site %s: rows from %d arrived, row %d was expected", s.layer, a.Site, a.Row0, s.next[a.Site])
	}
	if err := sw.Write(a.X[:a.Rows*a.Cols]); err != nil {
		return err
	}
	s.next[a.Site] += a.Rows
	return nil
}

// close finishes the sites in a fixed order and returns their descriptions.
func (s *siteSink) close() ([]calib.SiteInfo, error) {
	var out []calib.SiteInfo
	for _, site := range []forward.Site{forward.SiteAttnIn, forward.SiteMLPIn, forward.SiteAttnOut} {
		if err := s.w[site].Close(); err != nil {
			s.abort()
			return nil, fmt.Errorf("textcalib: layer %d: %w", s.layer, err)
		}
		out = append(out, s.w[site].Info())
	}
	return out, nil
}

func (s *siteSink) abort() {
	for _, sw := range s.w {
		sw.Abort()
	}
}

// siteCols returns the width of each stored site of layer i.
func siteCols(cfg *model.Config, i int) (map[forward.Site]int, string) {
	out := map[forward.Site]int{forward.SiteAttnIn: cfg.Hidden, forward.SiteMLPIn: cfg.Hidden}
	if cfg.Kind(i) == model.FullAttention {
		out[forward.SiteAttnOut] = cfg.Heads * cfg.HeadDim
		return out, calib.SiteOProj
	}
	out[forward.SiteAttnOut] = cfg.ValueDim()
	return out, calib.SiteOutProj
}

// trunkStep runs trunk layer k over the residual stream x (replaced by the
// stream leaving the layer), writing its sites.
func trunkStep(ctx context.Context, m *forward.Model, w *calib.StoreWriter, k int, lens []int, x []float32) ([]calib.SiteInfo, error) {
	l, err := m.Layer(k)
	if err != nil {
		return nil, err
	}
	cols, outSite := siteCols(m.Config, k)
	sink, err := newSiteSink(ctx, w, k, outSite, calib.AlignToken, cols)
	if err != nil {
		return nil, err
	}
	if err := l.Forward(&forward.Batch{Lens: lens, X: x}, sink.hook); err != nil {
		sink.abort()
		return nil, fmt.Errorf("textcalib: layer %d: %w", k, err)
	}
	return sink.close()
}

// mtpStep runs the MTP layer (layer k = the trunk's layer count) over the
// rows MTPInput builds from the trunk's output *xp and the token ids: T−1
// rows per sequence, stored next_token-aligned. The trunk's output is
// released (*xp = nil) once the MTP rows are built.
func mtpStep(ctx context.Context, m *forward.Model, w *calib.StoreWriter, k int, ids [][]int32, lens []int, xp *[]float32) ([]calib.SiteInfo, error) {
	z, err := m.MTPInputs(ids, *xp)
	if err != nil {
		return nil, err
	}
	mlens := make([]int, len(lens))
	for s, n := range lens {
		mlens[s] = n - 1
	}
	*xp = nil
	cols, outSite := siteCols(m.Config, k)
	sink, err := newSiteSink(ctx, w, k, outSite, calib.AlignNextToken, cols)
	if err != nil {
		return nil, err
	}
	if _, err := m.MTPHead(&forward.Batch{Lens: mlens, X: z}, sink.hook); err != nil {
		sink.abort()
		return nil, fmt.Errorf("textcalib: MTP layer %d: %w", k, err)
	}
	return sink.close()
}

// buildData tokenizes and packs the calibration set. It returns the set
// and the tokens asked for.
func buildData(opt Options, tok *tokenizer.Tokenizer) (*dataset.Result, int64, error) {
	res, asked, err := dataset.BuildCalibration(opt.Data, tok, opt.DataOptions, opt.AllowShort, func(msg string) { opt.progress("%s", msg) })
	if err != nil {
		return nil, 0, fmt.Errorf("textcalib: %w", err)
	}
	return res, asked, nil
}

// ModelIdentity is calib.ModelIdentity: the sha256 of the model
// directory's config.json and safetensors files.
func ModelIdentity(dir string) (string, error) { return calib.ModelIdentity(dir) }
