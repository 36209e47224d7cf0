package eval

import (
	"fmt"
	"runtime"
	"sync"
)

// Batch is a run of n consecutive positions scored together: the reference
// run's logits and every candidate's, row-major [n, vocab] float32, with what
// each position is scored against.
type Batch struct {
	// Ref holds the reference logits, n rows of vocab values.
	Ref []float32
	// Cands holds each candidate's logits, in candidate order, each the
	// shape of Ref.
	Cands [][]float32
	// Targets[i] is the id of the token position i predicts, negative for
	// none (scored for top-1 and KL only). nil: no position has a target.
	Targets []int32
	// Mask[i] says whether position i is scored at all; nil scores every
	// position.
	Mask []bool
	// Corpus labels the positions: nil for none (the all row only), one
	// label for every position, or one per position.
	Corpus []string
}

// ScorerOptions tune a Scorer. The zero value is usable.
type ScorerOptions struct {
	// Workers is the number of goroutines scoring the positions of a batch
	// (default GOMAXPROCS). Results do not depend on it.
	Workers int
	// All names the row covering every position (default AllCorpus).
	All string
}

// Validate reports a negative worker count (0 selects the default).
func (o ScorerOptions) Validate() error {
	if o.Workers < 0 {
		return fmt.Errorf("eval: %d scorer workers", o.Workers)
	}
	return nil
}

// Scorer scores candidates against a reference in lockstep, a batch of
// positions at a time, so that no run's logits need to be kept: per
// position the reference row is prepared once (float64 log-sum-exp over the
// full vocabulary) and every candidate compared with it. Positions are
// accumulated in the order they are given whatever the number of workers.
type Scorer struct {
	vocab   int
	names   []string
	workers int
	acc     *Accumulator
	refs    []refRow // one per worker
	res     []TokenQuality
	errs    []error
	done    int64 // positions seen, for error messages
}

// NewScorer returns a scorer for logits rows of vocab values and the named
// candidates (the names appear in error messages only).
func NewScorer(vocab int, candidates []string, opt ScorerOptions) (*Scorer, error) {
	if vocab <= 0 {
		return nil, fmt.Errorf("eval: vocabulary of %d tokens", vocab)
	}
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	acc, err := NewAccumulator(len(candidates), opt.All)
	if err != nil {
		return nil, err
	}
	w := opt.Workers
	if w <= 0 {
		w = runtime.GOMAXPROCS(0)
	}
	return &Scorer{vocab: vocab, names: append([]string(nil), candidates...), workers: w, acc: acc, refs: make([]refRow, w)}, nil
}

// Accumulator returns the accumulated results.
func (s *Scorer) Accumulator() *Accumulator { return s.acc }

// Positions returns the number of positions given so far, scored or not.
func (s *Scorer) Positions() int64 { return s.done }

// Score checks a batch, scores its positions and adds them to the
// accumulator. On an error nothing of the batch is added.
func (s *Scorer) Score(b Batch) error {
	v := s.vocab
	if len(b.Ref)%v != 0 {
		return fmt.Errorf("eval: %d reference logits are not whole rows of %d", len(b.Ref), v)
	}
	n := len(b.Ref) / v
	if len(b.Cands) != len(s.names) {
		return fmt.Errorf("eval: batch has %d candidates, want %d", len(b.Cands), len(s.names))
	}
	for k, c := range b.Cands {
		if len(c) != len(b.Ref) {
			return fmt.Errorf("eval: candidate %q has %d logits, the reference %d (%d rows of %d)", s.names[k], len(c), len(b.Ref), n, v)
		}
	}
	if b.Targets != nil && len(b.Targets) != n {
		return fmt.Errorf("eval: %d targets for %d positions", len(b.Targets), n)
	}
	for i, t := range b.Targets {
		if int(t) >= v {
			return fmt.Errorf("eval: position %d: target %d outside the vocabulary of %d", s.done+int64(i), t, v)
		}
	}
	if b.Mask != nil && len(b.Mask) != n {
		return fmt.Errorf("eval: score mask of %d entries for %d positions", len(b.Mask), n)
	}
	if len(b.Corpus) > 1 && len(b.Corpus) != n {
		return fmt.Errorf("eval: %d corpus labels for %d positions", len(b.Corpus), n)
	}
	for _, l := range b.Corpus {
		if l == s.acc.all {
			return fmt.Errorf("eval: corpus label %q is reserved for the row covering all positions", l)
		}
	}
	k := len(s.names)
	if cap(s.res) < n*k {
		s.res = make([]TokenQuality, n*k)
		s.errs = make([]error, n)
	}
	res, errs := s.res[:n*k], s.errs[:n]
	clear(errs)
	workers := min(s.workers, n)
	var wg sync.WaitGroup
	per := (n + max(workers, 1) - 1) / max(workers, 1)
	for w := 0; w < workers; w++ {
		lo, hi := w*per, min((w+1)*per, n)
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func(ref *refRow) {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				if b.Mask != nil && !b.Mask[i] {
					continue
				}
				errs[i] = s.scoreRow(ref, &b, i, res[i*k:(i+1)*k])
			}
		}(&s.refs[w])
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return err.(*PositionError).at(s.done + int64(i))
		}
	}
	for i := 0; i < n; i++ {
		if b.Mask != nil && !b.Mask[i] {
			continue
		}
		label := ""
		switch len(b.Corpus) {
		case 1:
			label = b.Corpus[0]
		case n:
			label = b.Corpus[i]
		}
		if err := s.acc.Add(res[i*k:(i+1)*k], label); err != nil {
			return err
		}
	}
	s.done += int64(n)
	return nil
}

// PositionError reports logits of one position that do not define a
// distribution (it wraps ErrBadLogits).
type PositionError struct {
	// Position counts the positions given to the scorer before this one.
	Position int64
	// Candidate is the candidate's name, "" for the reference.
	Candidate string
	Err       error
}

func (e *PositionError) Error() string {
	if e.Candidate == "" {
		return fmt.Sprintf("eval: position %d: %v", e.Position, e.Err)
	}
	return fmt.Sprintf("eval: position %d, candidate %q: %v", e.Position, e.Candidate, e.Err)
}

func (e *PositionError) Unwrap() error { return e.Err }

func (e *PositionError) at(p int64) *PositionError { e.Position = p; return e }

func (s *Scorer) scoreRow(ref *refRow, b *Batch, i int, out []TokenQuality) error {
	v := s.vocab
	if err := ref.prepare(b.Ref[i*v : (i+1)*v]); err != nil {
		return &PositionError{Err: err}
	}
	target := -1
	if b.Targets != nil {
		target = int(b.Targets[i])
	}
	for k, c := range b.Cands {
		q, err := ref.compare(c[i*v:(i+1)*v], target)
		if err != nil {
			return &PositionError{Candidate: s.names[k], Err: err}
		}
		out[k] = q
	}
	return nil
}
