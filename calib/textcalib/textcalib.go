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
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/jsonx"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/model/walk"
	"github.com/ttquant/ttquant/internal/progress"
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
	// Progress, when set, receives the data preparation's lines, and one
	// line per finished layer unless Advance is set.
	Progress func(msg string)
	// Advance, when set, receives the build's progress after every forward
	// batch and every finished layer, in one measure for one ETA.
	Advance func(Advance)
	// Shard, naming one of several workers (Count > 1), makes the build
	// that worker of a split store build: it runs the forward pass over
	// its own sequences only and writes their rows as parts, which
	// calib.AssembleStore joins into the store (Store.Shard is set from
	// it). Its bookkeeping is its own (calib.StoreWorkerDir), so workers
	// of different indices run at once in one directory. The zero Spec and
	// 0/1 are the whole build.
	Shard shard.Spec

	// batchRows, when set (tests), bounds the rows of one forward batch
	// instead of forward.BatchRows.
	batchRows int

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
	b, err := open(opt)
	if err != nil {
		return nil, err
	}
	defer b.m.Close()
	if b.assembled {
		return b.alreadyAssembled()
	}
	// One build at a time per directory (per worker for a split build).
	// The lock is released on return; a refusal leaves the directory as it
	// was (one the lock created is removed again).
	_, statErr := os.Stat(opt.Out)
	created := os.IsNotExist(statErr) && !b.split
	var lk *fslock.Lock
	if b.split {
		lk, err = calib.LockStoreWorker(opt.Out, opt.Shard)
	} else {
		lk, err = fslock.Acquire(opt.Out)
	}
	if err != nil {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	defer lk.Release()
	if err := checkSplitMix(opt.Out, b.split); err != nil {
		return nil, err
	}
	fresh, recs, err := b.checkPartial()
	if err != nil {
		return nil, err
	}
	// Weights are read layer by layer below; a NaN or infinity would only
	// show up as non-finite activations, so it is refused here, before the
	// store is created.
	if err := b.m.CheckFinite(); err != nil {
		return nil, err
	}
	w, err := calib.CreateStore(opt.Out, b.prov, b.walk.Lens(0), b.walk.IDs, b.sopt)
	if err != nil {
		return nil, err
	}
	if b.split {
		// A worker walks its own sequences only.
		b.walk = b.walk.Select(w.Sequences())
	}
	finished := 0 // layers recorded, by earlier runs and this one
	defer func() {
		if err == nil {
			return
		}
		w.Abort()
		switch {
		case errors.Is(err, errDamaged) && b.split:
			// The other workers' files are not this worker's to remove.
			err = fmt.Errorf("%w; worker %s's unfinished share in %s cannot be resumed: remove %s to start it over", err, opt.Shard, b.dir.Path, b.dir.Path)
		case errors.Is(err, errDamaged):
			err = fmt.Errorf("%w; the unfinished build in %s cannot be resumed: remove %s to start over", err, opt.Out, opt.Out)
		case b.split:
			err = fmt.Errorf("%w (worker %s is unfinished: its finished layers are kept in %s; run it again to resume)", err, opt.Shard, b.dir.Path)
		case created && finished == 0:
			// Nothing finished: leave nothing behind.
			os.RemoveAll(opt.Out)
			err = fmt.Errorf("%w (no layer was finished; the unfinished store was removed)", err)
		default:
			err = fmt.Errorf("%w (%s is not a store yet: its finished layers are kept in %s; run the same command again to resume, or remove %s to start over)",
				err, opt.Out, b.dir.Path, opt.Out)
		}
	}()
	x, err := b.resume(w, fresh, recs)
	if err != nil {
		return nil, err
	}
	start := len(recs)
	finished = start
	if err := b.walkLayers(ctx, w, x, start, &finished); err != nil {
		return nil, err
	}
	if len(b.walk.IDs) == 0 && start < b.steps {
		opt.progress("worker %s has no sequences: the split has more workers than units", opt.Shard)
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	cfg := b.m.Config
	if b.split {
		// The worker's records stay for a rerun and for the assembly.
		return &Result{Layers: cfg.Layers, MTPLayers: b.mtp, MTPSkipped: cfg.MTPLayers - b.mtp, ResumedAt: start,
			AskedTokens: b.asked, Data: b.data, Split: w.Split()}, nil
	}
	if err := os.RemoveAll(b.dir.Path); err != nil {
		return nil, fmt.Errorf("textcalib: the store is complete, but removing %s failed: %w", b.dir.Path, err)
	}
	st, err := calib.OpenStore(opt.Out)
	if err != nil {
		return nil, err
	}
	return &Result{Store: st, Layers: cfg.Layers, MTPLayers: b.mtp, MTPSkipped: cfg.MTPLayers - b.mtp, ResumedAt: start,
		AskedTokens: b.asked, Data: b.data}, nil
}

// builder is a store build once its inputs are read and checked.
type builder struct {
	opt  Options
	m    *forward.Model
	walk *walk.Walk // a worker's own sequences once the store is created
	dir  walk.Dir   // PartialDir, or a worker's calib.StoreWorkerDir
	// split is set for a worker of a split build; assembled when the
	// store's index exists (only a worker may find it: see
	// alreadyAssembled).
	split, assembled bool
	in               *walk.Inputs
	prov             calib.Provenance
	sopt             calib.StoreOptions
	steps            int // trunk layers, then the MTP layer when it has rows
	mtp              int
	asked            int64
	data             dataset.Provenance
	meter            *meter
}

// open reads and checks everything a build needs, before the output
// directory is touched.
func open(opt Options) (_ *builder, err error) {
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
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	res, asked, err := buildData(opt)
	if err != nil {
		return nil, err
	}
	rows := forward.BatchRows
	if opt.batchRows != 0 {
		rows = opt.batchRows
	}
	wk, err := walk.New(m.Config, res.Calibration.IDs(), rows)
	if err != nil {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	ident, err := calib.ModelIdentity(opt.Model)
	if err != nil {
		return nil, err
	}
	dataProv, err := json.Marshal(res.Provenance)
	if err != nil {
		return nil, err
	}
	b := &builder{opt: opt, m: m, walk: wk, asked: asked, data: res.Provenance, steps: m.Config.Layers,
		split: split, assembled: assembled, dir: walk.Dir{Path: filepath.Join(opt.Out, PartialDir), Faults: opt.Store.Faults}}
	if split {
		b.dir.Path = calib.StoreWorkerDir(opt.Out, opt.Shard)
	}
	b.prov = calib.Provenance{
		Model:     filepath.Base(filepath.Clean(opt.Model)),
		Revision:  ident,
		Sequences: len(wk.IDs), Tokens: wk.Tokens,
		TokenIDsSHA256: res.Provenance.Calibration.TokenIDsSHA256,
		Data:           dataProv,
	}
	// The MTP layer has a row per token that has a successor; with only
	// one-token sequences it has none and is left out.
	if m.Config.MTPLayers > 0 && wk.Tokens > int64(len(wk.IDs)) {
		b.mtp = 1
		b.steps++
	}
	b.sopt = opt.Store
	if b.sopt.DType == 0 {
		b.sopt.DType = safetensors.BF16
	}
	if b.sopt.ShardBytes == 0 {
		b.sopt.ShardBytes = 256 << 20
	}
	b.in = walk.NewInputs(wk, b.prov.TokenIDsSHA256, dataProv)
	b.in.Model, b.in.ModelRevision, b.in.Steps = b.prov.Model, ident, b.steps
	b.in.Settings = []walk.Setting{{Name: "dtype", Value: b.sopt.DType.String()}, {Name: "shard bytes", Value: fmt.Sprint(b.sopt.ShardBytes)}}
	b.sopt.Shard = opt.Shard
	if split {
		// The workers' records carry the build's inputs: the assembly
		// refuses workers of different builds.
		if b.sopt.Build, err = json.Marshal(b.in); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// alreadyAssembled answers a worker run again after the assembly: nothing
// to do if the store is this build's.
func (b *builder) alreadyAssembled() (*Result, error) {
	st, err := calib.OpenStore(b.opt.Out)
	if err != nil {
		return nil, err
	}
	if p := st.Provenance(); p.Model != b.prov.Model || p.Revision != b.prov.Revision || p.TokenIDsSHA256 != b.prov.TokenIDsSHA256 || p.Tokens != b.prov.Tokens {
		return nil, fmt.Errorf("textcalib: %s already holds a calibration store of other inputs (model %s, token ids %s)", b.opt.Out, p.Revision, p.TokenIDsSHA256)
	}
	cfg := b.m.Config
	return &Result{Store: st, Layers: cfg.Layers, MTPLayers: b.mtp, MTPSkipped: cfg.MTPLayers - b.mtp, AskedTokens: b.asked, Data: b.data, AlreadyAssembled: true}, nil
}

// checkPartial reads what an earlier run left and refuses to resume a
// build of other inputs. fresh is set when there is no earlier run; recs
// are the layers it finished.
func (b *builder) checkPartial() (fresh bool, recs []*walk.Record, err error) {
	out := b.opt.Out
	// What to remove to start over: the store's directory, or a worker's
	// own (the other workers' files are not its to remove).
	own := out
	if b.split {
		own = b.dir.Path
	}
	old, err := b.dir.ReadInputs()
	if err != nil {
		return false, nil, fmt.Errorf("textcalib: %w (remove %s to start over)", err, own)
	}
	if old == nil {
		if stray, err := strayShards(out, nil); err != nil {
			return false, nil, err
		} else if len(stray) > 0 {
			return false, nil, fmt.Errorf("textcalib: %s holds shard files (%s) but no record of the build that wrote them (%s/%s); remove them or choose another --out",
				out, stray[0], PartialDir, walk.InputsName)
		}
		return true, nil, nil
	}
	if d := b.in.Diff(old); len(d) > 0 {
		return false, nil, fmt.Errorf("textcalib: %s holds an unfinished build of different inputs: %s; run with the same model, data and options to resume it, or remove %s to start over",
			out, strings.Join(d, "; "), own)
	}
	if recs, err = b.dir.Records(); err != nil {
		return false, nil, fmt.Errorf("textcalib: %w (remove %s to start over)", err, own)
	}
	if len(recs) > b.steps {
		return false, nil, fmt.Errorf("%w: %s records %d finished layers, the build has %d", errDamaged, b.dir.Path, len(recs), b.steps)
	}
	return false, recs, nil
}

// resume prepares the store writer and the partial directory for the
// first unfinished layer and returns the residual stream entering it:
// the finished layers' sites listed, their stream read back (or the
// embeddings for a fresh build), whatever an interrupted layer left
// removed.
func (b *builder) resume(w *calib.StoreWriter, fresh bool, recs []*walk.Record) ([]float32, error) {
	if err := os.MkdirAll(b.dir.Path, 0o755); err != nil {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	if fresh {
		if err := b.dir.WriteInputs(b.in); err != nil {
			return nil, fmt.Errorf("textcalib: %w", err)
		}
	}
	keep := map[string]bool{}
	for _, r := range recs {
		var sd stepData
		if err := jsonx.Unmarshal(r.Data, &sd); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", errDamaged, walk.RecordName(r.Layer), err)
		}
		for _, si := range sd.Sites {
			if err := w.AddWrittenSite(si); err != nil {
				return nil, fmt.Errorf("%w: %w", errDamaged, err)
			}
			for _, sh := range si.Shards {
				keep[sh.File] = true
			}
		}
	}
	var x []float32
	start := len(recs)
	if start > 0 {
		if start < b.steps {
			xs, err := b.dir.Streams(recs[start-1], b.walk.Tokens*int64(b.m.Config.Hidden))
			if err != nil {
				return nil, fmt.Errorf("%w: %w", errDamaged, err)
			}
			x = xs[0]
		}
		b.opt.progress("resuming %s at layer %d of %d: layers 0..%d were finished by an earlier run", b.opt.Out, start, b.steps, start-1)
	} else {
		var err error
		if x, err = walk.Embed(b.m, b.walk.IDs); err != nil {
			return nil, err
		}
	}
	// Whatever an interrupted step left: its shards (a worker's parts),
	// records and streams.
	if err := b.removeStray(keep); err != nil {
		return nil, err
	}
	if err := b.dir.Clean(start); err != nil {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	return x, nil
}

// removeStray removes the shard files (a worker's parts) that keep does
// not list.
func (b *builder) removeStray(keep map[string]bool) error {
	if b.split {
		return cleanParts(b.opt.Out, b.dir.Path, keep)
	}
	stray, err := strayShards(b.opt.Out, keep)
	if err != nil {
		return err
	}
	for _, n := range stray {
		if err := os.Remove(filepath.Join(b.opt.Out, n)); err != nil {
			return fmt.Errorf("textcalib: %w", err)
		}
	}
	return nil
}

// Advance is how far a build is, in rows through layers (every sequence's
// tokens through every trunk layer, and their rows into the MTP layer):
// the forward pass over them is the build's work, so one rate gives one
// ETA. RowsKept are the rows of layers an earlier run finished.
type Advance struct {
	// Kind is "batch" (a forward batch of Layer is done) or "layer"
	// (Layer is written).
	Kind                      string
	Layer, Layers             int
	MTP                       bool
	Rows, RowsTotal, RowsKept int64
	LayerRows, LayerRowsTotal int64
	Elapsed                   time.Duration
}

// ETA is the time left at this run's rate, false before it has done any
// work of its own.
func (a Advance) ETA() (time.Duration, bool) {
	return progress.ETA(a.Elapsed, float64(a.Rows), float64(a.RowsKept), float64(a.RowsTotal))
}

// meter counts the build's rows for Options.Advance.
type meter struct {
	emit  func(Advance)
	began time.Time
	ev    Advance
	per   []int64 // rows of each layer
}

func (b *builder) newMeter(start int) *meter {
	m := &meter{emit: b.opt.Advance, began: time.Now(), per: make([]int64, b.steps)}
	m.ev.Layers = b.steps
	for k := range m.per {
		m.per[k] = int64(walk.Rows(b.walk.Lens(k)))
		m.ev.RowsTotal += m.per[k]
		if k < start {
			m.ev.RowsKept += m.per[k]
		}
	}
	m.ev.Rows = m.ev.RowsKept
	return m
}

// layer starts layer k.
func (m *meter) layer(k int, mtp bool) {
	m.ev.Layer, m.ev.MTP, m.ev.LayerRows, m.ev.LayerRowsTotal = k, mtp, 0, m.per[k]
}

// rows records n more rows of the current layer done; kind as Advance.
func (m *meter) rows(n int64, kind string) {
	m.ev.Rows += n
	m.ev.LayerRows += n
	if m.emit != nil {
		ev := m.ev
		ev.Kind, ev.Elapsed = kind, time.Since(m.began)
		m.emit(ev)
	}
}

// walkLayers runs the layers from start on over the stream x, writing
// each one's sites and record; *finished counts the recorded layers.
func (b *builder) walkLayers(ctx context.Context, w *calib.StoreWriter, x []float32, start int, finished *int) error {
	began := time.Now()
	b.meter = b.newMeter(start)
	for k := start; k < b.steps && len(b.walk.IDs) > 0; k++ {
		b.meter.layer(k, b.walk.IsMTP(k))
		if err := ctx.Err(); err != nil {
			return err
		}
		sites, err := b.step(ctx, w, k, &x)
		if err != nil {
			return err
		}
		var next [][]float32
		if k+1 < b.steps {
			next = append(next, x)
		}
		if err := b.dir.Finish(k, stepData{Sites: sites}, next...); err != nil {
			return fmt.Errorf("textcalib: %w", err)
		}
		*finished = k + 1
		b.meter.rows(0, "layer")
		if b.opt.Progress != nil && b.opt.Advance == nil {
			el := time.Since(began)
			eta, _ := progress.ETA(el, float64(b.meter.ev.Rows), float64(b.meter.ev.RowsKept), float64(b.meter.ev.RowsTotal))
			what := "layer"
			if b.walk.IsMTP(k) {
				what = "MTP layer"
			}
			b.opt.progress("%s %d written (%d/%d; %s elapsed, about %s left)", what, k, k+1, b.steps, el.Round(time.Second), eta.Round(time.Second))
		}
		if b.opt.afterStep != nil {
			if err := b.opt.afterStep(k); err != nil {
				return err
			}
		}
	}
	return nil
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
// them, batch by batch: the mixer's sites per group of sequences, the MoE
// input once per batch.
type siteSink struct {
	ctx   context.Context
	layer int
	base  int // the first row of the batch running
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
	if s.base+a.Row0 != s.next[a.Site] {
		return fmt.Errorf("textcalib: layer %d site %s: rows from %d arrived, row %d was expected", s.layer, a.Site, s.base+a.Row0, s.next[a.Site])
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

// step runs layer k over the residual stream *xp, writing its sites. A
// trunk layer replaces the stream by the one leaving it. The MTP layer
// runs over the rows walk.Enter builds from the trunk's output and the
// token ids (T−1 per sequence, stored next_token-aligned); the trunk's
// output is released (*xp = nil) once they are built.
func (b *builder) step(ctx context.Context, w *calib.StoreWriter, k int, xp *[]float32) ([]calib.SiteInfo, error) {
	z, err := b.walk.Enter(b.m, k, b.walk.IDs, *xp)
	if err != nil {
		return nil, err
	}
	run, what, align := b.m.MTPHead, "MTP layer", calib.AlignNextToken
	if !b.walk.IsMTP(k) {
		l, err := b.m.Layer(k)
		if err != nil {
			return nil, err
		}
		run = func(bt *forward.Batch, hook forward.Hook) ([]float32, error) { return nil, l.Forward(bt, hook) }
		what, align = "layer", calib.AlignToken
	} else {
		*xp = nil
	}
	cols, outSite := siteCols(b.m.Config, k)
	sink, err := newSiteSink(ctx, w, k, outSite, align, cols)
	if err != nil {
		return nil, err
	}
	err = b.walk.Each(ctx, z, b.walk.Lens(k), func(bt *forward.Batch, row0 int) error {
		sink.base = row0
		if _, err := run(bt, sink.hook); err != nil {
			return err
		}
		b.meter.rows(int64(walk.Rows(bt.Lens)), "batch")
		return nil
	})
	if err != nil {
		sink.abort()
		return nil, fmt.Errorf("textcalib: %s %d: %w", what, k, err)
	}
	return sink.close()
}

// buildData loads the model's tokenizer, tokenizes and packs the
// calibration set. It returns the set and the tokens asked for.
func buildData(opt Options) (*dataset.Result, int64, error) {
	tok, err := tokenizer.Load(opt.Model)
	if err != nil {
		return nil, 0, err
	}
	res, asked, err := dataset.BuildCalibration(opt.Data, tok, opt.DataOptions, opt.AllowShort, func(msg string) { opt.progress("%s", msg) })
	if err != nil {
		return nil, 0, fmt.Errorf("textcalib: %w", err)
	}
	return res, asked, nil
}
