package dataset

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadJSONL: any file content gives records or an error naming the
// file (a *Error with a line, or ErrEmpty), never a panic; every record
// has exactly one form.
func FuzzReadJSONL(f *testing.F) {
	for _, s := range []string{
		"{\"text\": \"a\"}\n", "\n\n", "[1]\n", "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}",
		"{\"prompt\": \"p\", \"completion\": \"c\", \"corpus\": \"q\"}\n{\"text\": \"\\u00e9\"}",
		"{\"text\": \"\xff\"}", "{\"messages\": [{\"role\": \"user\", \"content\": 1}]}", "{\"text\": null}",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "f.jsonl")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		l, err := readSource(Source{Label: "x", Kind: KindJSONL, Path: p})
		if err != nil {
			var de *Error
			if !errors.As(err, &de) && !errors.Is(err, ErrEmpty) {
				t.Fatalf("error %v is neither a *dataset.Error nor ErrEmpty", err)
			}
			if de != nil && (de.File != p || de.Line < 1) {
				t.Fatalf("error %v does not name the file and line", err)
			}
			return
		}
		for _, r := range l.records {
			if r.Kind == recordInvalid || r.Line < 1 || r.Label != "x" {
				t.Fatalf("record %+v", r)
			}
		}
	})
}

// FuzzParseSpec: no spec string panics.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"a=x.jsonl", "a=dir:src:2,b=txt:y", "=:", ",", "a=b=c:d:e", "x.json"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseSpec(s)
		if err == nil && len(spec.Sources) == 0 {
			t.Fatal("a spec without sources was accepted")
		}
	})
}
