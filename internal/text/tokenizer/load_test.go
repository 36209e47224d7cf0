package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// tinyJSON returns the tiny model's tokenizer.json and tokenizer_config.json
// decoded as generic JSON, for mutation.
func tinyJSON(t *testing.T) (map[string]any, []byte) {
	t.Helper()
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	b, err := os.ReadFile(filepath.Join(dir, TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	return m, cfg
}

func parseMap(t *testing.T, m map[string]any, cfg []byte) (*Tokenizer, error) {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return Parse("tokenizer.json", b, "tokenizer_config.json", cfg, Options{})
}

func obj(m map[string]any, key string) map[string]any { return m[key].(map[string]any) }

func TestLoadRefusals(t *testing.T) {
	for _, c := range []struct {
		name  string
		edit  func(m map[string]any)
		kind  error
		field string
	}{
		{"model type", func(m map[string]any) { obj(m, "model")["type"] = "WordPiece" }, ErrUnsupported, "model.type"},
		{"no model", func(m map[string]any) { delete(m, "model") }, ErrMissing, "model"},
		{"dropout", func(m map[string]any) { obj(m, "model")["dropout"] = 0.1 }, ErrUnsupported, "model.dropout"},
		{"byte fallback", func(m map[string]any) { obj(m, "model")["byte_fallback"] = true }, ErrUnsupported, "model.byte_fallback"},
		{"unk", func(m map[string]any) { obj(m, "model")["unk_token"] = "<unk>" }, ErrUnsupported, "model.unk_token"},
		{"suffix", func(m map[string]any) { obj(m, "model")["end_of_word_suffix"] = "</w>" }, ErrUnsupported, "model.end_of_word_suffix"},
		{"unknown model field", func(m map[string]any) { obj(m, "model")["fancy"] = 1 }, ErrUnsupported, "model.fancy"},
		{"merge not in vocab", func(m map[string]any) { obj(m, "model")["merges"].([]any)[3] = "Ġ zzzz" }, ErrMalformed, "model.merges[3]"},
		{"merge one part", func(m map[string]any) { obj(m, "model")["merges"].([]any)[0] = "Ġ" }, ErrMalformed, "model.merges[0]"},
		{"merge mixed forms", func(m map[string]any) { obj(m, "model")["merges"].([]any)[2] = []any{"a", "b"} }, ErrMalformed, "model.merges[2]"},
		{"vocab lacks a byte", func(m map[string]any) { delete(obj(m, "model")["vocab"].(map[string]any), "Ġ") }, ErrMalformed, "model.vocab"},
		{"duplicate id", func(m map[string]any) { obj(m, "model")["vocab"].(map[string]any)["Ġ"] = 0.0 }, ErrMalformed, "model.vocab"},
		{"normalizer", func(m map[string]any) { m["normalizer"] = map[string]any{"type": "NFKC"} }, ErrUnsupported, "normalizer.type"},
		{"pre-tokenizer type", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}
		}, ErrUnsupported, "pre_tokenizer.type"},
		{"pre-tokenizer regex", func(m map[string]any) {
			sp := obj(m, "pre_tokenizer")["pretokenizers"].([]any)[0].(map[string]any)
			sp["pattern"] = map[string]any{"Regex": `\s+|\w+`}
		}, ErrUnsupported, "pre_tokenizer.pretokenizers[0].pattern.Regex"},
		{"split behaviour", func(m map[string]any) {
			obj(m, "pre_tokenizer")["pretokenizers"].([]any)[0].(map[string]any)["behavior"] = "Removed"
		}, ErrUnsupported, "pre_tokenizer.pretokenizers[0].behavior"},
		{"byte level regex", func(m map[string]any) {
			obj(m, "pre_tokenizer")["pretokenizers"].([]any)[1].(map[string]any)["use_regex"] = true
		}, ErrUnsupported, "pre_tokenizer.pretokenizers[1].use_regex"},
		{"prefix space", func(m map[string]any) {
			obj(m, "pre_tokenizer")["pretokenizers"].([]any)[1].(map[string]any)["add_prefix_space"] = true
		}, ErrUnsupported, "pre_tokenizer.pretokenizers[1].add_prefix_space"},
		{"post processor", func(m map[string]any) { m["post_processor"] = map[string]any{"type": "TemplateProcessing"} }, ErrUnsupported, "post_processor.type"},
		{"decoder", func(m map[string]any) { m["decoder"] = nil }, ErrUnsupported, "decoder"},
		{"truncation", func(m map[string]any) { m["truncation"] = map[string]any{"max_length": 5} }, ErrUnsupported, "truncation"},
		{"added normalized", func(m map[string]any) { m["added_tokens"].([]any)[1].(map[string]any)["normalized"] = true }, ErrUnsupported, "added_tokens[1].normalized"},
		{"added lstrip", func(m map[string]any) { m["added_tokens"].([]any)[0].(map[string]any)["lstrip"] = true }, ErrUnsupported, "added_tokens[0].lstrip"},
		{"added empty", func(m map[string]any) { m["added_tokens"].([]any)[2].(map[string]any)["content"] = "" }, ErrMalformed, "added_tokens[2].content"},
		{"added same id", func(m map[string]any) { m["added_tokens"].([]any)[2].(map[string]any)["id"] = 4064.0 }, ErrMalformed, "added_tokens[2].id"},
		{"unknown top-level", func(m map[string]any) { m["extra"] = true }, ErrUnsupported, "extra"},
		{"default not a copy", func(m map[string]any) { m["default"] = map[string]any{"version": "1.0"} }, ErrUnsupported, "default"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, cfg := tinyJSON(t)
			c.edit(m)
			tok, err := parseMap(t, m, cfg)
			var te *Error
			if tok != nil || !errors.As(err, &te) || !errors.Is(err, c.kind) || te.Field != c.field || te.Path != "tokenizer.json" {
				t.Fatalf("got %v (%#v), want %v at field %s", err, te, c.kind, c.field)
			}
			if !strings.Contains(err.Error(), "tokenizer.json: "+c.field) {
				t.Fatalf("message %q does not name file and field", err)
			}
		})
	}
}

func TestLoadFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), filepath.Join(dir, "tokenizer.json")) {
		t.Fatalf("missing file: %v", err)
	}
	os.WriteFile(filepath.Join(dir, TokenizerFile), []byte(`{"model": {"type": "BPE",`), 0o644)
	os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{}`), 0o644)
	if _, err := Load(dir); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("malformed file: %v", err)
	}
	os.WriteFile(filepath.Join(dir, TokenizerFile), []byte(`[1, 2]`), 0o644)
	if _, err := Load(dir); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "want an object") {
		t.Fatalf("array file: %v", err)
	}
	m, _ := tinyJSON(t)
	b, _ := json.Marshal(m)
	os.WriteFile(filepath.Join(dir, TokenizerFile), b, 0o644)
	os.Remove(filepath.Join(dir, ConfigFile))
	if _, err := Load(dir); !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), ConfigFile) {
		t.Fatalf("missing config: %v", err)
	}
	for cfg, field := range map[string]string{
		`{"eos_token": "<nope>"}`:              "eos_token",
		`{"split_special_tokens": true}`:       "split_special_tokens",
		`{"pad_token": 3}`:                     "pad_token",
		`{"bos_token": {"content": "<none>"}}`: "bos_token",
	} {
		os.WriteFile(filepath.Join(dir, ConfigFile), []byte(cfg), 0o644)
		var te *Error
		if _, err := Load(dir); !errors.As(err, &te) || te.Field != field {
			t.Errorf("config %s: %v, want an error at %s", cfg, err, field)
		}
	}
	os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{"eos_token": {"content": "<|im_end|>"}, "pad_token": null}`), 0o644)
	tok, err := Load(dir)
	if err != nil || tok.EOS() != 4066 || tok.PAD() != -1 {
		t.Fatalf("object-form eos: %v", err)
	}
}

// TestMergeEncodings: "a b" strings and ["a","b"] pairs give the same
// tokenizer.
func TestMergeEncodings(t *testing.T) {
	m, cfg := tinyJSON(t)
	a, err := parseMap(t, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	merges := obj(m, "model")["merges"].([]any)
	for i, s := range merges {
		l, r, _ := strings.Cut(s.(string), " ")
		merges[i] = []any{l, r}
	}
	b, err := parseMap(t, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	text := "The merges, written either way: 1234 naïve\n\tfunc main() {}"
	if !slices.Equal(a.Encode(text), b.Encode(text)) {
		t.Fatal("pair-encoded merges encode differently")
	}
}

// TestIgnoreMerges: with ignore_merges a pre-token that is a vocabulary
// entry is one token even where merging would split it. The vocabulary
// gets an entry that no merge builds.
func TestIgnoreMerges(t *testing.T) {
	m, cfg := tinyJSON(t)
	const word = "qzxjv"
	obj(m, "model")["vocab"].(map[string]any)[word] = 5000.0
	plain, err := parseMap(t, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	obj(m, "model")["ignore_merges"] = true
	im, err := parseMap(t, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ids := plain.Encode(word); len(ids) < 2 {
		t.Fatalf("merging gives %v; the test needs an unreachable entry", ids)
	}
	if got := im.Encode(word + "!"); !slices.Equal(got[:1], []int{5000}) || len(got) != 2 {
		t.Fatalf("ignore_merges: %q gives %v, want [5000 ...]", word+"!", got)
	}
	if got := im.Encode("Hello world"); !slices.Equal(got, plain.Encode("Hello world")) {
		t.Fatalf("ignore_merges changed the encoding of ordinary words: %v vs %v", got, plain.Encode("Hello world"))
	}
	if s, _ := im.Decode([]int{5000}); s != word {
		t.Fatalf("decode %q", s)
	}
}
