package main

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/text/tokenizer"

	"github.com/ttquant/ttquant/internal/testdata"
)

func withStdin(t *testing.T, s string) {
	t.Helper()
	old := tokenizeStdin
	tokenizeStdin = strings.NewReader(s)
	t.Cleanup(func() { tokenizeStdin = old })
}

func TestTokenizeCLI(t *testing.T) {
	// One check against the independent Qwen3 vectors (151k vocabulary).
	code, out, errs := runCLI(t, "tokenize", "--model", testdata.Dir(t, "tokenizer", "qwen3"), "--ids", "Hello, world!")
	if code != exitOK || out != "9707 11 1879 0\n" {
		t.Fatalf("--ids: status %d, out %q, stderr %q", code, out, errs)
	}
	// The other modes with the small tokenizer of the trained tiny model.
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	withStdin(t, "Hello world")
	code, out, _ = runCLI(t, "tokenize", "--model", dir, "--tokens", "-")
	var want strings.Builder
	for _, id := range tok.Encode("Hello world") {
		b, _ := tok.DecodeBytes([]int{id})
		want.WriteString(strconv.Quote(string(b)) + "\n")
	}
	if code != exitOK || out != want.String() {
		t.Fatalf("--tokens -: status %d, out %q, want %q", code, out, want.String())
	}
	code, out, _ = runCLI(t, "tokenize", "--model", dir, "--json", "a<|im_end|>")
	var doc tokenizeDoc
	if code != exitOK || json.Unmarshal([]byte(out), &doc) != nil {
		t.Fatalf("--json: status %d, out %q", code, out)
	}
	if doc.SchemaVersion != schemaVersion || doc.Count != 2 || doc.IDs[1] != 4066 || doc.Offsets[1] != [2]int{1, 11} ||
		doc.Pattern != "qwen3.5" || doc.Text[1] != "<|im_end|>" || doc.TokenizerHash != tok.SHA256() {
		t.Errorf("--json document %+v", doc)
	}
	code, out, _ = runCLI(t, "tokenize", "--model", dir, "x y")
	if code != exitOK || !strings.Contains(out, "2 tokens, 3 bytes") {
		t.Errorf("table: status %d, out %q", code, out)
	}
}

// The tests below use the small tokenizer of the trained tiny model, which
// loads in milliseconds.
func TestTokenizeJSONL(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"Hello world", "", "<|im_start|>x", "func main() {\n\tfmt.Println(1)\n}"}
	var in, want strings.Builder
	for i, s := range texts {
		b, _ := json.Marshal(map[string]any{"text": s, "n": i})
		in.Write(b)
		in.WriteString("\n")
		b, _ = json.Marshal(map[string][]int{"ids": tok.Encode(s)})
		want.Write(b)
		want.WriteString("\n")
	}
	withStdin(t, strings.TrimSuffix(in.String(), "\n")) // last line without newline
	code, out, errs := runCLI(t, "tokenize", "--model", dir, "--jsonl", "--workers", "2")
	if !strings.Contains(want.String(), "[]") || !strings.Contains(want.String(), "4065") {
		t.Fatalf("test input does not cover empty text and added tokens: %s", want.String())
	}
	if code != exitOK || out != want.String() {
		t.Fatalf("status %d, out %q, stderr %q; want %q", code, out, errs, want.String())
	}
	for _, c := range []struct{ in, msg string }{
		{"{\"text\":\"a\"}\n[1,2]\n", "stdin: line 2: not a JSON object"},
		{"{\"text\":\"a\"}\n\n", "stdin: line 2: not a JSON object"},
		{"{\"txt\":\"a\"}\n", "stdin: line 1: no \"text\" field"},
		{"{\"text\":3}\n", "stdin: line 1: \"text\" is not a string"},
		{"{\"text\":\"a\"}\n{\"text\":\"\xff\"}\n", "stdin: line 2: invalid UTF-8"},
		{"{\"text\":\"a\"\n", "stdin: line 1:"},
	} {
		withStdin(t, c.in)
		code, out, errs := runCLI(t, "tokenize", "--model", dir, "--jsonl")
		if code != exitError || out != "" || !strings.Contains(errs, c.msg) {
			t.Errorf("%q: status %d, out %q (want nothing written), stderr %q (want %q)", c.in, code, out, errs, c.msg)
		}
	}
}

func TestTokenizeErrors(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	for _, c := range []struct {
		args   []string
		status int
		msg    string
	}{
		{[]string{"tokenize", "x"}, exitUsage, "--model is required"},
		{[]string{"tokenize", "--model", dir}, exitUsage, "want one TEXT"},
		{[]string{"tokenize", "--model", dir, "--ids", "--tokens", "x"}, exitUsage, "exclude each other"},
		{[]string{"tokenize", "--model", dir, "--jsonl", "x"}, exitUsage, "takes no TEXT"},
		{[]string{"tokenize", "--model", dir, "--jsonl", "--workers", "0"}, exitUsage, "--workers 0"},
		{[]string{"tokenize", "--model", filepath.Join(dir, "nope"), "x"}, exitError, "tokenizer.json: missing"},
		{[]string{"tokenize", "--model", dir, "a\xffb"}, exitError, "invalid UTF-8 at byte 1"},
	} {
		code, out, errs := runCLI(t, c.args...)
		if code != c.status || out != "" || !strings.Contains(errs, c.msg) {
			t.Errorf("%q: status %d, out %q, stderr %q; want status %d and %q", c.args, code, out, errs, c.status, c.msg)
		}
	}
}
