package eval

import "fmt"

// DefaultOverlapRun is the run length, in tokens, that OverlapIndex uses
// by default: a run of 32 identical consecutive tokens is shared text, not
// chance.
const DefaultOverlapRun = 32

// OverlapIndex detects evaluation text that also occurs in another token
// set, typically the calibration sequences of the checkpoints being
// evaluated: it holds a 64-bit hash of every run of n consecutive tokens of
// that set. A collision of two different runs has a probability of about
// (runs indexed) / 2^64 per lookup, negligible for calibration-sized sets.
type OverlapIndex struct {
	n    int
	pow  uint64 // base^(n-1)
	runs map[uint64]struct{}
}

const overlapBase = 0x100000001b3 // odd, so the rolling hash is invertible per step

// mixToken spreads a token id over 64 bits (splitmix64's finaliser), so
// that the rolling hash does not see the ids' small range.
func mixToken(t int32) uint64 {
	z := uint64(uint32(t)) + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// rolling calls f with the hash of every run of n consecutive tokens and
// the index of its first token.
func rolling(tokens []int32, n int, pow uint64, f func(start int, h uint64) bool) {
	if len(tokens) < n {
		return
	}
	var h uint64
	for i := 0; i < n; i++ {
		h = h*overlapBase + mixToken(tokens[i])
	}
	if !f(0, h) {
		return
	}
	for i := n; i < len(tokens); i++ {
		h = (h-mixToken(tokens[i-n])*pow)*overlapBase + mixToken(tokens[i])
		if !f(i-n+1, h) {
			return
		}
	}
}

// NewOverlapIndex indexes every run of n consecutive tokens (n ≥ 2; 0 for
// DefaultOverlapRun) of the sequences. Runs never cross from one sequence
// to the next.
func NewOverlapIndex(seqs [][]int32, n int) (*OverlapIndex, error) {
	if n == 0 {
		n = DefaultOverlapRun
	}
	if n < 2 {
		return nil, fmt.Errorf("eval: overlap runs of %d tokens; want at least 2", n)
	}
	x := &OverlapIndex{n: n, pow: 1, runs: map[uint64]struct{}{}}
	for i := 1; i < n; i++ {
		x.pow *= overlapBase
	}
	for _, s := range seqs {
		rolling(s, n, x.pow, func(_ int, h uint64) bool {
			x.runs[h] = struct{}{}
			return true
		})
	}
	return x, nil
}

// Run returns the run length n.
func (x *OverlapIndex) Run() int { return x.n }

// First returns the index in tokens of the first run of n tokens that the
// index holds, or −1 when there is none.
func (x *OverlapIndex) First(tokens []int32) int {
	at := -1
	rolling(tokens, x.n, x.pow, func(start int, h uint64) bool {
		if _, ok := x.runs[h]; ok {
			at = start
			return false
		}
		return true
	})
	return at
}

// Overlap describes one evaluation window that shares text with the index.
type Overlap struct {
	Window int    // index in the windows given
	Corpus string // the window's corpus
	Record int    // the window's record and the position of the shared
	At     int    // run in that record
}

// CheckOverlap returns the windows that contain a run of the index, at most
// limit of them (all when limit ≤ 0), and how many there are in all.
func (x *OverlapIndex) CheckOverlap(windows []Window, limit int) (found []Overlap, total int) {
	for i := range windows {
		w := &windows[i]
		if at := x.First(w.Tokens); at >= 0 {
			total++
			if limit <= 0 || len(found) < limit {
				found = append(found, Overlap{Window: i, Corpus: w.Corpus, Record: w.Record, At: w.Start + at})
			}
		}
	}
	return found, total
}

// String formats an overlap for a message naming where the shared text is.
func (o Overlap) String() string {
	return fmt.Sprintf("%s record %d, token %d", o.Corpus, o.Record, o.At)
}
