// Package eval computes the quality metrics that compare model runs on the
// same text: per corpus and over all scored positions, the number of scored
// tokens, the perplexity of the reference and of each candidate, ΔPPL %,
// top-1 agreement and the mean and 99th percentile of KL(P_ref ‖ P_cand).
//
// The per-position arithmetic is float64 log-softmax over the full
// vocabulary (row maximum subtracted, then log-sum-exp). A Scorer takes the
// reference's and K candidates' logits for a batch of positions, with
// targets, a score mask and corpus labels, and accumulates them in lockstep,
// so logits are never stored; an Accumulator keeps the per-corpus sums and
// every position's KL (for an exact percentile). Results do not depend on
// the number of workers: positions are accumulated in the order given. A
// candidate whose logits equal the reference's gives ΔPPL 0, top-1 1 and KL
// 0 exactly, by construction.
//
// StreamWindows and MaskedWindows cut tokenized text into evaluation
// windows: fixed windows over a stream (code, prose) and one window per
// record scored on masked (assistant) tokens (chat, instruct). Evaluate runs
// a reference and candidate Models (anything that turns a window into
// logits, a chunk of positions at a time) over the windows in lockstep,
// with progress and an ETA. Result holds the tables with the runs' identities
// and the data's provenance, written as JSON (with a schema version) or as
// Markdown in the published layout.
//
// The package knows nothing of checkpoints, tokenizers or the forward pass:
// identities and provenance are opaque values supplied by the caller.
package eval
