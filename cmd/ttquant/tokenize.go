package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ttquant/ttquant/internal/text/tokenizer"
)

func init() {
	register(&command{
		name:    "tokenize",
		summary: "encode text with a model's tokenizer (tokenizer.json)",
		run:     runTokenize,
	})
}

// tokenizeStdin is where "-" and --jsonl read from (replaced in tests).
var tokenizeStdin io.Reader = os.Stdin

// tokenizeDoc is the --json document.
type tokenizeDoc struct {
	SchemaVersion int      `json:"schema_version"`
	Model         string   `json:"model"`
	TokenizerHash string   `json:"tokenizer_sha256"`
	Pattern       string   `json:"pattern"`
	Count         int      `json:"count"`
	IDs           []int    `json:"ids"`
	Tokens        []string `json:"tokens"`  // byte-level spelling (BPE) or content (added)
	Text          []string `json:"text"`    // the text of each token (U+FFFD where a token ends inside a character)
	Offsets       [][2]int `json:"offsets"` // byte range of the input
}

func runTokenize(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "tokenize", "--model DIR [--ids | --tokens | --json] [TEXT | -]\n       ttquant tokenize --model DIR --jsonl [--workers N] < lines.jsonl")
	model := fs.String("model", "", "model `directory` holding tokenizer.json and tokenizer_config.json (required)")
	ids := fs.Bool("ids", false, "print only the ids, space-separated on one line")
	toks := fs.Bool("tokens", false, "print only the tokens' text, one quoted token a line")
	asJSON := fs.Bool("json", false, "print a JSON document with ids, tokens and offsets")
	jsonl := fs.Bool("jsonl", false, "read JSON lines {\"text\": ...} on stdin, write one {\"ids\": [...]} line per input line")
	workers := addWorkersFlag(fs, "--jsonl lines encoded")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *model == "" {
		return usageErrorf("--model is required")
	}
	modes := 0
	for _, b := range []bool{*ids, *toks, *asJSON, *jsonl} {
		if b {
			modes++
		}
	}
	if modes > 1 {
		return usageErrorf("--ids, --tokens, --json and --jsonl exclude each other")
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	if *jsonl {
		if fs.NArg() != 0 {
			return usageErrorf("--jsonl reads stdin and takes no TEXT argument")
		}
	} else if fs.NArg() != 1 {
		return usageErrorf("want one TEXT argument or - for stdin (have %d)", fs.NArg())
	}
	tok, err := tokenizer.Load(*model)
	if err != nil {
		return err
	}
	if *jsonl {
		return tokenizeJSONL(e, tok, *workers)
	}
	text := fs.Arg(0)
	if text == "-" {
		b, err := io.ReadAll(tokenizeStdin)
		if err != nil {
			return fmt.Errorf("stdin: %w", err)
		}
		if !utf8.Valid(b) {
			return fmt.Errorf("stdin: invalid UTF-8 at byte %d", invalidAt(b))
		}
		text = string(b)
	} else if !utf8.ValidString(text) {
		return fmt.Errorf("TEXT argument: invalid UTF-8 at byte %d", invalidAt([]byte(text)))
	}
	out, offs := tok.EncodeWithOffsets(text)
	w := bufio.NewWriter(e.stdout)
	switch {
	case *ids:
		for i, id := range out {
			if i > 0 {
				w.WriteByte(' ')
			}
			w.WriteString(strconv.Itoa(id))
		}
		w.WriteByte('\n')
	case *toks:
		for _, id := range out {
			w.WriteString(tokenText(tok, id))
			w.WriteByte('\n')
		}
	case *asJSON:
		doc := tokenizeDoc{SchemaVersion: schemaVersion, Model: *model, TokenizerHash: tok.SHA256(),
			Pattern: tok.Pattern().String(), Count: len(out), IDs: out,
			Tokens: make([]string, len(out)), Text: make([]string, len(out)), Offsets: make([][2]int, len(out))}
		for i, id := range out {
			doc.Tokens[i], _ = tok.Token(id)
			doc.Text[i], _ = tok.Decode(out[i : i+1])
			doc.Offsets[i] = [2]int{offs[i].Start, offs[i].End}
		}
		if err := writeJSON(w, doc); err != nil {
			return err
		}
	default:
		fmt.Fprintf(w, "%8s  %-11s  %s\n", "id", "bytes", "token")
		for i, id := range out {
			fmt.Fprintf(w, "%8d  %-11s  %s\n", id, fmt.Sprintf("%d:%d", offs[i].Start, offs[i].End), tokenText(tok, id))
		}
		fmt.Fprintf(w, "%d tokens, %d bytes\n", len(out), len(text))
	}
	return w.Flush()
}

// tokenText returns the text a token stands for, quoted, with bytes that
// are not a whole character shown as \x escapes.
func tokenText(tok *tokenizer.Tokenizer, id int) string {
	b, _ := tok.DecodeBytes([]int{id})
	s := strconv.Quote(string(b))
	if tok.IsSpecial(id) {
		s += " (special)"
	}
	return s
}

func invalidAt(b []byte) int {
	for i := 0; i < len(b); {
		r, w := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && w == 1 {
			return i
		}
		i += w
	}
	return len(b)
}

// tokenizeJSONL reads every line first and checks it, so that a bad line
// stops the command before anything is written; then it encodes the lines
// in parallel and writes the ids in input order.
func tokenizeJSONL(e *env, tok *tokenizer.Tokenizer, workers int) error {
	texts, err := readTextLines(tokenizeStdin, "stdin")
	if err != nil {
		return err
	}
	all := tok.EncodeBatch(texts, workers)
	w := bufio.NewWriterSize(e.stdout, 1<<16)
	var buf []byte
	for _, ids := range all {
		buf = append(buf[:0], `{"ids":[`...)
		for i, id := range ids {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = strconv.AppendInt(buf, int64(id), 10)
		}
		buf = append(buf, "]}\n"...)
		if _, err := w.Write(buf); err != nil {
			return err
		}
	}
	return w.Flush()
}

// readTextLines reads JSON lines that are objects with a string "text"
// (other fields are ignored). Every line must be such an object.
func readTextLines(r io.Reader, name string) ([]string, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var texts []string
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if len(b) == 0 && err == io.EOF {
			return texts, nil
		}
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("%s: line %d: %w", name, line, err)
		}
		b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
		var rec map[string]json.RawMessage
		if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
			return nil, fmt.Errorf("%s: line %d: not a JSON object", name, line)
		}
		if !utf8.Valid(b) {
			return nil, fmt.Errorf("%s: line %d: invalid UTF-8 at byte %d", name, line, invalidAt(b))
		}
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("%s: line %d: %v", name, line, err)
		}
		raw, ok := rec["text"]
		if !ok {
			return nil, fmt.Errorf("%s: line %d: no \"text\" field", name, line)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%s: line %d: \"text\" is not a string", name, line)
		}
		texts = append(texts, strings.Clone(s))
		if err == io.EOF {
			return texts, nil
		}
	}
}
