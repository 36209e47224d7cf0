package walk

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/model"
)

func TestNewChecksVocabulary(t *testing.T) {
	cfg := &model.Config{Vocab: 10, Layers: 2, MTPLayers: 1}
	w, err := New(cfg, [][]int32{{1, 2, 3}, {9}}, 0)
	if err != nil || w.Tokens != 4 || w.Layers() != 3 {
		t.Fatalf("New: %+v, %v", w, err)
	}
	if got := fmt.Sprint(w.Lens(1), w.Lens(2)); got != "[3 1] [2 0]" {
		t.Errorf("rows per sequence of a trunk layer and the MTP layer: %s", got)
	}
	for _, bad := range []int32{10, -1} {
		_, err := New(cfg, [][]int32{{1}, {2, bad}}, 0)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("sequence 1 token 1: id %d outside the model's vocabulary 0..9", bad)) {
			t.Errorf("id %d: %v", bad, err)
		}
	}
}

// TestSelect: a worker's walk holds its sequences in the order given,
// their tokens, and the batch bound of the whole walk.
func TestSelect(t *testing.T) {
	cfg := &model.Config{Vocab: 10, Layers: 2, MTPLayers: 1}
	w, err := New(cfg, [][]int32{{1, 2, 3}, {9}, {4, 5}, {6, 7, 8, 9}}, 5)
	if err != nil {
		t.Fatal(err)
	}
	s := w.Select([]int{3, 1})
	if got := fmt.Sprint(s.IDs, s.Tokens, s.MaxRows, s.Lens(2)); got != "[[6 7 8 9] [9]] 5 5 [3 0]" {
		t.Errorf("Select(3, 1): ids, tokens, batch rows, MTP rows %s", got)
	}
	if e := w.Select(nil); len(e.IDs) != 0 || e.Tokens != 0 || e.Config != cfg {
		t.Errorf("Select(none): %+v", e)
	}
}

func TestBatches(t *testing.T) {
	for _, c := range []struct {
		lens []int
		max  int
		want string
	}{
		{[]int{3, 3, 3}, 0, "[[0 3]]"},
		{[]int{3, 3, 3}, 6, "[[0 2] [2 3]]"},
		{[]int{3, 3, 3}, 5, "[[0 1] [1 2] [2 3]]"},
		{[]int{9, 1, 1}, 4, "[[0 1] [1 3]]"}, // a sequence longer than the bound is a batch of its own
		{nil, 0, "[]"},
	} {
		if got := fmt.Sprint(Batches(c.lens, c.max)); got != c.want {
			t.Errorf("Batches(%v, %d) = %s, want %s", c.lens, c.max, got, c.want)
		}
	}
}

func names(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// TestDirResume: records and streams written layer by layer come back as
// written; only the last layer's streams are kept; a damaged stream or
// record is an ErrDamaged; Clean leaves what a resume at a layer needs
// and the caller's files.
func TestDirResume(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "walk")}
	type payload struct{ N int }
	for l := 0; l < 3; l++ {
		x := []float32{float32(l), 1.5, -2}
		if err := d.Finish(l, payload{l}, x, x[:1]); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := names(t, d.Path), "layer-000.json layer-001.json layer-002.json stream-002.1.f32 stream-002.f32"; got != want {
		t.Errorf("files %q, want %q", got, want)
	}
	recs, err := d.Records()
	if err != nil || len(recs) != 3 {
		t.Fatalf("Records: %d, %v", len(recs), err)
	}
	var p payload
	if err := json.Unmarshal(recs[1].Data, &p); err != nil || p.N != 1 {
		t.Errorf("record 1 data %s", recs[1].Data)
	}
	xs, err := d.Streams(recs[2], 3, 1)
	if err != nil || !reflect.DeepEqual(xs, [][]float32{{2, 1.5, -2}, {2}}) {
		t.Errorf("Streams: %v, %v", xs, err)
	}
	if _, err := d.Streams(recs[2], 3, 2); !errors.Is(err, ErrDamaged) {
		t.Errorf("a stream of the wrong length: %v", err)
	}
	path := filepath.Join(d.Path, StreamName(2, 0))
	b, _ := os.ReadFile(path)
	b[5] ^= 1
	os.WriteFile(path, b, 0o644)
	if _, err := d.Streams(recs[2], 3, 1); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("a changed stream: %v", err)
	}
	os.WriteFile(filepath.Join(d.Path, RecordName(1)), []byte(`{"layer": 7}`), 0o644)
	if recs, err := d.Records(); !errors.Is(err, ErrDamaged) || len(recs) != 1 {
		t.Errorf("a record naming another layer: %d records, %v", len(recs), err)
	}
	// Leftovers of an interrupted layer 2 and a caller's file.
	for _, n := range []string{StreamName(0, 0), StreamName(1, 0) + ".partial", RecordName(2) + ".partial", "mine.bin"} {
		os.WriteFile(filepath.Join(d.Path, n), nil, 0o644)
	}
	if err := d.Clean(2); err != nil {
		t.Fatal(err)
	}
	if got, want := names(t, d.Path), "layer-000.json layer-001.json mine.bin"; got != want {
		t.Errorf("after Clean(2): %q, want %q", got, want)
	}
	// The last layer leaves no stream, and removes those before it.
	os.WriteFile(filepath.Join(d.Path, StreamName(1, 0)), nil, 0o644)
	os.WriteFile(filepath.Join(d.Path, StreamName(1, 1)), nil, 0o644)
	if err := d.Finish(2, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := names(t, d.Path), "layer-000.json layer-001.json layer-002.json mine.bin"; got != want {
		t.Errorf("after the last layer: %q, want %q", got, want)
	}
}

func TestInputsDiff(t *testing.T) {
	old := &Inputs{Format: inputsFormat, Version: inputsVersion, Sequences: 4, Tokens: 96, TokenIDsSHA256: "aa",
		Settings: []Setting{{"dtype", "F32"}, {"gone", "1"}}, Steps: 5, Data: json.RawMessage(`{"a": 1, "b": {"c": 2}}`)}
	same := *old
	same.Data = json.RawMessage(`{"a":1,"b":{"c":2}}`)
	if d := same.Diff(old); len(d) != 0 {
		t.Errorf("equal inputs differ: %v", d)
	}
	now := *old
	now.Tokens, now.TokenIDsSHA256 = 48, "bb"
	now.Settings = []Setting{{"dtype", "BF16"}}
	now.Data = json.RawMessage(`{"a": 1, "b": {"c": 3}}`)
	got := strings.Join(now.Diff(old), "; ")
	for _, w := range []string{"tokens was 96, now 48", "token ids sha256 was aa, now bb", "dtype was F32, now BF16", "gone was 1, now ", "the data provenance differs in b "} {
		if !strings.Contains(got, w) {
			t.Errorf("diff %q does not say %q", got, w)
		}
	}
	// The round trip through the directory.
	d := Dir{Path: t.TempDir()}
	if in, err := d.ReadInputs(); in != nil || err != nil {
		t.Errorf("inputs of an empty directory: %v, %v", in, err)
	}
	if err := d.WriteInputs(&now); err != nil {
		t.Fatal(err)
	}
	back, err := d.ReadInputs()
	if err != nil || len(now.Diff(back)) != 0 {
		t.Errorf("read back: %v, %v", back, err)
	}
}
