package tokenizer

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/ttquant/ttquant/internal/testdata"
)

// goroot returns the Go installation's source tree, which exists wherever
// the tests run.
func goroot(tb testing.TB) string {
	tb.Helper()
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		tb.Fatalf("go env GOROOT: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "src")
	if _, err := os.Stat(dir); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// corpus returns up to limit bytes of files under root whose names end in
// one of exts, in sorted path order.
func corpus(tb testing.TB, root string, limit int, exts ...string) map[string]string {
	tb.Helper()
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" && p != root {
				return filepath.SkipDir
			}
			return nil
		}
		for _, e := range exts {
			if strings.HasSuffix(p, e) {
				paths = append(paths, p)
				break
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	sort.Strings(paths)
	out := map[string]string{}
	total := 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		if !utf8.Valid(b) {
			continue
		}
		out[p] = string(b)
		if total += len(b); total >= limit {
			break
		}
	}
	return out
}

// TestRoundTripRealText: decode(encode(x)) == NFC(x) on every file of a few
// MB of Go sources, text files of the Go tree (including non-Latin scripts
// in its unicode and text tests' neighbours) and this repository's docs,
// with both tokenizers; offsets must tile the text and agree with the bytes
// of each token.
func TestRoundTripRealText(t *testing.T) {
	src := goroot(t)
	files := corpus(t, filepath.Join(src, "net"), 2<<20, ".go")
	for p, s := range corpus(t, src, 1<<20, ".txt", ".md", ".html") {
		files[p] = s
	}
	for p, s := range corpus(t, filepath.Join(testdata.RepoRoot(), "docs"), 1<<20, ".md") {
		files[p] = s
	}
	total := 0
	for _, s := range files {
		total += len(s)
	}
	if total < 3<<20 {
		t.Fatalf("only %d bytes of text found", total)
	}
	for _, tok := range []*Tokenizer{load(t, "tokenizer", "qwen3"), load(t, "models", "tiny-qwen36-trained")} {
		for p, s := range files {
			ids := tok.Encode(s)
			got, err := tok.Decode(ids)
			if err != nil {
				t.Fatal(err)
			}
			if want := norm.NFC.String(s); got != want {
				t.Errorf("%s (%s): round trip differs", p, tok.Pattern())
			}
		}
	}
	t.Logf("%d files, %d bytes", len(files), total)
}

// checkOffsets verifies that the offsets of s's tokens are in order, tile
// s and, where s is NFC, cover exactly each token's bytes.
func checkOffsets(t *testing.T, tok *Tokenizer, s string) {
	t.Helper()
	ids, offs := tok.EncodeWithOffsets(s)
	if !slices.Equal(ids, tok.Encode(s)) {
		t.Fatalf("%q: EncodeWithOffsets ids differ from Encode", s)
	}
	if len(offs) != len(ids) {
		t.Fatalf("%q: %d offsets for %d ids", s, len(offs), len(ids))
	}
	exact := utf8.ValidString(s) && norm.NFC.IsNormalString(s)
	prevEnd := 0
	for i, o := range offs {
		if o.Start < 0 || o.End > len(s) || o.Start > o.End {
			t.Fatalf("%q: token %d has offset %v", s, i, o)
		}
		if exact {
			if o.Start != prevEnd {
				t.Fatalf("%q: token %d starts at %d, previous ended at %d", s, i, o.Start, prevEnd)
			}
			b, _ := tok.DecodeBytes(ids[i : i+1])
			if string(b) != s[o.Start:o.End] {
				t.Fatalf("%q: token %d is %q, offsets cover %q", s, i, b, s[o.Start:o.End])
			}
		} else if i > 0 && (o.Start < offs[i-1].Start || o.End < offs[i-1].End || o.Start > prevEnd) {
			// Tokens from a changed stretch share its range and may
			// overlap, but ranges never go back and leave no gap.
			t.Fatalf("%q: token %d offset %v after %v", s, i, o, offs[i-1])
		}
		if i == 0 && o.Start != 0 {
			t.Fatalf("%q: first token starts at %d", s, o.Start)
		}
		prevEnd = o.End
	}
	if len(s) > 0 && prevEnd != len(s) {
		t.Fatalf("%q: offsets end at %d of %d", s, prevEnd, len(s))
	}
}

func TestOffsets(t *testing.T) {
	tok := load(t, "tokenizer", "qwen3")
	for _, s := range []string{
		"", "a", "Hello, world!", "  hello\n\n  x", "naïve café 日本語 🙂👍🏽",
		"e\u0301 and A\u030A: not NFC", "x<|im_start|>user\nhi<|im_end|>",
		"bad \xff\xfe bytes \xe2\x82 here", "\xc3", "<|endoftext|>",
	} {
		checkOffsets(t, tok, s)
	}
	// A non-NFC stretch maps to its whole source.
	s := "xe\u0301y"
	ids, offs := tok.EncodeWithOffsets(s)
	dec, _ := tok.Decode(ids)
	if dec != "xéy" {
		t.Fatalf("decode %q", dec)
	}
	if offs[len(offs)-1].End != len(s) {
		t.Fatalf("offsets %v do not reach %d", offs, len(s))
	}
}

// TestInvalidUTF8 pins the documented handling of invalid input: each
// maximal invalid sequence reads as U+FFFD.
func TestInvalidUTF8(t *testing.T) {
	tok := load(t, "tokenizer", "qwen3")
	for _, c := range []struct{ in, as string }{
		{"a\xffb", "a\uFFFDb"},
		{"\xe2\x82", "\uFFFD"}, // truncated 3-byte sequence: one replacement
		{"\xe2\x82x\x80", "\uFFFDx\uFFFD"},
		{"\xf0\x9f\x99", "\uFFFD"},
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: ED then two lone continuation bytes
		{"\xc0\xaf", "\uFFFD\uFFFD"},
	} {
		if got, want := tok.Encode(c.in), tok.Encode(c.as); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want Encode(%q) = %v", c.in, got, c.as, want)
		}
	}
	// Decoding a cut character gives U+FFFD, not the raw bytes.
	ids := tok.Encode("🙂")
	if len(ids) < 2 {
		t.Skip("emoji is one token")
	}
	if got, _ := tok.Decode(ids[:1]); !utf8.ValidString(got) || !strings.Contains(got, "\uFFFD") {
		t.Errorf("decode of a partial character %q", got)
	}
}

// FuzzRoundTrip: no input panics; offsets stay in range; for valid UTF-8 the
// round trip gives NFC(x).
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"", "hello world", "  \n\n\t x", "don't I'LL", "2025年", "e\u0301\u0301",
		"<|im_start|>x<|im_end|>", "<|im_sta", "\xff", "a'ſ 'LL 'Re", "\u00a0\u3000 \r\n", "ab\u0308\u0301c"} {
		f.Add(s)
	}
	toks := []*Tokenizer{load(f, "tokenizer", "qwen3"), load(f, "models", "tiny-qwen36-trained")}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tok := range toks {
			ids, offs := tok.EncodeWithOffsets(s)
			if len(offs) != len(ids) {
				t.Fatalf("%d offsets for %d ids", len(offs), len(ids))
			}
			for _, o := range offs {
				if o.Start < 0 || o.Start > o.End || o.End > len(s) {
					t.Fatalf("offset %v outside [0,%d]", o, len(s))
				}
			}
			got, err := tok.Decode(ids)
			if err != nil {
				t.Fatal(err)
			}
			if utf8.ValidString(s) {
				if want := norm.NFC.String(s); got != want {
					t.Fatalf("round trip %q -> %q, want %q", s, got, want)
				}
				checkOffsets(t, tok, s)
			}
		}
	})
}

// TestConcurrentEncode: goroutines sharing one tokenizer (and its cache,
// kept small so that entries are replaced while others read) get the ids
// of a private tokenizer.
func TestConcurrentEncode(t *testing.T) {
	shared := *load(t, "models", "tiny-qwen36-trained")
	shared.cache = newPieceCache(64)
	fresh := *load(t, "models", "tiny-qwen36-trained")
	fresh.cache = nil
	files := corpus(t, filepath.Join(goroot(t), "strings"), 256<<10, ".go")
	var texts []string
	for _, s := range files {
		texts = append(texts, s)
	}
	sort.Strings(texts)
	want := make([][]int, len(texts))
	for i, s := range texts {
		want[i] = fresh.Encode(s)
	}
	got := shared.EncodeBatch(append(append([]string{}, texts...), texts...), 4)
	for i := range got {
		if !slices.Equal(got[i], want[i%len(texts)]) {
			t.Fatalf("text %d differs under concurrent use", i)
		}
	}
}
