package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestBPEHeapMatchesLoop: the heap merge used for long pre-tokens gives
// the same ids as the quadratic loop, on pieces of real and random text.
func TestBPEHeapMatchesLoop(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "e", "t", "h", " ", "in", "the", "=", "ing", "é", "日本", "\n", "0", "ab"}
	for _, tok := range []*Tokenizer{load(t, "tokenizer", "qwen3"), load(t, "models", "tiny-qwen36-trained")} {
		for n := 0; n < 300; n++ {
			var b strings.Builder
			for b.Len() < 2+rng.IntN(smallBPE-2) {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			p := b.String()
			if len(p) > smallBPE {
				p = p[:smallBPE]
			}
			loop := tok.bpe(nil, p)
			heap := tok.bpeHeap(nil, p)
			if !slices.Equal(loop, heap) {
				t.Fatalf("%q: loop %v, heap %v", p, loop, heap)
			}
		}
		// Long runs take the heap path inside Encode; decoding them back
		// checks that no symbol is lost.
		for _, s := range []string{strings.Repeat("=", 1000), strings.Repeat("abc", 500), strings.Repeat("\u00e9", 300)} {
			got, _ := tok.Decode(tok.Encode(s))
			if got != s {
				t.Fatalf("long piece round trip failed")
			}
		}
	}
}
