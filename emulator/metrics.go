package emulator

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// TokenQuality holds the per-token quantities the quality metrics are built
// from, computed in float64 from two runs' logits over one vocabulary.
type TokenQuality struct {
	// KL is KL(ref‖cand) = Σ p_ref·(log p_ref − log p_cand) in nats; +Inf when
	// the candidate gives zero probability (a −Inf logit) to a token the
	// reference does not.
	KL float64
	// RefTop1 and CandTop1 are the arg-max token ids (lowest id on ties).
	RefTop1, CandTop1 int
	// RefNLL and CandNLL are −log p(target) under each run; NaN when the
	// token has no target.
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

// CompareToken computes the per-token quantities for one pair of logit rows
// of equal length. target is the id of the token that follows (for
// perplexity) or negative when there is none. Log-sum-exp and all sums are
// in float64 with the row maximum subtracted first.
func CompareToken(ref, cand []float32, target int) (TokenQuality, error) {
	var q TokenQuality
	if len(ref) != len(cand) || len(ref) == 0 {
		return q, fmt.Errorf("emulator: logit rows of %d and %d values", len(ref), len(cand))
	}
	if target >= len(ref) {
		return q, fmt.Errorf("emulator: target id %d outside the vocabulary of %d", target, len(ref))
	}
	mr, ar, err := rowMax(ref)
	if err != nil {
		return q, fmt.Errorf("reference logits: %w", err)
	}
	mc, ac, err := rowMax(cand)
	if err != nil {
		return q, fmt.Errorf("candidate logits: %w", err)
	}
	// Sr = Σ e^(r−mr), Sc = Σ e^(c−mc), D = Σ e^(r−mr)·(r − c) over the
	// tokens the reference gives non-zero probability. Then
	// KL = D/Sr − (mr + log Sr) + (mc + log Sc).
	var sr, sc, d float64
	for i, rv := range ref {
		r, c := float64(rv), float64(cand[i])
		ec := expNonPos(c - mc)
		sc += ec
		if math.IsInf(r, -1) {
			continue
		}
		er := expNonPos(r - mr)
		sr += er
		if er != 0 {
			d += er * (r - c)
		}
	}
	lseR := mr + math.Log(sr)
	lseC := mc + math.Log(sc)
	// d is finite or +Inf (r is finite where counted, c finite or −Inf), and
	// sr ≥ 1, so KL is never NaN. Rounding can take a true 0 slightly below.
	q.KL = max(d/sr-lseR+lseC, 0)
	q.RefTop1, q.CandTop1 = ar, ac
	q.RefNLL, q.CandNLL = math.NaN(), math.NaN()
	if target >= 0 {
		q.RefNLL = lseR - float64(ref[target])
		q.CandNLL = lseC - float64(cand[target])
	}
	return q, nil
}

// QualityRow is one line of a quality table: one corpus, or all tokens.
// Undefined values are NaN (no tokens, no targets) and infinite KL or
// perplexity is +Inf; encoding/json cannot encode either, so convert them
// (ttquant compare --json writes null) before marshalling.
type QualityRow struct {
	Corpus string `json:"corpus"`
	// Tokens is the number of tokens scored for top-1 agreement and KL.
	Tokens int64 `json:"tokens"`
	// PPLTokens is the number of those tokens that had a target id.
	PPLTokens int64 `json:"ppl_tokens"`
	// RefPPL and CandPPL are exp(mean NLL) of each run over the PPLTokens;
	// NaN when there are none.
	RefPPL  float64 `json:"ref_ppl"`
	CandPPL float64 `json:"cand_ppl"`
	// DeltaPPLPercent is 100·(CandPPL/RefPPL − 1).
	DeltaPPLPercent float64 `json:"delta_ppl_percent"`
	// Top1 is the fraction of tokens whose arg-max agrees.
	Top1 float64 `json:"top1_agreement"`
	// MeanKL is the mean KL(ref‖cand) in nats.
	MeanKL float64 `json:"mean_kl"`
}

type qualitySums struct {
	tokens, pplTokens, agree int64
	refNLL, candNLL, kl      float64
}

func (s *qualitySums) add(q TokenQuality) {
	s.tokens++
	if q.RefTop1 == q.CandTop1 {
		s.agree++
	}
	s.kl += q.KL
	if !math.IsNaN(q.RefNLL) {
		s.pplTokens++
		s.refNLL += q.RefNLL
		s.candNLL += q.CandNLL
	}
}

func (s *qualitySums) row(corpus string) QualityRow {
	r := QualityRow{Corpus: corpus, Tokens: s.tokens, PPLTokens: s.pplTokens,
		RefPPL: math.NaN(), CandPPL: math.NaN(), DeltaPPLPercent: math.NaN(), Top1: math.NaN(), MeanKL: math.NaN()}
	if s.tokens > 0 {
		r.Top1 = float64(s.agree) / float64(s.tokens)
		r.MeanKL = s.kl / float64(s.tokens)
	}
	if s.pplTokens > 0 {
		r.RefPPL = math.Exp(s.refNLL / float64(s.pplTokens))
		r.CandPPL = math.Exp(s.candNLL / float64(s.pplTokens))
		r.DeltaPPLPercent = 100 * (r.CandPPL/r.RefPPL - 1)
		if r.CandPPL == r.RefPPL { // also covers both +Inf
			r.DeltaPPLPercent = 0
		}
	}
	return r
}

// QualityAccumulator sums per-token quantities per corpus label and overall,
// in the order tokens are added (so results are deterministic for a given
// token order). The zero value is not ready; use NewQualityAccumulator.
type QualityAccumulator struct {
	perLabel map[string]*qualitySums
	overall  qualitySums
}

// NewQualityAccumulator returns an empty accumulator.
func NewQualityAccumulator() *QualityAccumulator {
	return &QualityAccumulator{perLabel: map[string]*qualitySums{}}
}

// Add adds one token's quantities under a corpus label ("" for none).
func (a *QualityAccumulator) Add(q TokenQuality, label string) {
	a.overall.add(q)
	if label == "" {
		return
	}
	s := a.perLabel[label]
	if s == nil {
		s = &qualitySums{}
		a.perLabel[label] = s
	}
	s.add(q)
}

// OverallLabel is the corpus name of the row covering all tokens.
const OverallLabel = "overall"

// Rows returns one row per corpus label, sorted by label, followed by the
// overall row (always present).
func (a *QualityAccumulator) Rows() []QualityRow {
	labels := make([]string, 0, len(a.perLabel))
	for l := range a.perLabel {
		labels = append(labels, l)
	}
	sort.Strings(labels)
	rows := make([]QualityRow, 0, len(labels)+1)
	for _, l := range labels {
		rows = append(rows, a.perLabel[l].row(l))
	}
	return append(rows, a.overall.row(OverallLabel))
}
