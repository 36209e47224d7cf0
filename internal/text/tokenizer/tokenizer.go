// Package tokenizer is a byte-level BPE tokenizer that reads a Hugging Face
// tokenizer.json and encodes text to exactly the ids Hugging Face tokenizers
// produce for the Qwen2, Qwen2.5, Qwen3, Qwen3-Next, Qwen3.5 and Qwen3.6
// families.
//
// The pipeline: added tokens (special or not) are split out of the raw text
// first and map straight to their ids; each piece between them is NFC
// normalised, cut into pre-tokens by the family's Split pattern (written by
// hand, see pretok.go), and every pre-token's UTF-8 bytes are merged by BPE
// rank. Decoding maps ids back to bytes and reads them as UTF-8.
//
// Everything in tokenizer.json this package does not implement is refused by
// the loader with an *Error naming the field; nothing is approximated.
//
// A Tokenizer is safe for concurrent use.
package tokenizer

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text to token ids and back. Build one with Load or
// Parse; the zero value is not usable.
type Tokenizer struct {
	sha256 string

	pattern Pattern
	split   splitter
	nfc     bool

	vocab        map[string]int // byte-level spelling → id
	tokens       []string       // id → byte-level spelling ("" where unused)
	byteID       [256]int32
	merges       *mergeTable
	ignoreMerges bool

	added      []addedToken
	addedID    map[int]int // id → index in added
	addedByID  map[string]int
	addedFirst [256][]int // first byte → indices in added, longest content first
	firstOnly  int        // the one first byte of all added tokens, or -1

	eos, bos, pad int // -1 when unknown

	cache *pieceCache
}

type addedToken struct {
	content string
	id      int
	special bool
}

func (t *Tokenizer) buildAddedIndex() {
	t.addedByID = make(map[string]int, len(t.added))
	for i, a := range t.added {
		t.addedByID[a.content] = a.id
		b := a.content[0]
		t.addedFirst[b] = append(t.addedFirst[b], i)
	}
	firsts := 0
	t.firstOnly = -1
	for b := range t.addedFirst {
		l := t.addedFirst[b]
		if len(l) == 0 {
			continue
		}
		firsts++
		t.firstOnly = b
		sort.SliceStable(l, func(i, j int) bool { return len(t.added[l[i]].content) > len(t.added[l[j]].content) })
	}
	if firsts != 1 {
		t.firstOnly = -1
	}
}

// Pattern returns the pre-tokenization pattern of the tokenizer.
func (t *Tokenizer) Pattern() Pattern { return t.pattern }

// SHA256 returns the hex SHA-256 of the tokenizer.json bytes it was built from.
func (t *Tokenizer) SHA256() string { return t.sha256 }

// VocabSize returns one more than the largest token id (BPE or added).
func (t *Tokenizer) VocabSize() int {
	n := len(t.tokens)
	for _, a := range t.added {
		n = max(n, a.id+1)
	}
	return n
}

// EOS, BOS and PAD return the ids named by tokenizer_config.json, or -1.
func (t *Tokenizer) EOS() int { return t.eos }
func (t *Tokenizer) BOS() int { return t.bos }
func (t *Tokenizer) PAD() int { return t.pad }

// ID returns the id of a token: an added token's content, or a BPE token in
// its byte-level spelling (e.g. "Ġthe").
func (t *Tokenizer) ID(token string) (int, bool) {
	if id, ok := t.addedByID[token]; ok {
		return id, true
	}
	id, ok := t.vocab[token]
	return id, ok
}

// Token returns the spelling of id (byte-level for BPE tokens, the content
// for added tokens) and whether id is a token.
func (t *Tokenizer) Token(id int) (string, bool) {
	if i, ok := t.addedID[id]; ok {
		return t.added[i].content, true
	}
	if id >= 0 && id < len(t.tokens) && t.tokens[id] != "" {
		return t.tokens[id], true
	}
	return "", false
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id int) bool {
	i, ok := t.addedID[id]
	return ok && t.added[i].special
}

// Offset is the byte range [Start, End) of the input text a token came from.
type Offset struct{ Start, End int }

// Encode returns the token ids of s. Added tokens in s (special or not) are
// recognised; nothing is prepended or appended. Invalid UTF-8 in s is read
// as U+FFFD, one per maximal invalid sequence (as Python's
// errors="replace" decoding and Rust's from_utf8_lossy do).
func (t *Tokenizer) Encode(s string) []int {
	ids, _ := t.encode(s, false, false)
	return ids
}

// EncodeText is Encode without added-token recognition: text that spells an
// added token (e.g. "<|im_end|>") is encoded as ordinary text.
func (t *Tokenizer) EncodeText(s string) []int {
	ids, _ := t.encode(s, false, true)
	return ids
}

// EncodeWithOffsets is Encode that also returns, for every token, the byte
// range of s it stands for. Ranges are exact bytes of s where s is already
// NFC and valid UTF-8 (a token may then cover part of a multi-byte
// character). Where normalisation or U+FFFD replacement changed the text,
// a token that draws on a changed stretch (one normalisation segment, or
// one invalid sequence) gets that whole stretch of the original, so
// neighbouring ranges may overlap there; ranges never go backwards and
// leave no gaps.
func (t *Tokenizer) EncodeWithOffsets(s string) ([]int, []Offset) {
	return t.encode(s, true, false)
}

func (t *Tokenizer) encode(s string, wantOffs, plain bool) ([]int, []Offset) {
	e := encoder{t: t, wantOffs: wantOffs, ids: make([]int, 0, len(s)/3+1)}
	if t.cache != nil {
		e.l1 = t.cache.l1.Get().(*l1Table)
		defer t.cache.l1.Put(e.l1)
	}
	if !utf8.ValidString(s) {
		var m offsetMap
		s, m = sanitize(s)
		if wantOffs {
			e.outer = &m
		}
	}
	if plain || len(t.added) == 0 {
		e.segment(s, 0)
		return e.ids, e.offs
	}
	start := 0
	for i := 0; i < len(s); {
		j := t.nextAddedStart(s, i)
		if j < 0 {
			break
		}
		k, id := t.matchAdded(s, j)
		if k < 0 {
			i = j + 1
			continue
		}
		e.segment(s[start:j], start)
		e.ids = append(e.ids, id)
		if wantOffs {
			e.offs = append(e.offs, e.mapOuter(j, j+k))
		}
		i = j + k
		start = i
	}
	e.segment(s[start:], start)
	return e.ids, e.offs
}

// nextAddedStart returns the first index ≥ i where an added token may start.
func (t *Tokenizer) nextAddedStart(s string, i int) int {
	if t.firstOnly >= 0 {
		j := strings.IndexByte(s[i:], byte(t.firstOnly))
		if j < 0 {
			return -1
		}
		return i + j
	}
	for ; i < len(s); i++ {
		if t.addedFirst[s[i]] != nil {
			return i
		}
	}
	return -1
}

// matchAdded returns the length and id of the longest added token at s[j:],
// or -1.
func (t *Tokenizer) matchAdded(s string, j int) (int, int) {
	for _, k := range t.addedFirst[s[j]] {
		if c := t.added[k].content; strings.HasPrefix(s[j:], c) {
			return len(c), t.added[k].id
		}
	}
	return -1, 0
}

// encoder accumulates the ids (and offsets) of one Encode call.
type encoder struct {
	t        *Tokenizer
	wantOffs bool
	ids      []int
	offs     []Offset
	outer    *offsetMap // sanitized → original, when replacement happened
	l1       *l1Table   // borrowed from the cache's pool while encoding
	buf      []int32
}

func (e *encoder) mapOuter(a, b int) Offset {
	if e.outer == nil {
		return Offset{a, b}
	}
	return e.outer.mapRange(a, b)
}

// segment encodes a stretch of text without added tokens that starts at
// byte base of the (sanitized) input.
func (e *encoder) segment(seg string, base int) {
	if seg == "" {
		return
	}
	t := e.t
	text := seg
	var nmap *offsetMap
	if t.nfc && !isNFC(seg) {
		if e.wantOffs {
			var m offsetMap
			text, m = nfcWithMap(seg)
			nmap = &m
		} else {
			text = norm.NFC.String(seg)
		}
	}
	for i := 0; i < len(text); {
		j := t.split.next(text, i)
		n0 := len(e.ids)
		e.piece(text[i:j])
		if e.wantOffs {
			p := i
			for _, id := range e.ids[n0:] {
				q := p + t.tokenLen(id)
				a, b := p, q
				if nmap != nil {
					o := nmap.mapRange(a, b)
					a, b = o.Start, o.End
				}
				e.offs = append(e.offs, e.mapOuter(base+a, base+b))
				p = q
			}
		}
		i = j
	}
}

// piece appends the ids of one pre-token.
func (e *encoder) piece(p string) {
	t := e.t
	if len(p) == 1 {
		e.ids = append(e.ids, int(t.byteID[p[0]]))
		return
	}
	c := t.cache
	cached := c != nil && len(p) <= maxCachedPiece
	var h uint64
	if cached {
		h = c.hash(p)
		slot := &e.l1[h%l1Size]
		if ent := *slot; ent != nil && ent.piece == p {
			e.ids = append(e.ids, ent.ids...)
			return
		}
		if ent := c.get(p, h); ent != nil {
			*slot = ent
			e.ids = append(e.ids, ent.ids...)
			return
		}
	}
	e.buf = t.bpe(e.buf[:0], p)
	n0 := len(e.ids)
	for _, id := range e.buf {
		e.ids = append(e.ids, int(id))
	}
	if cached {
		e.l1[h%l1Size] = c.put(p, h, slices.Clone(e.ids[n0:]))
	}
}

// tokenLen returns the number of text bytes a BPE token stands for.
func (t *Tokenizer) tokenLen(id int) int {
	return utf8.RuneCountInString(t.tokens[id])
}

func isNFC(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return norm.NFC.QuickSpanString(s) == len(s)
		}
	}
	return true
}

// offsetMap maps byte ranges of a rewritten text back to the text it was
// rewritten from, chunk by chunk.
type offsetMap struct {
	chunks []chunk // in order, tiling the rewritten text
}

// chunk: rewritten bytes [dst, dstEnd) came from source bytes [src, srcEnd);
// same reports that they are identical.
type chunk struct {
	dst, dstEnd, src, srcEnd int
	same                     bool
}

func (m *offsetMap) add(dst, dstEnd, src, srcEnd int, same bool) {
	if n := len(m.chunks); n > 0 && same && m.chunks[n-1].same {
		c := &m.chunks[n-1]
		c.dstEnd, c.srcEnd = dstEnd, srcEnd
		return
	}
	m.chunks = append(m.chunks, chunk{dst, dstEnd, src, srcEnd, same})
}

// find returns the chunk holding rewritten byte p (the last chunk for p at
// the end).
func (m *offsetMap) find(p int) chunk {
	i := sort.Search(len(m.chunks), func(i int) bool { return m.chunks[i].dstEnd > p })
	if i == len(m.chunks) {
		i--
	}
	return m.chunks[i]
}

func (m *offsetMap) mapRange(a, b int) Offset {
	if len(m.chunks) == 0 {
		return Offset{a, b}
	}
	ca := m.find(a)
	start := ca.src
	if ca.same {
		start = ca.src + (a - ca.dst)
	}
	cb := m.find(max(b-1, a))
	end := cb.srcEnd
	if cb.same {
		end = cb.src + (b - cb.dst)
	}
	return Offset{start, end}
}

// nfcWithMap returns NFC(s) and the map back to s, normalising s piece by
// piece between normalisation boundaries.
func nfcWithMap(s string) (string, offsetMap) {
	var m offsetMap
	var out strings.Builder
	for i := 0; i < len(s); {
		n := norm.NFC.NextBoundaryInString(s[i:], true)
		if n <= 0 {
			n = len(s) - i
		}
		in := s[i : i+n]
		o := norm.NFC.String(in)
		d := out.Len()
		out.WriteString(o)
		m.add(d, d+len(o), i, i+n, o == in)
		i += n
	}
	return out.String(), m
}

// sanitize replaces each maximal invalid UTF-8 sequence of s by U+FFFD.
func sanitize(s string) (string, offsetMap) {
	var m offsetMap
	var out strings.Builder
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		d := out.Len()
		if r != utf8.RuneError || w != 1 {
			out.WriteString(s[i : i+w])
			m.add(d, d+w, i, i+w, true)
			i += w
			continue
		}
		n := invalidLen(s[i:])
		out.WriteString("\uFFFD")
		m.add(d, d+3, i, i+n, false)
		i += n
	}
	return out.String(), m
}

// invalidLen returns the length of the maximal invalid subpart at the start
// of b: the longest prefix of a well-formed sequence (at least one byte), as
// in the Unicode "maximal subpart" practice that Rust and Python follow.
func invalidLen(b string) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		x := b[n]
		if k == 0 {
			if x < lo || x > hi {
				return n
			}
		} else if x < 0x80 || x > 0xBF {
			return n
		}
		n++
	}
	return n
}

// DecodeBytes returns the bytes the ids stand for. Added tokens, special or
// not, are included; see DecodeSkipSpecial.
func (t *Tokenizer) DecodeBytes(ids []int) ([]byte, error) { return t.decode(ids, false) }

// Decode returns the text the ids stand for, with invalid UTF-8 (a sequence
// cut inside a character) read as U+FFFD per maximal invalid sequence, as
// Hugging Face does.
func (t *Tokenizer) Decode(ids []int) (string, error) {
	b, err := t.decode(ids, false)
	if err != nil {
		return "", err
	}
	return lossy(b), nil
}

// DecodeSkipSpecial is Decode leaving out special added tokens.
func (t *Tokenizer) DecodeSkipSpecial(ids []int) (string, error) {
	b, err := t.decode(ids, true)
	if err != nil {
		return "", err
	}
	return lossy(b), nil
}

func (t *Tokenizer) decode(ids []int, skipSpecial bool) ([]byte, error) {
	out := make([]byte, 0, 4*len(ids))
	for i, id := range ids {
		tok, ok := t.Token(id)
		if !ok {
			return nil, &IDError{Index: i, ID: id, Size: t.VocabSize()}
		}
		if skipSpecial && t.IsSpecial(id) {
			continue
		}
		out = appendUnByteLevel(out, tok)
	}
	return out, nil
}

func appendUnByteLevel(out []byte, tok string) []byte {
	n := len(out)
	for _, r := range tok {
		if r < 0x100 || r <= 0x143 {
			if b, ok := runeByte[r]; ok {
				out = append(out, b)
				continue
			}
		}
		// A symbol outside the byte-level alphabet: the token's own bytes.
		return append(out[:n], tok...)
	}
	return out
}

func lossy(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	s, _ := sanitize(string(b))
	return s
}

// EncodeBatch encodes texts with up to workers goroutines (at least one)
// and returns their ids in order.
func (t *Tokenizer) EncodeBatch(texts []string, workers int) [][]int {
	out := make([][]int, len(texts))
	workers = max(1, min(workers, len(texts)))
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(texts) {
					return
				}
				out[i] = t.Encode(texts[i])
			}
		}()
	}
	wg.Wait()
	return out
}
