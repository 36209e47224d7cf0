package jsonx

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type rec struct {
	A int    `json:"a"`
	B string `json:"b"`
}

func TestUnmarshalRefusesUnknownFields(t *testing.T) {
	var r rec
	if err := Unmarshal([]byte(`{"a": 1, "b": "x"}`), &r); err != nil || r.A != 1 || r.B != "x" {
		t.Fatalf("known fields: %v %+v", err, r)
	}
	if err := Unmarshal([]byte(`{"a": 1, "c": 2}`), &r); err == nil || !strings.Contains(err.Error(), `unknown field "c"`) {
		t.Errorf("unknown field: %v", err)
	}
	path := filepath.Join(t.TempDir(), "r.json")
	os.WriteFile(path, []byte(`{"a": 1, "c": 2}`+"\n"), 0o644)
	if err := ReadFile(path, &r); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("ReadFile of an unknown field: %v", err)
	}
	if err := ReadFile(filepath.Join(t.TempDir(), "none.json"), &r); err == nil {
		t.Error("ReadFile of no file: no error")
	}
}

func TestCompact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""}, {"{ \"a\" : [1, 2] }\n", `{"a":[1,2]}`}, {"{", ""},
	} {
		if got := string(Compact([]byte(c.in))); got != c.want {
			t.Errorf("Compact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if Compact(nil) != nil || Compact([]byte("{")) != nil {
		t.Error("Compact of nothing or of not JSON is not nil")
	}
}

func TestSame(t *testing.T) {
	if !Same(rec{A: 1}, map[string]any{"a": 1, "b": ""}) || Same(rec{A: 1}, rec{A: 2}) || Same(func() {}, func() {}) {
		t.Error("Same compares the encodings")
	}
}
