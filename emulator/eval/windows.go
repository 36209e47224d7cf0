package eval

import "fmt"

// DefaultWindow is the evaluation window length in tokens (the GPTQ
// convention for perplexity).
const DefaultWindow = 2048

// Window is a run of tokens evaluated from a fresh model state (empty
// caches, zero recurrent and convolution state, no BOS added). Position i
// of the window predicts token i+1: Targets[i] = Tokens[i+1], and the last
// position predicts nothing.
type Window struct {
	// Corpus labels every position of the window.
	Corpus string
	// Record is the index of the record the window was cut from (0 for a
	// stream), and Start the index in that record of its first token.
	Record, Start int
	// Tokens are the window's token ids (a sub-slice of the input).
	Tokens []int32
	// Targets[i] is the token position i is scored against, −1 for the
	// last position.
	Targets []int32
	// Score[i] says whether position i is scored.
	Score []bool
}

// Scored returns the number of scored positions.
func (w *Window) Scored() int {
	n := 0
	for _, s := range w.Score {
		if s {
			n++
		}
	}
	return n
}

// Batch returns the scoring batch of positions [lo, hi) of the window for
// the given logits (hi−lo rows each, as Batch describes).
func (w *Window) Batch(lo, hi int, ref []float32, cands [][]float32) Batch {
	return Batch{Ref: ref, Cands: cands, Targets: w.Targets[lo:hi], Mask: w.Score[lo:hi], Corpus: []string{w.Corpus}}
}

func newWindow(corpus string, record, start int, tokens []int32, score func(i int) bool) Window {
	n := len(tokens)
	w := Window{Corpus: corpus, Record: record, Start: start, Tokens: tokens,
		Targets: make([]int32, n), Score: make([]bool, n)}
	for i := 0; i < n-1; i++ {
		w.Targets[i] = tokens[i+1]
		w.Score[i] = score(i)
	}
	if n > 0 {
		w.Targets[n-1] = -1
	}
	return w
}

// StreamWindows cuts a token stream (a corpus joined and tokenized as one
// text) into ⌊len/size⌋ non-overlapping windows of exactly size tokens,
// dropping the tail; every position but the last of each window is scored,
// i.e. size−1 targets per window. This is the GPTQ perplexity convention.
func StreamWindows(corpus string, tokens []int32, size int) ([]Window, error) {
	if size < 2 {
		return nil, fmt.Errorf("eval: window of %d tokens; want at least 2", size)
	}
	var ws []Window
	for s := 0; s+size <= len(tokens); s += size {
		ws = append(ws, newWindow(corpus, 0, s, tokens[s:s+size:s+size], func(int) bool { return true }))
	}
	return ws, nil
}

// Record is one tokenized record of a masked corpus (chat or instruct):
// Mask[i] says whether token i is to be predicted and scored (an assistant
// token).
type Record struct {
	Tokens []int32
	Mask   []bool
}

// MaskStats counts what MaskedWindows did with the masked tokens.
type MaskStats struct {
	// Scored is the number of positions scored.
	Scored int
	// Unscorable counts masked tokens nothing predicts: a record's first
	// token and the first token of each window after the first.
	Unscorable int
	// Split is the number of records longer than the window, cut into
	// several windows.
	Split int
}

// MaskedWindows makes one window per record, scoring position i when token
// i+1 is masked; a record longer than size is cut into consecutive windows
// of size tokens (each from a fresh state; the last may be shorter), so the
// first token of each later window is not predicted. Records with no scored
// position produce no window. The records' tokens are not copied.
func MaskedWindows(corpus string, records []Record, size int) ([]Window, MaskStats, error) {
	var st MaskStats
	if size < 2 {
		return nil, st, fmt.Errorf("eval: window of %d tokens; want at least 2", size)
	}
	var ws []Window
	for r, rec := range records {
		if len(rec.Mask) != len(rec.Tokens) {
			return nil, st, fmt.Errorf("eval: %s record %d: %d mask entries for %d tokens", corpus, r, len(rec.Mask), len(rec.Tokens))
		}
		if len(rec.Tokens) > size {
			st.Split++
		}
		for s := 0; s < len(rec.Tokens); s += size {
			e := min(s+size, len(rec.Tokens))
			mask := rec.Mask[s:e]
			if mask[0] {
				st.Unscorable++
			}
			w := newWindow(corpus, r, s, rec.Tokens[s:e:e], func(i int) bool { return mask[i+1] })
			if n := w.Scored(); n > 0 {
				st.Scored += n
				ws = append(ws, w)
			}
		}
	}
	return ws, st, nil
}
