package tokenizer

import (
	"container/heap"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
)

// The byte-level alphabet: every byte is written as one code point so that
// BPE works on printable symbols. Bytes 33–126, 161–172 and 174–255 stand for
// themselves; the other 68 bytes, in ascending order, take U+0100…U+0143.
var (
	byteRune [256]rune
	runeByte = map[rune]byte{}
)

func init() {
	n := rune(0)
	for b := 0; b < 256; b++ {
		if (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255) {
			byteRune[b] = rune(b)
		} else {
			byteRune[b] = 0x100 + n
			n++
		}
		runeByte[byteRune[b]] = byte(b)
	}
}

// byteLevel returns the byte-level spelling of raw bytes.
func byteLevel(raw string) string {
	buf := make([]rune, len(raw))
	for i := 0; i < len(raw); i++ {
		buf[i] = byteRune[raw[i]]
	}
	return string(buf)
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// merge is the value of a merge rule: its rank and the id of the merged token.
type merge struct {
	rank int32
	id   int32
}

// smallBPE is the longest piece merged with the quadratic in-place loop;
// longer pieces use the heap.
const smallBPE = 48

// bpe appends the ids of one pre-token (raw bytes) to dst.
func (t *Tokenizer) bpe(dst []int32, piece string) []int32 {
	n := len(piece)
	if n == 0 {
		return dst
	}
	if n == 1 {
		return append(dst, t.byteID[piece[0]])
	}
	if t.ignoreMerges {
		if id, ok := t.vocab[byteLevel(piece)]; ok {
			return append(dst, int32(id))
		}
	}
	if n > smallBPE {
		return t.bpeHeap(dst, piece)
	}
	var idsBuf, rankBuf [smallBPE]int32
	ids, ranks := idsBuf[:n], rankBuf[:n-1]
	for i := 0; i < n; i++ {
		ids[i] = t.byteID[piece[i]]
	}
	for i := range ranks {
		ranks[i] = t.rank(ids[i], ids[i+1])
	}
	for len(ids) > 1 {
		best, at := int32(math.MaxInt32), -1
		for i, r := range ranks {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		m, _ := t.merges.get(pairKey(ids[at], ids[at+1]))
		ids[at] = m.id
		copy(ids[at+1:], ids[at+2:])
		ids = ids[:len(ids)-1]
		copy(ranks[at:], ranks[at+1:])
		ranks = ranks[:len(ranks)-1]
		if at > 0 {
			ranks[at-1] = t.rank(ids[at-1], ids[at])
		}
		if at < len(ranks) {
			ranks[at] = t.rank(ids[at], ids[at+1])
		}
	}
	return append(dst, ids...)
}

func (t *Tokenizer) rank(a, b int32) int32 {
	if m, ok := t.merges.get(pairKey(a, b)); ok {
		return m.rank
	}
	return math.MaxInt32
}

// pairItem is a candidate merge of the symbols at left and right.
type pairItem struct {
	rank, left, right int32
	leftID, rightID   int32
}

type pairHeap []pairItem

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	return h[i].rank < h[j].rank || (h[i].rank == h[j].rank && h[i].left < h[j].left)
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(pairItem)) }
func (h *pairHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// bpeHeap is bpe for long pieces: symbols in a linked list, candidate
// merges in a heap ordered by (rank, position), stale entries skipped.
// It merges in exactly the order of the quadratic loop: the lowest rank,
// leftmost first.
func (t *Tokenizer) bpeHeap(dst []int32, piece string) []int32 {
	n := len(piece)
	ids := make([]int32, n)
	next := make([]int32, n)
	prev := make([]int32, n)
	alive := make([]bool, n)
	for i := 0; i < n; i++ {
		ids[i] = t.byteID[piece[i]]
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
		alive[i] = true
	}
	next[n-1] = -1
	h := make(pairHeap, 0, n)
	push := func(l, r int32) {
		if m, ok := t.merges.get(pairKey(ids[l], ids[r])); ok {
			h = append(h, pairItem{rank: m.rank, left: l, right: r, leftID: ids[l], rightID: ids[r]})
		}
	}
	for i := 0; i+1 < n; i++ {
		push(int32(i), int32(i+1))
	}
	heap.Init(&h)
	for h.Len() > 0 {
		it := heap.Pop(&h).(pairItem)
		l, r := it.left, it.right
		if !alive[l] || !alive[r] || next[l] != r || ids[l] != it.leftID || ids[r] != it.rightID {
			continue
		}
		m, _ := t.merges.get(pairKey(ids[l], ids[r]))
		ids[l] = m.id
		alive[r] = false
		next[l] = next[r]
		if next[r] >= 0 {
			prev[next[r]] = l
		}
		if p := prev[l]; p >= 0 {
			if m, ok := t.merges.get(pairKey(ids[p], ids[l])); ok {
				heap.Push(&h, pairItem{rank: m.rank, left: p, right: l, leftID: ids[p], rightID: ids[l]})
			}
		}
		if q := next[l]; q >= 0 {
			if m, ok := t.merges.get(pairKey(ids[l], ids[q])); ok {
				heap.Push(&h, pairItem{rank: m.rank, left: l, right: q, leftID: ids[l], rightID: ids[q]})
			}
		}
	}
	for i := int32(0); i >= 0; i = next[i] {
		dst = append(dst, ids[i])
	}
	return dst
}

// pieceCache maps pre-tokens to their BPE ids: a two-way associative table
// of atomically replaced entries. It is safe for concurrent use without locks,
// bounded by construction (a new piece evicts whatever shared its slot), and
// a lookup costs one hash, one atomic load and one string comparison.
//
// In front of it, each Encode call borrows (from a sync.Pool) a small
// private table of recently used entries, which stays in the processor's
// cache; it holds pointers to the shared entries, so it never disagrees
// with them.
type pieceCache struct {
	seed  maphash.Seed
	mask  uint64
	slots []atomic.Pointer[cacheEntry]
	l1    sync.Pool // *l1Table
}

// l1Size is the number of slots of an Encode call's private table.
const l1Size = 1024

type l1Table [l1Size]*cacheEntry

type cacheEntry struct {
	piece string
	ids   []int
}

// maxCachedPiece is the longest pre-token (in bytes) kept in the cache.
const maxCachedPiece = 256

// newPieceCache returns a cache of at least capacity slots (a power of two).
func newPieceCache(capacity int) *pieceCache {
	if capacity <= 0 {
		return nil
	}
	n := 1
	for n < capacity {
		n <<= 1
	}
	c := &pieceCache{seed: maphash.MakeSeed(), mask: uint64(n - 1), slots: make([]atomic.Pointer[cacheEntry], n)}
	c.l1.New = func() any { return new(l1Table) }
	return c
}

func (c *pieceCache) hash(piece string) uint64 { return maphash.String(c.seed, piece) }

// The table is two-way associative: a piece lives in slot h or its
// neighbour h^1.
func (c *pieceCache) get(piece string, h uint64) *cacheEntry {
	i := h & c.mask
	if e := c.slots[i].Load(); e != nil && e.piece == piece {
		return e
	}
	if e := c.slots[i^1].Load(); e != nil && e.piece == piece {
		return e
	}
	return nil
}

// put stores ids, which the cache then owns and never modifies: in an
// empty one of the piece's two slots, else in the one a hash bit picks.
func (c *pieceCache) put(piece string, h uint64, ids []int) *cacheEntry {
	e := &cacheEntry{piece: strings.Clone(piece), ids: ids}
	i := h & c.mask
	switch {
	case c.slots[i].Load() == nil:
	case c.slots[i^1].Load() == nil:
		i ^= 1
	default:
		i ^= (h >> 63) & 1
	}
	c.slots[i].Store(e)
	return e
}
