package eval

import (
	"errors"
	"fmt"
	"math"
)

// TokenQuality holds the per-position quantities the quality metrics are
// built from, computed in float64 from a reference and a candidate logits
// row over one vocabulary.
type TokenQuality struct {
	// KL is KL(ref‖cand) = Σ p_ref·(log p_ref − log p_cand) in nats; +Inf when
	// the candidate gives zero probability (a −Inf logit) to a token the
	// reference does not.
	KL float64
	// RefTop1 and CandTop1 are the arg-max token ids (lowest id on ties).
	RefTop1, CandTop1 int
	// RefNLL and CandNLL are −log p(target) under each run; NaN when the
	// position has no target.
	RefNLL, CandNLL float64
}

// ErrBadLogits is wrapped by errors about logits that do not define a
// distribution: a NaN or +Inf value, or a row whose values are all −Inf.
var ErrBadLogits = errors.New("logits do not define a distribution")

// rowMax returns the maximum of row and the first index holding it, or an
// error for NaN, +Inf or an all −Inf row.
func rowMax(row []float32) (float64, int, error) {
	m := float32(math.Inf(-1))
	arg := -1
	for i, v := range row {
		if v > m {
			m, arg = v, i
		} else if v != v {
			return 0, 0, fmt.Errorf("NaN at vocabulary index %d: %w", i, ErrBadLogits)
		}
	}
	if arg < 0 {
		return 0, 0, fmt.Errorf("every value is -Inf: %w", ErrBadLogits)
	}
	if math.IsInf(float64(m), 1) {
		return 0, 0, fmt.Errorf("+Inf at vocabulary index %d: %w", arg, ErrBadLogits)
	}
	return float64(m), arg, nil
}

// refRow is a reference logits row prepared once for comparison with any
// number of candidates: e[i] = exp(r_i − max), 0 where r_i = −Inf.
type refRow struct {
	row []float32
	max float64
	arg int
	sum float64 // Σ e
	lse float64 // log Σ exp(r_i) = max + log sum
	e   []float64
}

// prepare fills r from row, reusing r.e when it is large enough.
func (r *refRow) prepare(row []float32) error {
	m, arg, err := rowMax(row)
	if err != nil {
		return fmt.Errorf("reference logits: %w", err)
	}
	if cap(r.e) < len(row) {
		r.e = make([]float64, len(row))
	}
	e := r.e[:len(row)]
	var s float64
	for i, v := range row {
		x := expNonPos(float64(v) - m) // exp(−Inf) = 0
		e[i] = x
		s += x
	}
	r.row, r.max, r.arg, r.e, r.sum = row, m, arg, e, s
	r.lse = m + math.Log(s)
	return nil
}

// compare computes the quantities of one candidate row against the prepared
// reference. The candidate's sum runs in the same order and through the same
// exponential as the reference's, so a candidate equal to the reference
// gives KL 0 and equal NLLs exactly.
func (r *refRow) compare(cand []float32, target int) (TokenQuality, error) {
	var q TokenQuality
	mc, ac, err := rowMax(cand)
	if err != nil {
		return q, fmt.Errorf("candidate logits: %w", err)
	}
	// Sc = Σ e^(c−mc), D = Σ e^(r−mr)·(r − c) over the tokens the reference
	// gives non-zero probability. Then KL = D/Sr − lse_r + lse_c.
	var sc, d float64
	e := r.e
	ref := r.row[:len(e)]
	cand = cand[:len(e)]
	for i, cv := range cand {
		c := float64(cv)
		sc += expNonPos(c - mc)
		if er := e[i]; er != 0 {
			d += er * (float64(ref[i]) - c)
		}
	}
	lseC := mc + math.Log(sc)
	// d is finite or +Inf (r is finite where counted, c finite or −Inf) and
	// Sr ≥ 1, so KL is never NaN. Rounding can take a true 0 slightly below.
	q.KL = max(d/r.sum-r.lse+lseC, 0)
	q.RefTop1, q.CandTop1 = r.arg, ac
	q.RefNLL, q.CandNLL = math.NaN(), math.NaN()
	if target >= 0 {
		q.RefNLL = r.lse - float64(r.row[target])
		q.CandNLL = lseC - float64(cand[target])
	}
	return q, nil
}

// CompareToken computes the per-position quantities for one pair of logits
// rows of equal length. target is the id of the token that follows (for
// perplexity), or negative when there is none. Log-sum-exp and all sums are
// in float64 with the row maximum subtracted first.
func CompareToken(ref, cand []float32, target int) (TokenQuality, error) {
	if len(ref) != len(cand) || len(ref) == 0 {
		return TokenQuality{}, fmt.Errorf("eval: logits rows of %d and %d values", len(ref), len(cand))
	}
	if target >= len(ref) {
		return TokenQuality{}, fmt.Errorf("eval: target id %d outside the vocabulary of %d", target, len(ref))
	}
	var r refRow
	if err := r.prepare(ref); err != nil {
		return TokenQuality{}, err
	}
	return r.compare(cand, target)
}
