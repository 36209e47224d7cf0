package emulator

import "github.com/ttquant/ttquant/emulator/eval"

// TokenQuality holds the per-token quantities the quality metrics are built
// from (see eval.TokenQuality).
type TokenQuality = eval.TokenQuality

// ErrBadLogits is wrapped by errors about logits that do not define a
// distribution: a NaN or +Inf value, or a row whose values are all −Inf.
var ErrBadLogits = eval.ErrBadLogits

// CompareToken computes the per-token quantities for one pair of logit rows
// of equal length (see eval.CompareToken). target is the id of the token
// that follows (for perplexity) or negative when there is none.
func CompareToken(ref, cand []float32, target int) (TokenQuality, error) {
	return eval.CompareToken(ref, cand, target)
}

// QualityRow is one line of a quality table: one corpus, or all tokens (see
// eval.Row). Undefined values are NaN and infinite ones +Inf.
type QualityRow = eval.Row

// OverallLabel is the corpus name of the row covering all tokens in the
// tables of CompareLogits and QualityAccumulator.
const OverallLabel = "overall"

// QualityAccumulator sums per-token quantities of one candidate per corpus
// label and overall, in the order tokens are added. The zero value is not
// ready; use NewQualityAccumulator.
type QualityAccumulator struct {
	acc *eval.Accumulator
	one [1]TokenQuality
}

// NewQualityAccumulator returns an empty accumulator.
func NewQualityAccumulator() *QualityAccumulator {
	acc, err := eval.NewAccumulator(1, OverallLabel)
	if err != nil {
		panic(err) // one candidate is always valid
	}
	return &QualityAccumulator{acc: acc}
}

// Add adds one token's quantities under a corpus label ("" for none). The
// label OverallLabel is reserved and returns an error.
func (a *QualityAccumulator) Add(q TokenQuality, label string) error {
	a.one[0] = q
	return a.acc.Add(a.one[:], label)
}

// Rows returns one row per corpus label, sorted by label, followed by the
// overall row (always present).
func (a *QualityAccumulator) Rows() []QualityRow { return a.acc.Rows(0) }
