package tokenizer

import (
	"slices"
	"testing"
)

func split(p Pattern, s string) []string {
	sp := newSplitter(p)
	var out []string
	for i := 0; i < len(s); {
		j := sp.next(s, i)
		out = append(out, s[i:j])
		i = j
	}
	return out
}

// TestSplitter pins the pre-tokens of each alternative of the patterns,
// in the order they are tried.
func TestSplitter(t *testing.T) {
	for _, c := range []struct {
		p    Pattern
		in   string
		want []string
	}{
		{PatternQwen2, "  hello", []string{" ", " hello"}},
		{PatternQwen2, "a\n\nb", []string{"a", "\n\n", "b"}},
		{PatternQwen2, "x \n y", []string{"x", " \n", " y"}},
		{PatternQwen2, "2025", []string{"2", "0", "2", "5"}},
		{PatternQwen2, "don't DON'T 'LL 'Re 'sup 'x", []string{"don", "'t", " DON", "'T", " '", "LL", " '", "Re", " '", "sup", " '", "x"}},
		{PatternQwen2, "it'll we've I'm", []string{"it", "'ll", " we", "'ve", " I", "'m"}},
		{PatternQwen2, "'ſ", []string{"'ſ"}}, // simple case folding: ſ ~ s
		{PatternQwen2, "a  \t", []string{"a", "  \t"}},
		{PatternQwen2, "a   b", []string{"a", "  ", " b"}},
		{PatternQwen2, "a \tb", []string{"a", " ", "\tb"}},
		{PatternQwen2, "x = (y)\r\n\r\n", []string{"x", " =", " (", "y", ")\r\n\r\n"}},
		{PatternQwen2, "f()  \n\n  g", []string{"f", "()", "  \n\n", " ", " g"}},
		{PatternQwen2, "\u00a0word\u3000日本語", []string{"\u00a0word", "\u3000日本語"}},
		{PatternQwen2, " 12", []string{" ", "1", "2"}},
		{PatternQwen2, "ab\u0301c", []string{"ab", "\u0301c"}},     // a mark before letters is the optional prefix
		{PatternQwen35, "ab\u0301c", []string{"ab\u0301c"}},        // marks count with letters
		{PatternQwen2, "\u0301\u0301!", []string{"\u0301\u0301!"}}, // marks are "other" in Qwen2
		{PatternQwen35, "\u0301\u0301!", []string{"\u0301\u0301", "!"}},
		{PatternQwen35, "❤\ufe0f ok", []string{"❤\ufe0f", " ok"}},
		{PatternQwen2, "❤\ufe0f ok", []string{"❤\ufe0f", " ok"}},
		{PatternQwen2, "end  ", []string{"end", "  "}},
		{PatternQwen2, "\n", []string{"\n"}},
	} {
		if got := split(c.p, c.in); !slices.Equal(got, c.want) {
			t.Errorf("%s %q: %q, want %q", c.p, c.in, got, c.want)
		}
	}
}
