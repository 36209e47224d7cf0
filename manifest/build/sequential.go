package build

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/jsonx"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/model/walk"
	"github.com/ttquant/ttquant/internal/par"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
	"github.com/ttquant/ttquant/manifest"
)

// A sequential GPTQ build (BuildOptions.Data) quantizes the model layer by
// layer from text: layer l's calibration inputs are computed from the
// residual stream that the already-quantized layers 0 … l−1 produce, its
// matrices are quantized in the order the layer uses them (attention input
// projections, the attention output projection, then the MLP block: the
// shared expert's gate/up then down, the routed experts through the
// calibration driver), and the layer's output is recomputed with the
// values the checkpoint stores to form the next layer's input. The MTP
// layer follows the trunk. docs/calibration.md describes it.
//
// After every layer the build records, in the bookkeeping directory, the
// layer's GPTQ'd dense tensors, its statistics and the residual stream
// leaving it; an interrupted build resumes at the first unfinished layer
// and writes the same bytes.

// seqDir is the bookkeeping of the sequential pass, inside PartialDir.
const seqDir = "sequential"

type sequential struct {
	b    *builder
	cfg  *model.Config
	src  forward.WeightSource // the source checkpoint
	w    *seqWeights
	m    *forward.Model // over Overlay{w, src}
	ref  *forward.Model // over src: the source model for the reference stream
	walk *walk.Walk     // the calibration sequences, the held-out ones last
	held int            // held-out sequences
	dir  walk.Dir       // the walk's resume files: seqDir
	in   *walk.Inputs   // what the walk is over

	mu   sync.Mutex
	done map[string]*produced // the current layer's GPTQ'd dense tensors
}

// sequentialTokenizer loads the model's tokenizer, which a sequential build
// needs besides the tensors and the config the build already read,
// refusing as a real run would; a dry run checks it too.
func (b *builder) sequentialTokenizer() (*tokenizer.Tokenizer, error) {
	dir := b.opt.Source
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		dir = filepath.Dir(dir)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("sequential GPTQ tokenizes the calibration text with the model's tokenizer: %w", err)
	}
	return tok, nil
}

// SequentialWork sizes a sequential build from its calibration options:
// the tokens, the forward passes, the fits and the scratch disk.
type SequentialWork struct {
	Sequences int `json:"sequences"`
	SeqLen    int `json:"seq_len"`
	HeldOut   int `json:"held_out_sequences"`
	// Tokens is Sequences × SeqLen: exact in mode pack, at most that in
	// mode record.
	Tokens     int64 `json:"tokens"`
	Layers     int   `json:"layers"`
	Asymmetric bool  `json:"asymmetric"`
	// RoutedRowsPerLayer is the calibration tokens (held-out ones
	// excluded) times the experts chosen per token.
	RoutedRowsPerLayer int64 `json:"routed_rows_per_layer"`
	// ForwardTokenLayers counts the layer passes of single tokens: every
	// layer runs the quantized stream over all sequences, and the source
	// model's stream over all of them (asymmetric) or the held-out ones.
	ForwardTokenLayers int64 `json:"forward_token_layers"`
	// Fits is the number of GPTQ matrices fitted to the source model's
	// outputs (asymmetric), 0 otherwise.
	Fits int `json:"fits"`
	// ScratchBytes is the peak of the residual streams kept in the output
	// directory's bookkeeping: two layers' streams (the quantized and the
	// source one), float32 × hidden per token.
	ScratchBytes int64 `json:"scratch_bytes"`
	// DiskBytes is what the run needs on the output's file system: the
	// scratch streams and the checkpoint's tensor data.
	DiskBytes int64 `json:"disk_bytes"`
	// FreeBytes is the space free there (on the file system of the output
	// directory, or of its nearest existing parent, FreeDir); -1 when it
	// cannot be told or no output directory was given.
	FreeBytes int64  `json:"free_bytes"`
	FreeDir   string `json:"free_dir,omitempty"`
}

// sequentialWork sizes the sequential build a dry run describes.
func (b *builder) sequentialWork(cfg *model.Config, gptqMatrices int, outputBytes int64) *SequentialWork {
	so := b.opt.DataOptions.Calibration
	w := &SequentialWork{Sequences: so.Sequences, SeqLen: so.SeqLen, HeldOut: b.opt.HeldOutSequences, Asymmetric: b.opt.Asymmetric,
		Tokens: int64(so.Sequences) * int64(so.SeqLen), Layers: cfg.NumLayers()}
	if cfg.MTPLayers > 0 {
		w.Layers = cfg.Layers + 1 // the pass runs the first MTP layer only
	}
	held := int64(b.opt.HeldOutSequences) * int64(so.SeqLen)
	w.RoutedRowsPerLayer = (w.Tokens - held) * int64(cfg.TopK)
	ref := held
	if b.opt.Asymmetric {
		ref = w.Tokens
		w.Fits = gptqMatrices
	}
	w.ForwardTokenLayers = int64(w.Layers) * (w.Tokens + ref)
	w.ScratchBytes = 2 * (w.Tokens + ref) * int64(cfg.Hidden) * 4
	w.DiskBytes = w.ScratchBytes + outputBytes
	w.FreeBytes, w.FreeDir = b.freeAt(b.opt.Out)
	return w
}

// openSequential prepares a sequential build: the forward model, the
// tokenizer and the calibration text. Everything that can refuse the build
// happens here, before the output directory is touched.
func (b *builder) openSequential(ctx context.Context) error {
	cfg := b.modelCfg
	tok, err := b.sequentialTokenizer()
	if err != nil {
		return err
	}
	src := forward.NewCheckpoint(b.model)
	ref, err := forward.New(cfg, src)
	if err != nil {
		return err
	}
	if b.opt.DataOptions.Calibration.Sequences <= 0 {
		return errors.New("manifest: the data options build no calibration sequences")
	}
	res, _, err := dataset.BuildCalibration(b.opt.Data, tok, b.opt.DataOptions, b.opt.AllowShortData, b.opt.DataOptions.Progress)
	if err != nil {
		return err
	}
	wk, err := walk.New(cfg, res.Calibration.IDs(), forward.BatchRows)
	if err != nil {
		return fmt.Errorf("manifest: calibration %w", err)
	}
	ids, tokens := wk.IDs, wk.Tokens
	if b.opt.HeldOutSequences >= len(ids) {
		return fmt.Errorf("manifest: %d held-out sequences of the data's %d leave none for calibration", b.opt.HeldOutSequences, len(ids))
	}
	s := &sequential{b: b, cfg: cfg, src: src, ref: ref, walk: wk, held: b.opt.HeldOutSequences, done: map[string]*produced{},
		dir: walk.Dir{Path: filepath.Join(b.opt.Out, manifest.PartialDir, seqDir), Faults: b.opt.Faults}}
	if s.w, err = newSeqWeights(b); err != nil {
		return err
	}
	if s.m, err = forward.New(cfg, forward.Overlay{s.w, src}); err != nil {
		return err
	}
	// The manifest records the text's content, not where it was read
	// from: the same text gives the same identity from any directory.
	provJSON, err := json.Marshal(res.Provenance.Content())
	if err != nil {
		return err
	}
	hash := res.Provenance.Calibration.TokenIDsSHA256
	s.in = walk.NewInputs(wk, hash, jsonx.Compact(provJSON))
	s.in.Steps = wk.Layers()
	s.in.Settings = []walk.Setting{{Name: "held-out sequences", Value: fmt.Sprint(s.held)}, {Name: "asymmetric", Value: fmt.Sprint(b.opt.Asymmetric)}}
	b.calib = &manifest.CalibInfo{Sequences: int64(len(ids)), Tokens: tokens, HeldOutSequences: int64(s.held), SHA256: hash,
		Mode: manifest.CalibModeSequential, TokenIDsSHA256: hash, Data: jsonx.Compact(provJSON)}
	// Layers past the first MTP layer have no inputs the forward pass can
	// compute: their experts are rounded, with the reason recorded.
	for l := range b.gptqLayers {
		if l > cfg.Layers {
			delete(b.gptqLayers, l)
		}
	}
	b.seq = s
	b.hess = &storeHessians{store: &memSites{}, roles: b.roles(), tensors: b.tensors, family: b.opt.Family, stored: b.storedValues, cache: map[string]*hessEntry{}}
	return nil
}

func (b *builder) roles() map[string]string {
	roles := map[string]string{}
	for _, t := range b.tensors {
		roles[t.name] = t.role
	}
	return roles
}

// lookup returns a GPTQ'd (or weighted-rounded) dense tensor of the current layer, or of a
// finished layer from the bookkeeping directory; nil when st has none.
func (s *sequential) lookup(st *storedTensor) (*produced, error) {
	if !s.b.calibrated(st) || st.isExpertMatrix() || st.layer < 0 {
		return nil, nil
	}
	s.mu.Lock()
	p := s.done[st.name]
	s.mu.Unlock()
	if p != nil {
		return p, nil
	}
	rec := s.readRecord(st.layer)
	if rec == nil {
		return nil, nil
	}
	for _, t := range rec.Dense {
		if t.Entry.Name != st.name {
			continue
		}
		path := s.blobPath(st.layer, st.name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if int64(len(data)) != t.Entry.Length || manifest.SHA256Hex(data) != t.Entry.SHA256 {
			return nil, fmt.Errorf("%s does not hold the bytes its layer record names (remove %s to start the build over)", path, filepath.Join(s.b.opt.Out, manifest.PartialDir))
		}
		te := t.Entry
		te.SHA256, te.Length = "", 0
		return &produced{data: data, te: te, ms: t.Stats}, nil
	}
	return nil, nil
}

// seqTensor is a GPTQ'd dense tensor in a layer record: its entry (Length
// and SHA256 describe the bytes kept beside the record) and statistics.
type seqTensor struct {
	Entry manifest.TensorEntry  `json:"entry"`
	Stats *manifest.MatrixStats `json:"stats,omitempty"`
}

// seqLayer is what the record of a finished layer of a sequential build
// holds beside its streams (walk.Record): the layer's statistics and its
// GPTQ'd dense tensors, whose bytes are kept beside the record. The
// streams leaving the layer are the quantized one (every calibration row)
// and the source model's (every sequence in an asymmetric build, else the
// held-out ones).
type seqLayer struct {
	Stats manifest.LayerStats `json:"stats"`
	Dense []seqTensor         `json:"dense,omitempty"`
}

func (s *sequential) blobPath(l int, name string) string {
	return filepath.Join(s.dir.Path, fmt.Sprintf("layer-%03d", l), name+".bin")
}

// readRecord returns the record of finished layer l, nil when there is
// none or it is damaged (the layer is then redone).
func (s *sequential) readRecord(l int) *seqLayer {
	r, err := s.dir.Record(l)
	if err != nil || r == nil {
		return nil
	}
	var sl seqLayer
	if json.Unmarshal(r.Data, &sl) != nil {
		return nil
	}
	return &sl
}

// layers lists the layers the pass runs: the trunk, then the first MTP
// layer when the model has one.
func (s *sequential) layers() []int {
	out := make([]int, s.walk.Layers())
	for i := range out {
		out[i] = i
	}
	return out
}

// calibSeqs is the number of sequences whose rows feed the Hessians.
func (s *sequential) calibSeqs() int { return len(s.walk.IDs) - s.held }

// refIDs are the sequences the source model's stream runs on: every one in
// an asymmetric build (it gives the fits' targets), else the held-out ones
// (it measures the drift).
func (s *sequential) refIDs() [][]int32 {
	if s.b.opt.Asymmetric {
		return s.walk.IDs
	}
	return s.walk.IDs[s.calibSeqs():]
}

// run performs the sequential pass and returns the per-layer statistics.
// Expert files of GPTQ layers are written as their layers finish (through
// keep and commit, as runGPTQLayer does for a store build).
func (s *sequential) run(ctx context.Context, layerJobs map[int][]int, keep func(int) bool, commit func(int, *fileRecord) error) ([]manifest.LayerStats, error) {
	b := s.b
	layers := s.layers()
	out, x, xref, err := s.resume(layerJobs, keep)
	if err != nil {
		return nil, err
	}
	start := len(out)
	// GPTQ matrices outside the layers the pass runs (the embedding or LM
	// head with --layers all) have no calibration inputs and are rounded
	// to nearest; the forward pass uses them as stored.
	for _, st := range b.tensors {
		if st.method == manifest.MethodGPTQ && !st.isExpertMatrix() && (st.layer < 0 || st.layer >= len(layers)) {
			data, _, _, err := b.produce(ctx, st)
			if err != nil {
				return nil, fmt.Errorf("tensor %s (shape %v): %w", st.name, st.shape, err)
			}
			s.w.set(st, data)
		}
	}
	if start == 0 {
		if x, err = walk.Embed(s.m, s.walk.IDs); err != nil {
			return nil, err
		}
		if xref, err = walk.Embed(s.ref, s.refIDs()); err != nil {
			return nil, err
		}
	}
	for _, l := range layers[:start] {
		b.track.layerDone(l, true)
	}
	for _, l := range layers[start:] {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b.track.layerStart(l)
		if x, err = s.walk.Enter(s.m, l, s.walk.IDs, x); err != nil {
			return nil, err
		}
		if xref, err = s.walk.Enter(s.ref, l, s.refIDs(), xref); err != nil {
			return nil, err
		}
		ls, err := s.layer(ctx, l, x, xref, layerJobs[l], keep, commit)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		out = append(out, *ls)
		if b.opt.testHook != nil {
			b.opt.testHook(seqDir, fmt.Sprintf("layer %d", l))
		}
		b.track.layerDone(l, false)
	}
	return out, nil
}

// resume returns the statistics of the layers an earlier run of the same
// walk finished and the streams leaving the last of them: the layers up
// to the first one unrecorded, damaged or with an expert file that no
// longer checks (the streams entering it are gone). When the streams to
// start from do not check, or the walk is not the recorded one, the pass
// starts over at layer 0 and the records of the abandoned pass are
// removed, so that they cannot stand in for the layers about to be redone.
func (s *sequential) resume(layerJobs map[int][]int, keep func(int) bool) (out []manifest.LayerStats, x, xref []float32, err error) {
	var recs []*walk.Record
	if old, err := s.dir.ReadInputs(); err == nil && old != nil && len(s.in.Diff(old)) == 0 {
		recs, _ = s.dir.Records()
	}
	for _, r := range recs {
		var sl seqLayer
		if json.Unmarshal(r.Data, &sl) != nil {
			break // damaged: the layer is redone
		}
		if !s.kept(layerJobs[r.Layer], keep) {
			out = nil
			break
		}
		out = append(out, sl.Stats)
	}
	if start := len(out); start > 0 && start < s.walk.Layers() {
		lens := s.walk.Lens(start - 1)
		n, nref := walk.Rows(lens), walk.Rows(lens[s.calibSeqs():])
		if s.b.opt.Asymmetric {
			nref = n
		}
		H := int64(s.cfg.Hidden)
		xs, err := s.dir.Streams(recs[start-1], int64(n)*H, int64(nref)*H)
		if err != nil {
			out = nil // the pass starts over and rewrites every record
		} else {
			x, xref = xs[0], xs[1]
		}
	}
	if len(out) == 0 {
		if err := os.RemoveAll(s.dir.Path); err != nil {
			return nil, nil, nil, err
		}
		return nil, nil, nil, s.dir.WriteInputs(s.in)
	}
	return out, x, xref, s.dir.Clean(len(out))
}

// changed names what differs between the walk this build runs and the one
// an interrupted run recorded; nil when none is recorded.
func (s *sequential) changed() []string {
	old, err := s.dir.ReadInputs()
	if err != nil || old == nil {
		return nil
	}
	return s.in.Diff(old)
}

// kept reports whether every expert file of jobs still checks.
func (s *sequential) kept(jobs []int, keep func(int) bool) bool {
	for _, i := range jobs {
		if !keep(i) {
			return false
		}
	}
	return true
}

// stages groups a layer's GPTQ'd dense tensors (and those whose rounding
// is weighted by their inputs, builder.weighted) by the input they need, in
// the order the layer computes them.
type seqStages struct {
	attnIn, attnOut, mlpIn, down, other []*storedTensor
}

func (s *sequential) stages(l int) seqStages {
	var st seqStages
	for _, t := range s.b.tensors {
		if t.layer != l || t.isExpertMatrix() || !s.b.calibrated(t) {
			continue
		}
		r := model.Role(t.role)
		if r == model.RoleSharedDown || r == model.RoleMLPDown {
			st.down = append(st.down, t)
			continue
		}
		switch s.b.opt.Family.Site(r) {
		case calib.SiteAttn:
			st.attnIn = append(st.attnIn, t)
		case calib.SiteOProj, calib.SiteOutProj:
			st.attnOut = append(st.attnOut, t)
		case calib.SiteMoE:
			st.mlpIn = append(st.mlpIn, t)
		default:
			st.other = append(st.other, t)
		}
	}
	return st
}

// layer runs the sequential step of layer l: x is the stream entering it
// (every calibration row, the held-out sequences last) and is replaced by
// the stream leaving it; xref is the source model's stream (on every
// sequence in an asymmetric build, else on the held-out ones), advanced
// the same way.
func (s *sequential) layer(ctx context.Context, l int, x, xref []float32, jobs []int, keep func(int) bool, commit func(int, *fileRecord) error) (*manifest.LayerStats, error) {
	b := s.b
	H := s.cfg.Hidden
	sl := &seqStep{l: l, lens: s.walk.Lens(l), x: x, xref: xref, st: s.stages(l)}
	sl.calibRows = walk.Rows(sl.lens[:s.calibSeqs()])
	sl.sites = &memSites{layer: l, calibRows: sl.calibRows}
	b.hess = &storeHessians{store: sl.sites, calibTokens: int64(sl.calibRows), roles: b.roles(), tensors: b.tensors, family: b.opt.Family, stored: b.storedValues, cache: map[string]*hessEntry{}}
	// An asymmetric build runs the source layer on the source stream
	// (every sequence) beside the quantized one, stage by stage.
	if b.opt.Asymmetric || s.held > 0 {
		var err error
		if sl.rl, err = forward.LoadLayer(s.src, s.cfg, l); err != nil {
			return nil, err
		}
	}
	if err := s.quantize(ctx, sl.st.other); err != nil {
		return nil, err
	}
	var ms float64
	for _, v := range x[:sl.calibRows*H] {
		ms += float64(v) * float64(v)
	}
	fl, err := s.mixer(ctx, sl)
	if err != nil {
		return nil, err
	}
	ls, err := s.mlp(ctx, sl, fl, jobs, keep, commit)
	if err != nil {
		return nil, err
	}
	if sl.calibRows > 0 {
		ls.ResidualMeanSquare = ms / float64(sl.calibRows*H)
	}
	if s.held > 0 {
		// The held-out sequences are the last of both streams.
		href := xref[len(xref)-(len(x)-sl.calibRows*H):]
		var d, r float64
		for i, v := range href {
			e := float64(x[sl.calibRows*H+i]) - float64(v)
			d += e * e
			r += float64(v) * float64(v)
		}
		if r > 0 {
			ls.HeldOutStreamRelMSE = d / r
		}
	}
	if err := s.finishLayer(l, ls, x, xref); err != nil {
		return nil, err
	}
	return ls, nil
}

// seqStep is one layer's step of the sequential pass.
type seqStep struct {
	l         int
	lens      []int // rows per sequence
	calibRows int   // rows of the calibration sequences, which come first
	x, xref   []float32
	st        seqStages
	sites     *memSites
	rl        *forward.Layer // the source model's layer, for xref
}

// quantize produces the tensors ts (GPTQ or weighted rounding from the
// current sites) and hands their stored values to the forward pass.
func (s *sequential) quantize(ctx context.Context, ts []*storedTensor) error {
	return par.For(ctx, len(ts), s.b.opt.Workers, func(i int) error {
		t := ts[i]
		data, te, ms, err := s.b.produce(ctx, t)
		if err != nil {
			return fmt.Errorf("tensor %s (shape %v): %w", t.name, t.shape, err)
		}
		s.mu.Lock()
		s.done[t.name] = &produced{data: data, te: te, ms: ms}
		s.mu.Unlock()
		s.w.set(t, data)
		return nil
	})
}

// mixer quantizes the token mixer's matrices, each from its input with the
// matrices before it decided, and then advances the streams by the mixer.
// It returns the layer with the mixer as stored.
func (s *sequential) mixer(ctx context.Context, sl *seqStep) (*forward.Layer, error) {
	asym := s.b.opt.Asymmetric
	for _, stage := range []struct {
		site forward.Site
		name string
		ts   []*storedTensor
	}{
		{forward.SiteAttnIn, calib.SiteAttn, sl.st.attnIn},
		{forward.SiteAttnOut, s.outSite(sl.l), sl.st.attnOut},
	} {
		if len(stage.ts) == 0 {
			continue
		}
		fl, err := forward.LoadLayer(forward.Overlay{s.w, s.src}, s.cfg, sl.l)
		if err != nil {
			return nil, err
		}
		rows, cols, err := s.walk.Collect(ctx, fl, sl.x, sl.lens, stage.site)
		if err != nil {
			return nil, err
		}
		sl.sites.set(stage.name, rows, cols)
		if asym {
			trows, _, err := s.walk.Collect(ctx, sl.rl, sl.xref, sl.lens, stage.site)
			if err != nil {
				return nil, err
			}
			sl.sites.setTarget(stage.name, trows)
		}
		if err := s.quantize(ctx, stage.ts); err != nil {
			return nil, err
		}
		sl.sites.drop(stage.name)
	}
	// The mixer is decided: the stream gains its output, once.
	fl, err := forward.LoadLayer(forward.Overlay{s.w, s.src}, s.cfg, sl.l)
	if err != nil {
		return nil, err
	}
	if err := s.walk.Each(ctx, sl.x, sl.lens, func(b *forward.Batch, _ int) error { return fl.ForwardMixer(b, nil) }); err != nil {
		return nil, err
	}
	if asym {
		err = s.walk.Each(ctx, sl.xref, sl.lens, func(b *forward.Batch, _ int) error { return sl.rl.ForwardMixer(b, nil) })
	}
	return fl, err
}

// mlp quantizes the MLP block from its input on the stream the mixer left
// (the shared expert's or dense MLP's gate/up, then down, then the routed
// experts), then advances the streams by the block with every value the
// checkpoint stores; the source stream goes through the source layer
// (the whole layer for the held-out sequences of a symmetric build).
//
// fl, the layer as the mixer left it, is loaded again only after a dense
// tensor of the block was decided: the routed experts are not held by a
// Layer but read through the overlay whenever the block runs, so their
// stored values need no new load.
func (s *sequential) mlp(ctx context.Context, sl *seqStep, fl *forward.Layer, jobs []int, keep func(int) bool, commit func(int, *fileRecord) error) (*manifest.LayerStats, error) {
	asym := s.b.opt.Asymmetric
	var expertStats *manifest.LayerStats
	experts := s.b.gptqLayers[sl.l]
	stale := false // a dense tensor of the block was decided after fl was loaded
	if len(sl.st.mlpIn) > 0 || len(sl.st.down) > 0 || experts {
		rows, err := s.walk.MLPInput(ctx, fl, sl.x, sl.lens)
		if err != nil {
			return nil, err
		}
		sl.sites.set(calib.SiteMoE, rows, s.cfg.Hidden)
		var trows []float32
		if asym {
			if trows, err = s.walk.MLPInput(ctx, sl.rl, sl.xref, sl.lens); err != nil {
				return nil, err
			}
			sl.sites.setTarget(calib.SiteMoE, trows)
		}
		if err := s.quantize(ctx, sl.st.mlpIn); err != nil {
			return nil, err
		}
		if err := s.quantize(ctx, sl.st.down); err != nil {
			return nil, err
		}
		stale = len(sl.st.mlpIn) > 0 || len(sl.st.down) > 0
		if experts {
			// The routed experts see the router and shared expert as
			// stored.
			if stale {
				if fl, err = forward.LoadLayer(forward.Overlay{s.w, s.src}, s.cfg, sl.l); err != nil {
					return nil, err
				}
				stale = false
			}
			if expertStats, err = s.experts(ctx, sl.l, fl, rows, trows, sl.calibRows, jobs, keep, commit); err != nil {
				return nil, err
			}
		}
		sl.sites.drop(calib.SiteMoE)
	}
	// The layer's output with every value the checkpoint stores.
	if stale {
		var err error
		if fl, err = forward.LoadLayer(forward.Overlay{s.w, s.src}, s.cfg, sl.l); err != nil {
			return nil, err
		}
	}
	if err := s.walk.Each(ctx, sl.x, sl.lens, func(b *forward.Batch, _ int) error { return fl.ForwardMLP(b, nil) }); err != nil {
		return nil, err
	}
	var err error
	switch {
	case asym:
		err = s.walk.Each(ctx, sl.xref, sl.lens, func(b *forward.Batch, _ int) error { return sl.rl.ForwardMLP(b, nil) })
	case s.held > 0:
		err = s.walk.Each(ctx, sl.xref, sl.lens[s.calibSeqs():], func(b *forward.Batch, _ int) error { return sl.rl.Forward(b, nil) })
	}
	if err != nil {
		return nil, err
	}
	if expertStats != nil {
		return expertStats, nil
	}
	return &manifest.LayerStats{Layer: sl.l}, nil
}

func (s *sequential) outSite(l int) string {
	if s.cfg.Kind(l) == model.FullAttention {
		return calib.SiteOProj
	}
	return calib.SiteOutProj
}

// experts quantizes layer l's routed experts from the MoE inputs rows
// (every sequence; the first calibRows feed the Hessians, the rest measure
// the held-out error) and writes the layer's expert files. Every expert's
// stored bytes are handed to the forward pass, whose files may also have
// been kept from an earlier run.
func (s *sequential) experts(ctx context.Context, l int, fl *forward.Layer, rows, trows []float32, calibRows int, jobs []int, keep func(int) bool, commit func(int, *fileRecord) error) (*manifest.LayerStats, error) {
	if fl.MoE == nil {
		return nil, fmt.Errorf("the plan quantizes routed experts of a layer the config makes dense")
	}
	ex, err := s.b.expertPairs(l)
	if err != nil {
		return nil, err
	}
	ml := *fl.MoE
	ml.Experts = finiteExperts{src: ml.Experts, ex: ex}
	if err := ml.Check(); err != nil {
		return nil, err
	}
	H := s.cfg.Hidden
	cal := calib.Activations{X: rows[: calibRows*H : calibRows*H], Tokens: calibRows}
	if trows != nil {
		// The source model's MoE inputs at the same tokens: an
		// asymmetric fit.
		cal.Target = trows[: calibRows*H : calibRows*H]
	}
	held := calib.Activations{X: rows[calibRows*H:], Tokens: len(rows)/H - calibRows}
	return s.b.quantizeExperts(ctx, l, s.b.pendingFiles(jobs, keep), commit, &ml, ex, cal, held, s.w.set)
}

// finishLayer records layer l: its GPTQ'd dense tensors, then through the
// walk the streams leaving it and the record naming them all; the walk
// then removes the previous layer's streams.
func (s *sequential) finishLayer(l int, ls *manifest.LayerStats, x, xref []float32) error {
	rec := seqLayer{Stats: *ls}
	s.mu.Lock()
	names := make([]string, 0, len(s.done))
	for n := range s.done {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := s.done[n]
		sum, err := s.b.opt.Faults.WriteFile(s.blobPath(l, n), p.data)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		te := p.te
		te.Length, te.SHA256 = int64(len(p.data)), sum
		rec.Dense = append(rec.Dense, seqTensor{Entry: te, Stats: p.ms})
	}
	s.done = map[string]*produced{}
	s.mu.Unlock()
	s.w.forget(l)
	if l == s.walk.Layers()-1 {
		return s.dir.Finish(l, rec)
	}
	return s.dir.Finish(l, rec, x, xref)
}

// memSites is the siteSource of one layer of a sequential build: the rows
// of the sites collected so far, every sequence's (the first calibRows
// feed the Hessians).
type memSites struct {
	layer     int
	calibRows int
	mu        sync.Mutex
	rows      map[string][]float32
	cols      map[string]int
	// targets holds, in an asymmetric build, the source model's rows of a
	// site at the same tokens (its own stream through its own layers).
	targets map[string][]float32
}

// setTarget records the source model's rows of a site.
func (m *memSites) setTarget(site string, rows []float32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.targets == nil {
		m.targets = map[string][]float32{}
	}
	m.targets[site] = rows
}

// calibTargetsOf returns the calibration rows of a site and the source
// model's rows at the same tokens; t is nil when no targets were recorded.
func (m *memSites) calibTargetsOf(layer int, site string, tokens int64) (x, t []float32, cols int, err error) {
	x, cols, err = m.calibRowsOf(layer, site, tokens)
	if err != nil {
		return nil, nil, 0, err
	}
	m.mu.Lock()
	all := m.targets[site]
	m.mu.Unlock()
	if all == nil {
		return x, nil, cols, nil
	}
	if len(all) < len(x) {
		return nil, nil, 0, fmt.Errorf("the source model's %q rows of layer %d hold %d values, the calibration rows %d", site, layer, len(all), len(x))
	}
	return x, all[:len(x)], cols, nil
}

func (m *memSites) set(site string, rows []float32, cols int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rows == nil {
		m.rows, m.cols = map[string][]float32{}, map[string]int{}
	}
	m.rows[site], m.cols[site] = rows, cols
}

func (m *memSites) drop(site string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.rows, site)
	delete(m.targets, site)
}

func (m *memSites) get(layer int, site string) ([]float32, int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[site]
	if !ok || layer != m.layer {
		return nil, 0, false
	}
	return r, m.cols[site], true
}

// Site implements siteSource.
func (m *memSites) Site(layer int, site string) (calib.SiteInfo, bool) {
	r, c, ok := m.get(layer, site)
	if !ok {
		return calib.SiteInfo{}, false
	}
	return calib.SiteInfo{Layer: layer, Site: site, Cols: c, Tokens: int64(len(r) / c), DType: "F32"}, true
}

func (m *memSites) calibRowsOf(layer int, site string, tokens int64) ([]float32, int, error) {
	r, c, ok := m.get(layer, site)
	if !ok {
		return nil, 0, fmt.Errorf("no %q inputs for layer %d", site, layer)
	}
	n := min(int(tokens), m.calibRows)
	return r[:n*c], c, nil
}

// SiteHessian implements siteSource.
func (m *memSites) SiteHessian(ctx context.Context, layer int, site string, tokens int64) (*gptq.Hessian, error) {
	r, c, err := m.calibRowsOf(layer, site, tokens)
	if err != nil {
		return nil, err
	}
	return calib.RowsHessian(ctx, r, c)
}

// SwiGLUHessian implements siteSource.
func (m *memSites) SwiGLUHessian(ctx context.Context, layer int, site string, tokens int64, gate, up []float32, inter int) (*gptq.Hessian, error) {
	r, c, err := m.calibRowsOf(layer, site, tokens)
	if err != nil {
		return nil, err
	}
	return calib.SwiGLURowsHessian(ctx, r, c, gate, up, inter)
}
