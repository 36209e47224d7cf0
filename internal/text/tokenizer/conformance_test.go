package tokenizer

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

var (
	loadOnce sync.Map // dir → *Tokenizer
)

// load returns the tokenizer of a testdata directory, loaded once per test
// binary.
func load(tb testing.TB, elem ...string) *Tokenizer {
	tb.Helper()
	dir := testdata.Dir(tb, elem...)
	if t, ok := loadOnce.Load(dir); ok {
		return t.(*Tokenizer)
	}
	t, err := Load(dir)
	if err != nil {
		tb.Fatal(err)
	}
	loadOnce.Store(dir, t)
	return t
}

func readJSONL[T any](tb testing.TB, path string) []T {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			tb.Fatalf("%s line %d: %v", path, len(out)+1, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// TestQwen3Cases checks every case of testdata/tokenizer/qwen3/cases.jsonl:
// the ids, the decode of those ids, and the offsets tiling the text.
func TestQwen3Cases(t *testing.T) {
	tok := load(t, "tokenizer", "qwen3")
	if tok.Pattern() != PatternQwen2 {
		t.Fatalf("pattern %v, want qwen2", tok.Pattern())
	}
	type tc struct {
		Text    string `json:"text"`
		IDs     []int  `json:"ids"`
		Decoded string `json:"decoded"`
	}
	cases := readJSONL[tc](t, filepath.Join(testdata.Dir(t, "tokenizer", "qwen3"), "cases.jsonl"))
	if len(cases) != 577 {
		t.Fatalf("%d cases, want 577", len(cases))
	}
	bad := 0
	for i, c := range cases {
		got := tok.Encode(c.Text)
		if !slices.Equal(got, c.IDs) {
			bad++
			if bad <= 10 {
				t.Errorf("case %d %q:\n got %v\nwant %v", i+1, c.Text, got, c.IDs)
			}
			continue
		}
		dec, err := tok.Decode(c.IDs)
		if err != nil || dec != c.Decoded {
			bad++
			t.Errorf("case %d: decode %q, %v; want %q", i+1, dec, err, c.Decoded)
		}
		ids, offs := tok.EncodeWithOffsets(c.Text)
		if !slices.Equal(ids, got) || len(offs) != len(ids) {
			t.Errorf("case %d: EncodeWithOffsets ids differ from Encode", i+1)
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d cases wrong", bad, len(cases))
	}
}

// TestQwen36Reference checks that every eval-dev record of the trained tiny
// model tokenizes to the ids of reference-dev.jsonl (Qwen3.5/3.6 pattern).
func TestQwen36Reference(t *testing.T) {
	tok := load(t, "models", "tiny-qwen36-trained")
	if tok.Pattern() != PatternQwen35 {
		t.Fatalf("pattern %v, want qwen3.5", tok.Pattern())
	}
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	type rec struct {
		Source string `json:"source"`
		Text   string `json:"text"`
		IDs    []int  `json:"ids"`
	}
	evals := readJSONL[rec](t, filepath.Join(dir, "eval-dev.jsonl"))
	refs := readJSONL[rec](t, filepath.Join(dir, "reference-dev.jsonl"))
	if len(evals) != 80 || len(refs) != len(evals) {
		t.Fatalf("%d eval records, %d references; want 80 each", len(evals), len(refs))
	}
	for i := range evals {
		if evals[i].Source != refs[i].Source {
			t.Fatalf("record %d: source %q vs %q", i+1, evals[i].Source, refs[i].Source)
		}
		got := tok.Encode(evals[i].Text)
		if !slices.Equal(got, refs[i].IDs) {
			n := 0
			for n < len(got) && n < len(refs[i].IDs) && got[n] == refs[i].IDs[n] {
				n++
			}
			t.Errorf("record %d (%s): %d ids, want %d; first difference at %d", i+1, evals[i].Source, len(got), len(refs[i].IDs), n)
		}
	}
	if tok.EOS() != 4066 || tok.PAD() != 4064 || tok.BOS() != -1 {
		t.Errorf("eos/pad/bos %d/%d/%d, want 4066/4064/-1", tok.EOS(), tok.PAD(), tok.BOS())
	}
}
