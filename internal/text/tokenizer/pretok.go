package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The Split pre-tokenizer of the Qwen families, written by hand.
//
// tokenizer.json states the split as a regular expression with a negative
// look-ahead, `\s+(?!\S)`, which Go's regexp (RE2) cannot express. Rather
// than link a backtracking engine for one pattern, splitter walks the text
// once and, at every position, tries the pattern's alternatives in their
// written order, taking the first that matches (ordered alternation, as the
// backtracking engines behind Hugging Face tokenizers do). The two patterns
// it implements are recognised verbatim in tokenizer.json; any other pattern
// is refused by the loader.
//
// Character classes follow Unicode, as in the Rust regex crate and
// Oniguruma: \s is the White_Space property (unicode.IsSpace), \p{L}, \p{M}
// and \p{N} are the general categories. Case-insensitive matching of the
// contractions uses simple case folding, so U+017F LATIN SMALL LETTER LONG S
// matches like "s".

// Pattern is a pre-tokenization pattern the splitter implements. The zero
// value is invalid.
type Pattern uint8

const (
	patternInvalid Pattern = iota
	// PatternQwen2 is the pattern of Qwen2, Qwen2.5, Qwen3 and Qwen3-Next.
	PatternQwen2
	// PatternQwen35 is the Qwen3.5 / Qwen3.6 pattern: PatternQwen2 with
	// combining marks (\p{M}) counted with letters.
	PatternQwen35
)

// The patterns exactly as tokenizer.json spells them.
const (
	RegexQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	RegexQwen35 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// String returns the family name of the pattern.
func (p Pattern) String() string {
	switch p {
	case PatternQwen2:
		return "qwen2"
	case PatternQwen35:
		return "qwen3.5"
	}
	return "invalid"
}

// Regex returns the pattern as tokenizer.json writes it.
func (p Pattern) Regex() string {
	switch p {
	case PatternQwen2:
		return RegexQwen2
	case PatternQwen35:
		return RegexQwen35
	}
	return ""
}

func patternOf(regex string) Pattern {
	switch regex {
	case RegexQwen2:
		return PatternQwen2
	case RegexQwen35:
		return PatternQwen35
	}
	return patternInvalid
}

// Character class bits.
const (
	cL  = 1 << iota // \p{L}
	cM              // \p{M}
	cN              // \p{N}
	cS              // \s (White_Space)
	cNL             // \r or \n (always with cS)
)

var asciiClass [utf8.RuneSelf]uint8

func init() {
	for b := 0; b < utf8.RuneSelf; b++ {
		asciiClass[b] = classOfRune(rune(b))
	}
}

func classOfRune(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return cS | cNL
	case unicode.IsLetter(r):
		return cL
	case unicode.IsMark(r):
		return cM
	case unicode.IsNumber(r):
		return cN
	case unicode.IsSpace(r):
		return cS
	}
	return 0
}

// classAt returns the class and width of the rune at s[i]; s must be valid
// UTF-8 and i < len(s).
func classAt(s string, i int) (uint8, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return asciiClass[b], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	return classOfRune(r), w
}

// splitter yields the pre-tokens of one text.
type splitter struct {
	lm    uint8 // classes of the letter run of alternative 2
	other uint8 // classes excluded from the run of alternative 4
}

func newSplitter(p Pattern) splitter {
	if p == PatternQwen35 {
		return splitter{lm: cL | cM, other: cS | cL | cM | cN}
	}
	return splitter{lm: cL, other: cS | cL | cN}
}

// run returns the end of the run of runes starting at i whose class
// intersects want (when in is true) or does not (when in is false).
func run(s string, i int, mask uint8, in bool) int {
	for i < len(s) {
		if b := s[i]; b < utf8.RuneSelf {
			if (asciiClass[b]&mask != 0) != in {
				break
			}
			i++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if (classOfRune(r)&mask != 0) != in {
			break
		}
		i += w
	}
	return i
}

func newlines(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// next returns the end of the pre-token starting at i < len(s). Every
// character is covered by some alternative, so pre-tokens tile the text.
func (sp splitter) next(s string, i int) int {
	c, w := classAt(s, i)
	// 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[i] == '\'' {
		if n := contraction(s, i+1); n > 0 {
			return i + 1 + n
		}
	}
	// 2. [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+   (Qwen2: \p{L}+)
	if c&(cL|cN|cNL) == 0 && i+w < len(s) {
		if c2, _ := classAt(s, i+w); c2&sp.lm != 0 {
			return run(s, i+w, sp.lm, true)
		}
	}
	if c&sp.lm != 0 {
		return run(s, i, sp.lm, true)
	}
	// 3. \p{N}
	if c&cN != 0 {
		return i + w
	}
	// 4.  ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*   (Qwen2: without \p{M})
	if s[i] == ' ' && i+1 < len(s) {
		if c2, _ := classAt(s, i+1); c2&sp.other == 0 {
			return newlines(s, run(s, i+1, sp.other, false))
		}
	}
	if c&sp.other == 0 {
		return newlines(s, run(s, i, sp.other, false))
	}
	// c is white space. Scan the maximal white-space run.
	end, last, lastNL := i, i, -1
	for end < len(s) {
		c2, w2 := classAt(s, end)
		if c2&cS == 0 {
			break
		}
		if c2&cNL != 0 {
			lastNL = end
		}
		last = end
		end += w2
	}
	// 5. \s*[\r\n]+ : up to and including the run's last \r or \n.
	if lastNL >= 0 {
		return lastNL + 1
	}
	// 6. \s+(?!\S) : the whole run at the end of the text, else all but
	// its last character (when that leaves at least one).
	if end == len(s) {
		return end
	}
	if last > i {
		return last
	}
	// 7. \s+ : a single white-space character before a non-space.
	return end
}

// contraction returns the length of the contraction suffix (s, t, m, d, re,
// ve, ll in any case) at s[i:], or 0.
func contraction(s string, i int) int {
	if i >= len(s) {
		return 0
	}
	r1, w1 := utf8.DecodeRuneInString(s[i:])
	switch fold(r1) {
	case 's', 't', 'm', 'd':
		return w1
	case 'r', 'v', 'l':
		if i+w1 < len(s) {
			r2, w2 := utf8.DecodeRuneInString(s[i+w1:])
			f2 := fold(r2)
			if (fold(r1) == 'l' && f2 == 'l') || (fold(r1) != 'l' && f2 == 'e') {
				return w1 + w2
			}
		}
	}
	return 0
}

// fold maps r to the lower-case ASCII letter in its simple case-folding
// orbit, if there is one, else returns r.
func fold(r rune) rune {
	if r < utf8.RuneSelf {
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		if 'a' <= f && f <= 'z' {
			return f
		}
	}
	return r
}
