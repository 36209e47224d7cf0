package build

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/forward"
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

// seqChunkRows bounds the token rows a forward pass handles at once.
const seqChunkRows = 8192

type sequential struct {
	b    *builder
	cfg  *model.Config
	src  forward.WeightSource // the source checkpoint
	w    *seqWeights
	m    *forward.Model // over Overlay{w, src}
	ref  *forward.Model // over src: the source model for the reference stream
	ids  [][]int32      // calibration sequences, the held-out ones last
	held int            // held-out sequences

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

// freeAt finds the free space where dir is or would be created: on the
// file system of dir or of its nearest existing parent.
func freeAt(dir string) (int64, string) {
	if dir == "" {
		return -1, ""
	}
	d, err := filepath.Abs(dir)
	if err != nil {
		return -1, ""
	}
	for {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			if n, ok := freeBytes(d); ok {
				return n, d
			}
			return -1, ""
		}
		parent := filepath.Dir(d)
		if parent == d {
			return -1, ""
		}
		d = parent
	}
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
	w.FreeBytes, w.FreeDir = freeAt(b.opt.Out)
	return w
}

// errSeqStop ends a forward pass once the wanted sites are collected.
var errSeqStop = errors.New("sequential: sites collected")

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
	ids := res.Calibration.IDs()
	var tokens int64
	for i, s := range ids {
		for t, id := range s {
			if id < 0 || int(id) >= cfg.Vocab {
				return fmt.Errorf("manifest: calibration sequence %d token %d: id %d outside the model's vocabulary 0..%d", i, t, id, cfg.Vocab-1)
			}
		}
		tokens += int64(len(s))
	}
	if b.opt.HeldOutSequences >= len(ids) {
		return fmt.Errorf("manifest: %d held-out sequences of the data's %d leave none for calibration", b.opt.HeldOutSequences, len(ids))
	}
	s := &sequential{b: b, cfg: cfg, src: src, ref: ref, ids: ids, held: b.opt.HeldOutSequences, done: map[string]*produced{}}
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
	b.calib = &manifest.CalibInfo{Sequences: int64(len(ids)), Tokens: tokens, HeldOutSequences: int64(s.held), SHA256: hash,
		Mode: manifest.CalibModeSequential, TokenIDsSHA256: hash, Data: compactJSON(provJSON)}
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
	rec, err := s.readRecord(st.layer)
	if err != nil || rec == nil {
		return nil, err
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

// seqRecord is the bookkeeping of one finished layer of a sequential
// build, written after everything it names.
type seqRecord struct {
	Layer int                 `json:"layer"`
	Stats manifest.LayerStats `json:"stats"`
	Dense []seqTensor         `json:"dense,omitempty"`
	// Residual names the residual stream leaving the layer (every
	// calibration row) and Ref the source model's stream on the held-out
	// sequences, both as little-endian float32.
	Residual string `json:"residual_sha256,omitempty"`
	Ref      string `json:"ref_sha256,omitempty"`
}

func (s *sequential) dir() string { return filepath.Join(s.b.opt.Out, manifest.PartialDir, seqDir) }

func (s *sequential) recordPath(l int) string {
	return filepath.Join(s.dir(), fmt.Sprintf("layer-%03d.json", l))
}

func (s *sequential) blobPath(l int, name string) string {
	return filepath.Join(s.dir(), fmt.Sprintf("layer-%03d", l), name+".bin")
}

func (s *sequential) streamPath(l int, ref bool) string {
	if ref {
		return filepath.Join(s.dir(), fmt.Sprintf("stream-%03d.ref.f32", l))
	}
	return filepath.Join(s.dir(), fmt.Sprintf("stream-%03d.f32", l))
}

func (s *sequential) readRecord(l int) (*seqRecord, error) {
	data, err := os.ReadFile(s.recordPath(l))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r seqRecord
	if json.Unmarshal(data, &r) != nil || r.Layer != l {
		return nil, nil // damaged: the layer is redone
	}
	return &r, nil
}

// layers lists the layers the pass runs: the trunk, then the first MTP
// layer when the model has one.
func (s *sequential) layers() []int {
	n := s.cfg.Layers
	if s.cfg.MTPLayers > 0 {
		n++
	}
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// calibSeqs is the number of sequences whose rows feed the Hessians.
func (s *sequential) calibSeqs() int { return len(s.ids) - s.held }

// refIDs are the sequences the source model's stream runs on: every one in
// an asymmetric build (it gives the fits' targets), else the held-out ones
// (it measures the drift).
func (s *sequential) refIDs() [][]int32 {
	if s.b.opt.Asymmetric {
		return s.ids
	}
	return s.ids[s.calibSeqs():]
}

// lens returns the row count of every sequence entering layer l: the
// tokens for a trunk layer, one fewer for the MTP layer (its last token
// has no next token to predict).
func (s *sequential) lens(l int) []int {
	out := make([]int, len(s.ids))
	for i, q := range s.ids {
		out[i] = len(q)
		if l >= s.cfg.Layers {
			out[i] = max(len(q)-1, 0)
		}
	}
	return out
}

func sum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

// run performs the sequential pass and returns the per-layer statistics.
// Expert files of GPTQ layers are written as their layers finish (through
// keep and commit, as runGPTQLayer does for a store build).
func (s *sequential) run(ctx context.Context, layerJobs map[int][]int, keep func(int) bool, commit func(int, *fileRecord) error) ([]manifest.LayerStats, error) {
	b := s.b
	layers := s.layers()
	var out []manifest.LayerStats
	// Resume: the finished layers' records, in order, and the stream
	// leaving the last of them.
	start := 0
	for _, l := range layers {
		r, err := s.readRecord(l)
		if err != nil {
			return nil, err
		}
		if r == nil {
			break
		}
		// A finished layer's expert files must still check; if one does
		// not, the streams entering that layer are gone and the pass
		// starts over (files that check are kept).
		intact := true
		for _, i := range layerJobs[l] {
			if !keep(i) {
				intact = false
			}
		}
		if !intact {
			start, out = 0, nil
			break
		}
		out = append(out, r.Stats)
		start = l + 1
	}
	var x, xref []float32
	if start > 0 {
		r, _ := s.readRecord(start - 1)
		var err error
		x, xref, err = s.loadStreams(start-1, r)
		if err != nil {
			// The recorded stream does not check: the pass starts over
			// and rewrites every record.
			start, out = 0, nil
		}
	}
	if start == 0 {
		// Records of an abandoned pass must not stand in for the layers
		// about to be redone.
		if err := os.RemoveAll(s.dir()); err != nil {
			return nil, err
		}
	}
	// GPTQ matrices outside the layers the pass runs (the embedding or LM
	// head with --layers all) have no calibration inputs and are rounded
	// to nearest; the forward pass uses them as stored.
	inPass := map[int]bool{}
	for _, l := range layers {
		inPass[l] = true
	}
	for _, st := range b.tensors {
		if st.method == manifest.MethodGPTQ && !st.isExpertMatrix() && !inPass[st.layer] {
			data, _, _, err := b.produce(ctx, st)
			if err != nil {
				return nil, fmt.Errorf("tensor %s (shape %v): %w", st.name, st.shape, err)
			}
			s.w.set(st, data)
		}
	}
	if start == 0 {
		var err error
		if x, err = s.embed(s.m, s.ids); err != nil {
			return nil, err
		}
		if xref, err = s.embed(s.ref, s.refIDs()); err != nil {
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
		if l == s.cfg.Layers {
			// The MTP layer's input: the final hidden state at t with the
			// embedding of token t+1.
			var err error
			if x, err = s.m.MTPInputs(s.ids, x); err != nil {
				return nil, err
			}
			if xref, err = s.ref.MTPInputs(s.refIDs(), xref); err != nil {
				return nil, err
			}
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

func (s *sequential) embed(m *forward.Model, ids [][]int32) ([]float32, error) {
	var x []float32
	for _, q := range ids {
		e, err := m.Embed(q)
		if err != nil {
			return nil, err
		}
		x = append(x, e...)
	}
	return x, nil
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
		switch {
		case r == model.RoleSharedDown || r == model.RoleMLPDown:
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
	lens := s.lens(l)
	calibRows := sum(lens[:s.calibSeqs()])
	sites := &memSites{layer: l, calibRows: calibRows}
	b.hess = &storeHessians{store: sites, calibTokens: int64(calibRows), roles: b.roles(), tensors: b.tensors, family: b.opt.Family, stored: b.storedValues, cache: map[string]*hessEntry{}}
	st := s.stages(l)
	// An asymmetric build runs the source layer on the source stream
	// (every sequence) beside the quantized one, stage by stage.
	asym := b.opt.Asymmetric
	var rl *forward.Layer
	if asym || s.held > 0 {
		var err error
		if rl, err = forward.LoadLayer(s.src, s.cfg, l); err != nil {
			return nil, err
		}
	}
	quantize := func(ts []*storedTensor) error {
		return par.For(ctx, len(ts), b.opt.Workers, func(i int) error {
			t := ts[i]
			data, te, ms, err := b.produce(ctx, t)
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
	if err := quantize(st.other); err != nil {
		return nil, err
	}
	var ms float64
	for _, v := range x[:calibRows*H] {
		ms += float64(v) * float64(v)
	}
	// The attention stages: each needs the layer run up to its input with
	// the matrices before it quantized.
	for _, stage := range []struct {
		site forward.Site
		name string
		ts   []*storedTensor
	}{
		{forward.SiteAttnIn, calib.SiteAttn, st.attnIn},
		{forward.SiteAttnOut, s.outSite(l), st.attnOut},
	} {
		if len(stage.ts) == 0 {
			continue
		}
		rows, cols, err := s.collect(ctx, l, x, lens, stage.site)
		if err != nil {
			return nil, err
		}
		sites.set(stage.name, rows, cols)
		if asym {
			trows, _, err := s.collectFrom(ctx, rl, xref, lens, stage.site)
			if err != nil {
				return nil, err
			}
			sites.setTarget(stage.name, trows)
		}
		if err := quantize(stage.ts); err != nil {
			return nil, err
		}
		sites.drop(stage.name)
	}
	// The mixer is decided: the stream gains its output, once.
	fl, err := forward.LoadLayer(forward.Overlay{s.w, s.src}, s.cfg, l)
	if err != nil {
		return nil, err
	}
	if err := s.inPlace(x, lens, func(b *forward.Batch) error { return fl.ForwardMixer(b, nil) }); err != nil {
		return nil, err
	}
	if asym {
		if err := s.inPlace(xref, lens, func(b *forward.Batch) error { return rl.ForwardMixer(b, nil) }); err != nil {
			return nil, err
		}
	}
	// The MLP block, from its input on that stream.
	var expertStats *manifest.LayerStats
	experts := b.gptqLayers[l]
	if len(st.mlpIn) > 0 || len(st.down) > 0 || experts {
		rows, err := s.mlpInput(fl, x, lens)
		if err != nil {
			return nil, err
		}
		sites.set(calib.SiteMoE, rows, H)
		var trows []float32
		if asym {
			if trows, err = s.mlpInput(rl, xref, lens); err != nil {
				return nil, err
			}
			sites.setTarget(calib.SiteMoE, trows)
		}
		if err := quantize(st.mlpIn); err != nil {
			return nil, err
		}
		if err := quantize(st.down); err != nil {
			return nil, err
		}
		if experts {
			// The routed experts see the router and shared expert as
			// stored.
			fl, err := forward.LoadLayer(forward.Overlay{s.w, s.src}, s.cfg, l)
			if err != nil {
				return nil, err
			}
			if expertStats, err = s.experts(ctx, l, fl, rows, trows, calibRows, jobs, keep, commit); err != nil {
				return nil, err
			}
		}
		sites.drop(calib.SiteMoE)
	}
	// The layer's output with every value the checkpoint stores.
	if fl, err = forward.LoadLayer(forward.Overlay{s.w, s.src}, s.cfg, l); err != nil {
		return nil, err
	}
	if err := s.inPlace(x, lens, func(b *forward.Batch) error { return fl.ForwardMLP(b, nil) }); err != nil {
		return nil, err
	}
	ls := &manifest.LayerStats{Layer: l}
	if expertStats != nil {
		ls = expertStats
	}
	if calibRows > 0 {
		ls.ResidualMeanSquare = ms / float64(calibRows*H)
	}
	switch {
	case asym:
		if err := s.inPlace(xref, lens, func(b *forward.Batch) error { return rl.ForwardMLP(b, nil) }); err != nil {
			return nil, err
		}
	case s.held > 0:
		if err := s.advance(rl, xref, lens[s.calibSeqs():]); err != nil {
			return nil, err
		}
	}
	if s.held > 0 {
		// The held-out sequences are the last of both streams.
		href := xref[len(xref)-(len(x)-calibRows*H):]
		var d, r float64
		for i, v := range href {
			e := float64(x[calibRows*H+i]) - float64(v)
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

func (s *sequential) outSite(l int) string {
	if s.cfg.Kind(l) == model.FullAttention {
		return calib.SiteOProj
	}
	return calib.SiteOutProj
}

// chunks splits the sequences into consecutive groups of at most
// seqChunkRows rows (at least one sequence each).
func chunks(lens []int) [][2]int {
	var out [][2]int
	for i := 0; i < len(lens); {
		j, rows := i, 0
		for j < len(lens) && (j == i || rows+lens[j] <= seqChunkRows) {
			rows += lens[j]
			j++
		}
		out = append(out, [2]int{i, j})
		i = j
	}
	return out
}

// collect runs layer l, as currently decided, over a copy of x and returns
// the rows of one site for every sequence.
func (s *sequential) collect(ctx context.Context, l int, x []float32, lens []int, site forward.Site) ([]float32, int, error) {
	fl, err := forward.LoadLayer(forward.Overlay{s.w, s.src}, s.cfg, l)
	if err != nil {
		return nil, 0, err
	}
	return s.collectFrom(ctx, fl, x, lens, site)
}

// collectFrom is collect with the layer given.
func (s *sequential) collectFrom(ctx context.Context, fl *forward.Layer, x []float32, lens []int, site forward.Site) ([]float32, int, error) {
	H := s.cfg.Hidden
	var out []float32
	cols := 0
	row := 0
	for _, c := range chunks(lens) {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		n := sum(lens[c[0]:c[1]])
		buf := append([]float32(nil), x[row*H:(row+n)*H]...)
		base := row
		hook := func(a *forward.Activations) error {
			if a.Site == site {
				if cols == 0 {
					cols = a.Cols
					out = make([]float32, sum(lens)*cols)
				}
				if a.Cols != cols {
					return fmt.Errorf("site %s has %d columns, then %d", site, cols, a.Cols)
				}
				copy(out[(base+a.Row0)*cols:], a.X[:a.Rows*cols])
			}
			if a.Site == forward.SiteMLPIn {
				return errSeqStop
			}
			return nil
		}
		err := fl.Forward(&forward.Batch{Lens: lens[c[0]:c[1]], X: buf}, hook)
		if err != nil && !errors.Is(err, errSeqStop) {
			return nil, 0, err
		}
		row += n
	}
	if cols == 0 {
		return nil, 0, fmt.Errorf("the layer produced no %s activations", site)
	}
	return out, cols, nil
}

// inPlace runs f over x in place, chunk by chunk.
func (s *sequential) inPlace(x []float32, lens []int, f func(*forward.Batch) error) error {
	H := s.cfg.Hidden
	row := 0
	for _, c := range chunks(lens) {
		n := sum(lens[c[0]:c[1]])
		if err := f(&forward.Batch{Lens: lens[c[0]:c[1]], X: x[row*H : (row+n)*H]}); err != nil {
			return err
		}
		row += n
	}
	return nil
}

// mlpInput returns the MLP block's input rows (the post-attention norm of
// the stream x, which ForwardMixer left), every sequence's.
func (s *sequential) mlpInput(fl *forward.Layer, x []float32, lens []int) ([]float32, error) {
	H := s.cfg.Hidden
	out := make([]float32, 0, len(x))
	err := s.inPlace(x, lens, func(b *forward.Batch) error {
		err := fl.ForwardMLP(b, func(a *forward.Activations) error {
			if a.Site == forward.SiteMLPIn {
				out = append(out, a.X[:a.Rows*H]...)
				return errSeqStop
			}
			return nil
		})
		if errors.Is(err, errSeqStop) {
			return nil
		}
		if err == nil {
			return errors.New("the layer produced no MLP input")
		}
		return err
	})
	return out, err
}

// advance runs layer fl over x in place, chunk by chunk.
func (s *sequential) advance(fl *forward.Layer, x []float32, lens []int) error {
	H := s.cfg.Hidden
	row := 0
	for _, c := range chunks(lens) {
		n := sum(lens[c[0]:c[1]])
		if err := fl.Forward(&forward.Batch{Lens: lens[c[0]:c[1]], X: x[row*H : (row+n)*H]}, nil); err != nil {
			return err
		}
		row += n
	}
	return nil
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

// finishLayer records layer l: its GPTQ'd dense tensors, the streams
// leaving it and, last, the record naming them; then the previous layer's
// streams are removed.
func (s *sequential) finishLayer(l int, ls *manifest.LayerStats, x, xref []float32) error {
	rec := seqRecord{Layer: l, Stats: *ls}
	s.mu.Lock()
	names := make([]string, 0, len(s.done))
	for n := range s.done {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := s.done[n]
		if _, err := s.b.opt.Faults.WriteFile(s.blobPath(l, n), p.data); err != nil {
			s.mu.Unlock()
			return err
		}
		te := p.te
		te.Length, te.SHA256 = int64(len(p.data)), manifest.SHA256Hex(p.data)
		rec.Dense = append(rec.Dense, seqTensor{Entry: te, Stats: p.ms})
	}
	s.done = map[string]*produced{}
	s.mu.Unlock()
	s.w.forget(l)
	last := l == s.layers()[len(s.layers())-1]
	if !last {
		var err error
		if rec.Residual, err = writeFloats(s.b.opt.Faults, s.streamPath(l, false), x); err != nil {
			return err
		}
		if rec.Ref, err = writeFloats(s.b.opt.Faults, s.streamPath(l, true), xref); err != nil {
			return err
		}
	}
	if err := writeJSONAtomic(s.b.opt.Faults, s.recordPath(l), rec); err != nil {
		return err
	}
	if l > 0 {
		os.Remove(s.streamPath(l-1, false))
		os.Remove(s.streamPath(l-1, true))
	}
	return nil
}

// loadStreams reads the streams leaving layer l as its record names them.
func (s *sequential) loadStreams(l int, r *seqRecord) (x, xref []float32, err error) {
	if r == nil {
		return nil, nil, errors.New("no record")
	}
	if x, err = readFloats(s.streamPath(l, false), r.Residual); err != nil {
		return nil, nil, err
	}
	if xref, err = readFloats(s.streamPath(l, true), r.Ref); err != nil {
		return nil, nil, err
	}
	lens := s.lens(l)
	want := sum(lens) * s.cfg.Hidden
	if len(x) != want {
		return nil, nil, fmt.Errorf("stream of layer %d holds %d values, want %d", l, len(x), want)
	}
	if !s.b.opt.Asymmetric {
		want = sum(lens[s.calibSeqs():]) * s.cfg.Hidden
	}
	if len(xref) != want {
		return nil, nil, fmt.Errorf("source stream of layer %d holds %d values, want %d", l, len(xref), want)
	}
	return x, xref, nil
}

func writeFloats(faults atomicfile.Faults, path string, v []float32) (string, error) {
	buf := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(f))
	}
	return faults.WriteFile(path, buf)
}

func readFloats(path, sha string) ([]float32, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if manifest.SHA256Hex(data) != sha || len(data)%4 != 0 {
		return nil, fmt.Errorf("%s does not hold the stream its record names", path)
	}
	v := make([]float32, len(data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return v, nil
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
