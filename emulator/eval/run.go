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

// Validate reports a negative chunk (0 selects the default).
func (o EvalOptions) Validate() error {
	if o.Chunk < 0 {
		return fmt.Errorf("eval: a chunk of %d positions", o.Chunk)
	}
	return nil
}

// Evaluate runs the reference and every candidate over each window in
// lockstep, a chunk of positions at a time, and scores the candidates with
// s (whose candidates must be cands, in order). Chunks without a scored
// position are not fetched.
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
	for i := range windows {
		if only == nil || only[i] {
			p.Windows++
			p.Scored += int64(windows[i].Scored())
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
	runs := make([]WindowLogits, len(cands))
	for wi := range windows {
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
		if len(w.Targets) != len(w.Tokens) || len(w.Score) != len(w.Tokens) {
			return fmt.Errorf("eval: window %d (%s record %d at %d): %d tokens, %d targets, %d mask entries", wi, w.Corpus, w.Record, w.Start, len(w.Tokens), len(w.Targets), len(w.Score))
		}
		if w.Scored() == 0 {
			s.done += int64(len(w.Tokens))
			finished(w)
			continue
		}
		rl, err := ref.Forward(ctx, w.Tokens)
		if err != nil {
			return fmt.Errorf("eval: reference, window %d (%s record %d at %d): %w", wi, w.Corpus, w.Record, w.Start, err)
		}
		for k, m := range cands {
			if runs[k], err = m.Forward(ctx, w.Tokens); err != nil {
				return fmt.Errorf("eval: candidate %q, window %d (%s record %d at %d): %w", s.names[k], wi, w.Corpus, w.Record, w.Start, err)
			}
		}
		if err := scoreWindow(s, w, wi, rl, runs, chunk, refBuf, candBuf); err != nil {
			return err
		}
		s.acc.EndWindow()
		finished(w)
	}
	return nil
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
