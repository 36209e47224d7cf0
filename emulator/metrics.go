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
// tables of CompareLogits.
const OverallLabel = "overall"
