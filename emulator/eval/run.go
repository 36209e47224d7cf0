package eval

import (
	"context"
	"fmt"
	"time"

	"github.com/ttquant/ttquant/internal/progress"
)

// A Model is one run of an evaluation (the reference or a candidate): it
// evaluates a window of tokens from a fresh state and then yields the
// window's next-token logits a range of positions at a time, so that the
// logits of a whole window (2,048 × a large vocabulary) need never exist at
// once.
type Model interface {
	// Forward runs the model over tokens from a fresh state (empty caches,
	// zero recurrent state, no BOS added).
	Forward(ctx context.Context, tokens []int32) (WindowLogits, error)
}

// A BatchModel is a Model that can also run several windows in one pass,
// layer by layer over all of them, so that each layer's weights are read
// (and decoded) once per batch rather than once per window. The logits of
// every window must be those Forward gives for it alone, bit for bit.
type BatchModel interface {
	Model
	// ForwardBatch runs the model over each window of tokens from a fresh
	// state; the i-th result gives the logits of windows[i], valid until
	// the next Forward or ForwardBatch.
	ForwardBatch(ctx context.Context, windows [][]int32) ([]WindowLogits, error)
}

// WindowLogits gives the logits of the window last run by a Model.
type WindowLogits interface {
	// Logits writes the logits of positions [lo, hi) into dst, row-major
	// (hi−lo)×vocab float32.
	Logits(dst []float32, lo, hi int) error
}

// Progress reports how far Evaluate is.
type Progress struct {
	Windows, WindowsDone int
	// Scored and ScoredDone count the positions to score and scored.
	Scored, ScoredDone int64
	Elapsed            time.Duration
}

// ETA is the time left at the rate of scored positions so far, false
// before a position is scored.
func (p Progress) ETA() (time.Duration, bool) {
	return progress.ETA(p.Elapsed, float64(p.ScoredDone), 0, float64(p.Scored))
}

// EvalOptions tune Evaluate. The zero value is usable.
type EvalOptions struct {
	// Chunk is the number of positions whose logits are fetched from every
	// run at a time (default 16). Memory is Chunk × vocab × (candidates+1)
	// float32 values.
	Chunk int
	// BatchTokens, when positive and every run is a BatchModel, groups
	// consecutive windows of up to BatchTokens tokens in all (a longer
	// window alone) into one pass of each run, each layer over the whole
	// group (the layer-major schedule). Memory grows with it: each run
	// keeps BatchTokens × hidden float32 states and its layers' work
	// space for that many rows. The scores do not depend on it. 0: one
	// window at a time.
	BatchTokens int
	// Progress, when set, is called after each window, scored or not.
	Progress func(Progress)
	// Now returns the time (default time.Now), for tests.
	Now func() time.Time
	// Windows, when non-nil, are the only windows run (indices into the
	// windows given): one worker's share of a split evaluation.
	Windows []int
	// Record, when set, receives each window's scores as it is finished
	// (WindowScores), for a split evaluation's later merge.
	Record func(WindowScores)
}

// Validate reports a negative chunk (0 selects the default) or batch.
func (o EvalOptions) Validate() error {
	if o.Chunk < 0 {
		return fmt.Errorf("eval: a chunk of %d positions", o.Chunk)
	}
	if o.BatchTokens < 0 {
		return fmt.Errorf("eval: batches of %d tokens", o.BatchTokens)
	}
	return nil
}

// Evaluate runs the reference and every candidate over each window (or
// group of windows, opt.BatchTokens) in lockstep, and scores the
// candidates with s (whose candidates must be cands, in order) window by
// window in order, a chunk of positions at a time. Chunks without a
// scored position are not fetched. Every window's shape is checked
// before anything runs.
func Evaluate(ctx context.Context, s *Scorer, ref Model, cands []Model, windows []Window, opt EvalOptions) error {
	if err := opt.Validate(); err != nil {
		return err
	}
	if len(cands) != len(s.names) {
		return fmt.Errorf("eval: %d candidate models for a scorer of %d candidates", len(cands), len(s.names))
	}
	chunk := opt.Chunk
	if chunk <= 0 {
		chunk = 16
	}
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	var only map[int]bool
	if opt.Windows != nil {
		only = map[int]bool{}
		for _, wi := range opt.Windows {
			only[wi] = true
		}
	}
	// The progress counts the windows run: a worker's share, or all.
	var p Progress
	for wi := range windows {
		w := &windows[wi]
		if len(w.Targets) != len(w.Tokens) || len(w.Score) != len(w.Tokens) {
			return fmt.Errorf("eval: window %d (%s record %d at %d): %d tokens, %d targets, %d mask entries", wi, w.Corpus, w.Record, w.Start, len(w.Tokens), len(w.Targets), len(w.Score))
		}
		if only == nil || only[wi] {
			p.Windows++
			p.Scored += int64(w.Scored())
		}
	}
	v := s.vocab
	refBuf := make([]float32, chunk*v)
	candBuf := make([][]float32, len(cands))
	for k := range candBuf {
		candBuf[k] = make([]float32, chunk*v)
	}
	start := now()
	report := func(w *Window) {
		p.WindowsDone++
		p.ScoredDone += int64(w.Scored())
		p.Elapsed = now().Sub(start)
		if opt.Progress != nil {
			opt.Progress(p)
		}
	}
	// finished records a window's scores (opt.Record) and reports it.
	var started int64
	finished := func(w *Window) {
		if r := s.acc.rec; r != nil {
			r.Positions = s.done - started
			s.acc.rec = nil
			opt.Record(*r)
		}
		report(w)
	}
	defer func() { s.acc.rec = nil }()
	batch := batcher{ref: ref, cands: cands, names: s.names, tokens: opt.BatchTokens}
	if !batch.possible() {
		batch.tokens = 0
	}
	for lo := 0; lo < len(windows); {
		hi, run := batch.group(windows, lo, func(wi int) bool { return only == nil || only[wi] })
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := batch.forward(ctx, windows, run); err != nil {
			return err
		}
		k := 0
		for wi := lo; wi < hi; wi++ {
			w := &windows[wi]
			if only != nil && !only[wi] {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if opt.Record != nil {
				s.acc.rec, started = &WindowScores{Window: wi}, s.done
			}
			if w.Scored() == 0 {
				s.done += int64(len(w.Tokens))
				finished(w)
				continue
			}
			if err := scoreWindow(s, w, wi, batch.ref1[k], batch.runs[k], chunk, refBuf, candBuf); err != nil {
				return err
			}
			k++
			s.acc.EndWindow()
			finished(w)
		}
		lo = hi
	}
	return nil
}

// batcher runs the reference and the candidates over groups of windows:
// one window at a time through Forward, or, with tokens > 0, groups of up
// to that many tokens through ForwardBatch.
type batcher struct {
	ref    Model
	cands  []Model
	names  []string
	tokens int
	// ref1[k] and runs[k] are the logits of the group's k-th window run
	// (the reference's, and every candidate's).
	ref1 []WindowLogits
	runs [][]WindowLogits
}

// possible reports whether every run can take a group of windows.
func (b *batcher) possible() bool {
	if _, ok := b.ref.(BatchModel); !ok {
		return false
	}
	for _, m := range b.cands {
		if _, ok := m.(BatchModel); !ok {
			return false
		}
	}
	return true
}

// group returns the end of the group of windows starting at lo and the
// windows of it to run: those in the share (in) with a scored position,
// as many as fit in b.tokens (at least one; one without batching). A
// window outside the share or without a scored position never ends a
// group.
func (b *batcher) group(windows []Window, lo int, in func(int) bool) (hi int, run []int) {
	total := 0
	hi = lo
	for ; hi < len(windows); hi++ {
		w := &windows[hi]
		if !in(hi) || w.Scored() == 0 {
			continue
		}
		n := len(w.Tokens)
		if len(run) > 0 && (b.tokens <= 0 || total+n > b.tokens) {
			break
		}
		run, total = append(run, hi), total+n
	}
	return hi, run
}

// forward starts every run over the windows of run; a window's shape is
// checked first.
func (b *batcher) forward(ctx context.Context, windows []Window, run []int) error {
	b.ref1 = b.ref1[:0]
	b.runs = b.runs[:0]
	if len(run) == 0 {
		return nil
	}
	toks := make([][]int32, len(run))
	for k, wi := range run {
		toks[k] = windows[wi].Tokens
	}
	what := func() string {
		w := &windows[run[0]]
		if len(run) == 1 {
			return fmt.Sprintf("window %d (%s record %d at %d)", run[0], w.Corpus, w.Record, w.Start)
		}
		return fmt.Sprintf("windows %d–%d (from %s record %d at %d)", run[0], run[len(run)-1], w.Corpus, w.Record, w.Start)
	}
	rl, err := b.start(b.ref, ctx, toks)
	if err != nil {
		return fmt.Errorf("eval: reference, %s: %w", what(), err)
	}
	b.ref1 = rl
	cl := make([][]WindowLogits, len(b.cands))
	for k, m := range b.cands {
		if cl[k], err = b.start(m, ctx, toks); err != nil {
			return fmt.Errorf("eval: candidate %q, %s: %w", b.names[k], what(), err)
		}
	}
	for i := range run {
		row := make([]WindowLogits, len(b.cands))
		for k := range b.cands {
			row[k] = cl[k][i]
		}
		b.runs = append(b.runs, row)
	}
	return nil
}

// start runs m over the windows toks: one Forward without batching.
func (b *batcher) start(m Model, ctx context.Context, toks [][]int32) ([]WindowLogits, error) {
	if b.tokens <= 0 {
		wl, err := m.Forward(ctx, toks[0])
		return []WindowLogits{wl}, err
	}
	wls, err := m.(BatchModel).ForwardBatch(ctx, toks)
	if err == nil && len(wls) != len(toks) {
		err = fmt.Errorf("%d logits for %d windows", len(wls), len(toks))
	}
	return wls, err
}

// WindowScores is what one window added to a scorer: the positions it
// gave (scored or not) and, for every scored position in order, its corpus
// label and the candidates' quantities (Labels[i] with Qualities[i·K …
// (i+1)·K) for K candidates). Replayed in window order (Scorer.Replay),
// the windows of several processes give the accumulator, and so the
// table, of one process that scored them all, bit for bit.
type WindowScores struct {
	Window    int
	Positions int64
	Labels    []string
	Qualities []TokenQuality
}

// Replay adds a window's recorded scores as Evaluate added them.
func (s *Scorer) Replay(ws WindowScores) error {
	k := len(s.names)
	if len(ws.Qualities) != len(ws.Labels)*k {
		return fmt.Errorf("eval: window %d: %d recorded qualities for %d positions of %d candidates", ws.Window, len(ws.Qualities), len(ws.Labels), k)
	}
	for i, l := range ws.Labels {
		if err := s.acc.Add(ws.Qualities[i*k:(i+1)*k], l); err != nil {
			return fmt.Errorf("eval: window %d: %w", ws.Window, err)
		}
	}
	s.acc.EndWindow()
	s.done += ws.Positions
	return nil
}

// scoreWindow scores window wi of the reference's logits rl against the
// candidates' runs, chunk positions at a time through the buffers; chunks
// without a scored position are counted and skipped.
func scoreWindow(s *Scorer, w *Window, wi int, rl WindowLogits, runs []WindowLogits, chunk int, refBuf []float32, candBuf [][]float32) error {
	v := s.vocab
	for lo := 0; lo < len(w.Tokens); lo += chunk {
		hi := min(lo+chunk, len(w.Tokens))
		scored := false
		for _, ok := range w.Score[lo:hi] {
			scored = scored || ok
		}
		if !scored {
			s.done += int64(hi - lo)
			continue
		}
		n := (hi - lo) * v
		if err := rl.Logits(refBuf[:n], lo, hi); err != nil {
			return fmt.Errorf("eval: reference, window %d positions [%d,%d): %w", wi, lo, hi, err)
		}
		cs := make([][]float32, len(runs))
		for k := range runs {
			if err := runs[k].Logits(candBuf[k][:n], lo, hi); err != nil {
				return fmt.Errorf("eval: candidate %q, window %d positions [%d,%d): %w", s.names[k], wi, lo, hi, err)
			}
			cs[k] = candBuf[k][:n]
		}
		if err := s.Score(w.Batch(lo, hi, refBuf[:n], cs)); err != nil {
			return fmt.Errorf("eval: window %d (%s record %d at %d): %w", wi, w.Corpus, w.Record, w.Start, err)
		}
	}
	return nil
}
