package eval

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// AllCorpus is the default corpus name of the row covering every scored
// position.
const AllCorpus = "all"

// Row is one line of a quality table: one candidate over one corpus, or over
// all positions. Undefined values are NaN (no positions, no targets) and an
// infinite KL or perplexity is +Inf; the JSON encoding writes both as null.
type Row struct {
	Corpus string `json:"corpus"`
	// Tokens is the number of positions scored for top-1 agreement and KL.
	Tokens int64 `json:"tokens"`
	// PPLTokens is the number of those positions that had a target token.
	PPLTokens int64 `json:"ppl_tokens"`
	// RefPPL and CandPPL are exp(mean NLL) of each run over the PPLTokens.
	RefPPL  float64 `json:"ref_ppl"`
	CandPPL float64 `json:"cand_ppl"`
	// DeltaPPLPercent is 100·(CandPPL/RefPPL − 1); exactly 0 when the two
	// perplexities are equal.
	DeltaPPLPercent float64 `json:"delta_ppl_percent"`
	// Top1 is the fraction of positions whose arg-max agrees.
	Top1 float64 `json:"top1_agreement"`
	// MeanKL is the mean KL(ref‖cand) in nats.
	MeanKL float64 `json:"mean_kl"`
	// P99KL is the 99th percentile of the per-position KL (nearest rank: the
	// smallest value that at least 99% of the positions do not exceed).
	P99KL float64 `json:"p99_kl"`
	// Windows is the number of evaluation windows the positions came
	// from; the standard errors treat the windows as the independent
	// units (positions within a window are correlated): for a ratio
	// mean m = ΣY_w / ΣN_w over windows w, SE² = W/(W−1)·Σ(Y_w − m·N_w)²
	// / (ΣN_w)². DeltaPPLSE is in percentage points (the delta method on
	// 100·(exp(d) − 1), d the mean NLL difference). NaN with fewer than
	// two windows.
	Windows    int     `json:"windows"`
	DeltaPPLSE float64 `json:"delta_ppl_percent_se"`
	Top1SE     float64 `json:"top1_agreement_se"`
	MeanKLSE   float64 `json:"mean_kl_se"`
}

// cluster accumulates the moments of one ratio mean's per-window sums Y_w
// over per-window counts N_w.
type cluster struct {
	w             int
	sy2, syn, sn2 float64
}

func (c *cluster) add(y, n float64) {
	c.w++
	c.sy2 += y * y
	c.syn += y * n
	c.sn2 += n * n
}

// se is the standard error of the ratio mean m over total counts.
func (c *cluster) se(m, total float64) float64 {
	if c.w < 2 || total <= 0 || math.IsNaN(m) || math.IsInf(m, 0) {
		return math.NaN()
	}
	v := (c.sy2 - 2*m*c.syn + m*m*c.sn2) * float64(c.w) / float64(c.w-1) / (total * total)
	return math.Sqrt(max(v, 0))
}

// sums accumulates one candidate over one corpus.
type sums struct {
	tokens, pplTokens, agree int64
	refNLL, candNLL, kl      float64
	kls                      []float64 // every position's KL, for the percentile
	// The open window's sums and the closed windows' moments.
	wTokens, wPPL       int64
	wAgree, wKL, wDelta float64
	klC, agreeC, deltaC cluster
}

func (s *sums) add(q *TokenQuality) {
	s.tokens++
	s.wTokens++
	if q.RefTop1 == q.CandTop1 {
		s.agree++
		s.wAgree++
	}
	s.kl += q.KL
	s.wKL += q.KL
	s.kls = append(s.kls, q.KL)
	if !math.IsNaN(q.RefNLL) {
		s.pplTokens++
		s.refNLL += q.RefNLL
		s.candNLL += q.CandNLL
		s.wPPL++
		s.wDelta += q.CandNLL - q.RefNLL
	}
}

// endWindow closes the open window (nothing when it is empty).
func (s *sums) endWindow() {
	if s.wTokens == 0 {
		return
	}
	s.klC.add(s.wKL, float64(s.wTokens))
	s.agreeC.add(s.wAgree, float64(s.wTokens))
	if s.wPPL > 0 {
		s.deltaC.add(s.wDelta, float64(s.wPPL))
	}
	s.wTokens, s.wPPL, s.wAgree, s.wKL, s.wDelta = 0, 0, 0, 0, 0
}

// Percentile returns the nearest-rank p-th percentile (1 ≤ p ≤ 100) of xs:
// the value at rank ⌈p·n/100⌉ (1-based) of the n sorted values; NaN for an
// empty slice or p outside the range. xs is not modified.
func Percentile(xs []float64, p int) float64 {
	if len(xs) == 0 || p < 1 || p > 100 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := (p*len(s) + 99) / 100
	return s[rank-1]
}

func (s *sums) row(corpus string) Row {
	c := *s // positions after the last EndWindow form one more window
	c.endWindow()
	r := Row{Corpus: corpus, Tokens: s.tokens, PPLTokens: s.pplTokens,
		RefPPL: math.NaN(), CandPPL: math.NaN(), DeltaPPLPercent: math.NaN(), Top1: math.NaN(), MeanKL: math.NaN(), P99KL: math.NaN(),
		Windows: c.klC.w, DeltaPPLSE: math.NaN(), Top1SE: math.NaN(), MeanKLSE: math.NaN()}
	if s.tokens > 0 {
		r.Top1 = float64(s.agree) / float64(s.tokens)
		r.MeanKL = s.kl / float64(s.tokens)
		r.P99KL = Percentile(s.kls, 99)
		r.Top1SE = c.agreeC.se(r.Top1, float64(s.tokens))
		r.MeanKLSE = c.klC.se(r.MeanKL, float64(s.tokens))
	}
	if s.pplTokens > 0 {
		r.RefPPL = math.Exp(s.refNLL / float64(s.pplTokens))
		r.CandPPL = math.Exp(s.candNLL / float64(s.pplTokens))
		r.DeltaPPLPercent = 100 * (r.CandPPL/r.RefPPL - 1)
		if r.CandPPL == r.RefPPL { // also covers both +Inf
			r.DeltaPPLPercent = 0
		}
		d := (s.candNLL - s.refNLL) / float64(s.pplTokens)
		r.DeltaPPLSE = 100 * math.Exp(d) * c.deltaC.se(d, float64(s.pplTokens))
	}
	return r
}

// Accumulator sums per-position quantities for K candidates, per corpus
// label and over all positions, in the order positions are added: results
// are deterministic for a given order. It keeps every position's KL (8 bytes
// per position and candidate) so that the percentile is exact. The zero
// value is not ready; use NewAccumulator.
type Accumulator struct {
	k       int
	all     string
	order   []string
	labels  map[string][]sums
	overall []sums
	// rec, when set, records what Add receives (Evaluate's Record).
	rec *WindowScores
}

// NewAccumulator returns an empty accumulator for k ≥ 1 candidates. all
// names the row covering every position ("" for AllCorpus); positions may not
// carry that label.
func NewAccumulator(k int, all string) (*Accumulator, error) {
	if k < 1 {
		return nil, fmt.Errorf("eval: %d candidates; want at least one", k)
	}
	if all == "" {
		all = AllCorpus
	}
	return &Accumulator{k: k, all: all, labels: map[string][]sums{}, overall: make([]sums, k)}, nil
}

// Candidates returns the number of candidates.
func (a *Accumulator) Candidates() int { return a.k }

// SetOrder fixes the order of the corpus rows: the labels given come first,
// in that order (whether or not any position carries them), then any other
// label in sorted order. Without it every row is sorted by label.
func (a *Accumulator) SetOrder(labels []string) error {
	seen := map[string]bool{}
	for _, l := range labels {
		if l == "" || l == a.all || seen[l] {
			return fmt.Errorf("eval: corpus order %q: empty, repeated or reserved label %q", labels, l)
		}
		seen[l] = true
	}
	a.order = slices.Clone(labels)
	return nil
}

// Add adds one position: q[i] is candidate i's quantities (len(q) must be
// the number of candidates), label its corpus ("" for none: the position
// counts only in the all row).
func (a *Accumulator) Add(q []TokenQuality, label string) error {
	if len(q) != a.k {
		return fmt.Errorf("eval: %d candidate results for %d candidates", len(q), a.k)
	}
	if label == a.all {
		return fmt.Errorf("eval: corpus label %q is reserved for the row covering all positions", label)
	}
	if a.rec != nil {
		a.rec.Labels = append(a.rec.Labels, label)
		a.rec.Qualities = append(a.rec.Qualities, q...)
	}
	var per []sums
	if label != "" {
		per = a.labels[label]
		if per == nil {
			per = make([]sums, a.k)
			a.labels[label] = per
		}
	}
	for i := range q {
		a.overall[i].add(&q[i])
		if per != nil {
			per[i].add(&q[i])
		}
	}
	return nil
}

// KLQuantiles returns candidate i's per-position KL over all positions at
// n+1 evenly spaced fractions 0, 1/n, …, 1 (nearest rank; the first is the
// smallest value), or nil when no position was scored.
func (a *Accumulator) KLQuantiles(i, n int) []float64 {
	kls := a.overall[i].kls
	if len(kls) == 0 || n < 1 {
		return nil
	}
	s := slices.Clone(kls)
	slices.Sort(s)
	out := make([]float64, n+1)
	for k := range out {
		rank := int(math.Ceil(float64(k) * float64(len(s)) / float64(n)))
		out[k] = s[max(rank, 1)-1]
	}
	return out
}

// EndWindow closes the current evaluation window: the positions added
// since the previous call form one unit of the standard errors. Positions
// added after the last call form one more.
func (a *Accumulator) EndWindow() {
	for i := range a.overall {
		a.overall[i].endWindow()
	}
	for _, per := range a.labels {
		for i := range per {
			per[i].endWindow()
		}
	}
}

// Corpora returns the corpus labels in row order (see SetOrder), without
// the all row.
func (a *Accumulator) Corpora() []string {
	var out []string
	in := map[string]bool{}
	for _, l := range a.order {
		out = append(out, l)
		in[l] = true
	}
	var rest []string
	for l := range a.labels {
		if !in[l] {
			rest = append(rest, l)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}

// Rows returns candidate i's table: one row per corpus (see Corpora)
// followed by the all row, which is always present.
func (a *Accumulator) Rows(i int) []Row {
	if i < 0 || i >= a.k {
		panic(fmt.Sprintf("eval: candidate %d of %d", i, a.k))
	}
	var rows []Row
	for _, l := range a.Corpora() {
		if per := a.labels[l]; per != nil {
			rows = append(rows, per[i].row(l))
		} else {
			var empty sums
			rows = append(rows, empty.row(l))
		}
	}
	return append(rows, a.overall[i].row(a.all))
}
