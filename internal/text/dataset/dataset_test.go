package dataset

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
)

var (
	tinyOnce sync.Once
	tinyTok  *tokenizer.Tokenizer
	tinyErr  error
)

// tiny returns the small Qwen3.6-pattern tokenizer of the trained tiny model.
func tiny(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	tinyOnce.Do(func() { tinyTok, tinyErr = tokenizer.Load(dir) })
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyTok
}

func write(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHashTokenIDs pins the calibration store's convention with a digest
// computed independently (Python hashlib over struct.pack('<I', ...)).
func TestHashTokenIDs(t *testing.T) {
	got := HashTokenIDs([][]int32{{1, 2, 3}, {4}, {}})
	if want := "113124fe96cf11b758652cc30e5450c3820d4faefeb81d9ffa46b722e04510b1"; got != want {
		t.Fatalf("HashTokenIDs = %s, want %s", got, want)
	}
}

func TestParseSpecInline(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	s, err := ParseSpec("code=" + src + ",prose=books.jsonl:0.5,chat=jsonl:x.data:2,notes=txt:a:b.txt,mixed.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	want := []Source{
		{Label: "code", Kind: KindDir, Path: src},
		{Label: "prose", Kind: KindJSONL, Path: "books.jsonl", Weight: 0.5},
		{Label: "chat", Kind: KindJSONL, Path: "x.data", Weight: 2},
		{Label: "notes", Kind: KindText, Path: "a:b.txt"},
		{Kind: KindJSONL, Path: "mixed.jsonl"},
	}
	if !reflect.DeepEqual(s.Sources, want) {
		t.Fatalf("sources\n got %+v\nwant %+v", s.Sources, want)
	}
	for _, c := range []struct{ spec, msg string }{
		{"", "empty data spec"},
		{"a=x.jsonl,", "entry 2"},
		{"a=x.jsonl:0", "weight 0"},
		{"a=x.jsonl:-1", "weight -1"},
		{"a=file.bin", "cannot tell what file.bin holds"},
		{"x.txt", "a label is required"},
		{"a b=x.txt", "label \"a b\""},
		{"a=", "no path"},
	} {
		_, err := ParseSpec(c.spec)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("ParseSpec(%q) = %v, want an error with %q", c.spec, err, c.msg)
		}
	}
}

func TestParseSpecFile(t *testing.T) {
	dir := t.TempDir()
	p := write(t, filepath.Join(dir, "spec.json"), `{
  "sources": [{"label": "code", "kind": "dir", "path": "src", "extensions": [".go"]},
              {"label": "prose", "kind": "jsonl", "path": "/abs/p.jsonl", "weight": 3}],
  "calibration": {"sequences": 8, "seq_len": 64},
  "evaluation": {"sequences": 2, "seq_len": 128, "mode": "record", "short": "pad"},
  "eval_fraction": 0.2, "seed": 7, "separator": "<|endoftext|>"
}`)
	s, err := ParseSpec(p)
	if err != nil {
		t.Fatal(err)
	}
	if s.Sources[0].Path != filepath.Join(dir, "src") || s.Sources[1].Path != "/abs/p.jsonl" || s.Sources[1].Weight != 3 {
		t.Errorf("sources %+v", s.Sources)
	}
	o := s.Options
	if o == nil || o.Calibration.Sequences != 8 || o.Evaluation.Mode != ModeRecord || o.Evaluation.Short != ShortPad || o.Seed != 7 || o.EvalFraction != 0.2 {
		t.Errorf("options %+v", o)
	}
	write(t, p, `{"sources": [{"label": "a", "kind": "txt", "path": "a.txt"}], "sede": 1}`)
	if _, err := ParseSpec(p); err == nil || !strings.Contains(err.Error(), "sede") {
		t.Errorf("unknown field: %v", err)
	}
	write(t, p, `{"sources": [{"label": "a", "kind": "tar", "path": "a.tar"}]}`)
	if _, err := ParseSpec(p); err == nil || !strings.Contains(err.Error(), "tar") {
		t.Errorf("unknown kind: %v", err)
	}
}

// corpusDir writes a small mixed corpus: a directory of code, a JSONL of
// prose, a JSONL of chats and instructions, and a text file.
func corpusDir(t *testing.T) string {
	dir := t.TempDir()
	for i := 0; i < 12; i++ {
		write(t, filepath.Join(dir, "src", fmt.Sprintf("pkg%d", i%3), fmt.Sprintf("f%02d.go", i)),
			fmt.Sprintf("package pkg%d\n\n// F%d returns %d.\nfunc F%d() int {\n\treturn %d * %d\n}\n", i%3, i, i*i, i, i, i))
	}
	write(t, filepath.Join(dir, "src", "README.bin"), "\x00\x01 not read: extension")
	write(t, filepath.Join(dir, "src", ".hidden", "x.go"), "\xff not read: hidden")
	var prose strings.Builder
	for i := 0; i < 40; i++ {
		fmt.Fprintf(&prose, "{\"text\": \"Paragraph %d. The quick brown fox jumps over the lazy dog %d times; naïve café.\", \"id\": %d}\n", i, i, i)
		if i == 5 {
			prose.WriteString("\n") // blank lines are allowed
		}
	}
	write(t, filepath.Join(dir, "prose.jsonl"), prose.String())
	var chat strings.Builder
	for i := 0; i < 20; i++ {
		if i%2 == 0 {
			fmt.Fprintf(&chat, `{"corpus": "chat", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is %d+%d?"}, {"role": "assistant", "content": "It is %d."}]}`+"\n", i, i, 2*i)
		} else {
			fmt.Fprintf(&chat, `{"corpus": "instruct", "prompt": "Name the number %d.", "completion": "%d is called %d."}`+"\n", i, i, i)
		}
	}
	write(t, filepath.Join(dir, "chat.jsonl"), chat.String())
	write(t, filepath.Join(dir, "book.txt"), strings.Repeat("Call me Ishmael. Some years ago, never mind how long precisely.\n", 30))
	return dir
}

func TestBuildMixtureAndSplit(t *testing.T) {
	tok := tiny(t)
	dir := corpusDir(t)
	spec, err := ParseSpec(fmt.Sprintf("code=%s/src:2,prose=%s/prose.jsonl,%s/chat.jsonl:1", dir, dir, dir))
	if err != nil {
		t.Fatal(err)
	}
	opt := Options{
		Calibration:  SetOptions{Sequences: 10, SeqLen: 32},
		Evaluation:   SetOptions{Sequences: 4, SeqLen: 48, Mode: ModeRecord, Short: ShortKeep},
		EvalFraction: 0.25, Seed: 1, Workers: 1,
	}
	res, err := Build(spec, tok, opt)
	if err != nil {
		t.Fatal(err)
	}
	cal, ev := res.Calibration, res.Evaluation
	if len(cal.Sequences) != 10 || len(ev.Sequences) != 4 {
		t.Fatalf("%d calibration, %d evaluation sequences", len(cal.Sequences), len(ev.Sequences))
	}
	for _, s := range cal.Sequences {
		if len(s.IDs) != 32 || len(s.Mask) != 32 {
			t.Fatalf("calibration sequence of %d ids, %d mask", len(s.IDs), len(s.Mask))
		}
	}
	for _, s := range ev.Sequences {
		if len(s.IDs) == 0 || len(s.IDs) > 48 || len(s.Mask) != len(s.IDs) || len(s.Records) != 1 {
			t.Fatalf("evaluation sequence of %d ids, %d records", len(s.IDs), len(s.Records))
		}
	}
	// Weights 2 : 1 : 1 over sources; the chat source splits by label in
	// proportion to its records (10 chat, 10 instruct): quotas 5, 2.5,
	// 1.25, 1.25, and the largest remainder (prose) takes the tenth.
	p := res.Provenance.Calibration
	if want := map[string]int{"code": 5, "prose": 3, "chat": 1, "instruct": 1}; !reflect.DeepEqual(p.ByLabel, want) {
		t.Errorf("calibration by label %v, want %v", p.ByLabel, want)
	}
	// No record is in both sets.
	calRecs := map[string]bool{}
	for _, s := range cal.Sequences {
		for _, r := range s.Records {
			calRecs[r.Where] = true
		}
	}
	for _, s := range ev.Sequences {
		for _, r := range s.Records {
			if calRecs[r.Where] {
				t.Errorf("record %s in both sets", r.Where)
			}
		}
	}
	for _, si := range res.Provenance.Sources {
		if si.CalibrationRecords+si.EvaluationRecords != si.Records || si.EvaluationRecords == 0 || si.CalibrationRecords == 0 {
			t.Errorf("source %s: %d + %d records of %d", si.Path, si.CalibrationRecords, si.EvaluationRecords, si.Records)
		}
		for _, f := range si.Files {
			if len(f.SHA256) != 64 || f.Bytes <= 0 {
				t.Errorf("file %+v", f)
			}
		}
	}
	if n := len(res.Provenance.Sources[0].Files); n != 12 {
		t.Errorf("dir source read %d files, want 12 (.go only, hidden skipped)", n)
	}
	if p.TokenIDsSHA256 != HashTokenIDs(cal.IDs()) || p.Tokens != 320 {
		t.Errorf("calibration provenance %+v", p)
	}
	// Deterministic, whatever the number of workers.
	opt.Workers = 4
	res2, err := Build(spec, tok, opt)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res2.Calibration, res.Calibration) || !reflect.DeepEqual(res2.Evaluation, res.Evaluation) {
		t.Errorf("a second build with 4 workers differs")
	}
	// Another seed gives another set.
	opt.Seed = 2
	res3, err := Build(spec, tok, opt)
	if err != nil {
		t.Fatal(err)
	}
	if res3.Provenance.Calibration.TokenIDsSHA256 == p.TokenIDsSHA256 {
		t.Errorf("seed does not change the calibration set")
	}
}

// TestPackedContent checks that packing is the records' ids, each followed
// by the separator, in the order the sequences name them.
func TestPackedContent(t *testing.T) {
	tok := tiny(t)
	dir := t.TempDir()
	var b strings.Builder
	for i := 0; i < 30; i++ {
		fmt.Fprintf(&b, "{\"text\": \"record %d says hello\"}\n", i)
	}
	write(t, filepath.Join(dir, "r.jsonl"), b.String())
	spec, _ := ParseSpec("p=" + filepath.Join(dir, "r.jsonl"))
	res, err := Build(spec, tok, Options{Calibration: SetOptions{Sequences: 3, SeqLen: 20}, Separator: "<|endoftext|>"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Calibration.Sequences {
		// Rebuild the sequence from its record refs.
		var want []int32
		for k, r := range s.Records {
			line := 0
			fmt.Sscanf(r.Where[strings.LastIndexByte(r.Where, ':')+1:], "%d", &line)
			ids := tok.Encode(fmt.Sprintf("record %d says hello", line-1))
			full := make([]int32, 0, len(ids)+1)
			for _, id := range ids {
				full = append(full, int32(id))
			}
			full = append(full, 4064)
			if k == 0 {
				if r.Start > 0 {
					t.Fatalf("first record starts at %d", r.Start)
				}
				full = full[-r.Start:]
			}
			want = append(want, full...)
		}
		if !slices.Equal(s.IDs, want[:20]) {
			t.Fatalf("sequence %v\nwant %v", s.IDs, want[:20])
		}
		for _, m := range s.Mask {
			if !m {
				t.Fatal("text records are masked in full")
			}
		}
	}
}

func TestRecordModeShort(t *testing.T) {
	tok := tiny(t)
	dir := t.TempDir()
	write(t, filepath.Join(dir, "r.jsonl"), "{\"text\": \"a short one\"}\n{\"text\": \""+strings.Repeat("long text ", 50)+"\"}\n{\"text\": \"tiny\"}\n")
	spec, _ := ParseSpec("p=" + filepath.Join(dir, "r.jsonl"))
	cal := func(short Short, n int) (*Result, error) {
		return Build(spec, tok, Options{Calibration: SetOptions{Sequences: n, SeqLen: 16, Mode: ModeRecord, Short: short}, EvalFraction: 1e-9})
	}
	res, err := cal(ShortPad, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Calibration.Sequences {
		if len(s.IDs) != 16 {
			t.Fatalf("padded sequence of %d", len(s.IDs))
		}
		for i, id := range s.IDs {
			if id == int32(tok.PAD()) && s.Mask[i] {
				t.Fatal("padding is masked in")
			}
		}
	}
	if _, err := cal(ShortSkip, 2); !errors.Is(err, ErrNotEnoughText) {
		t.Fatalf("skip: %v, want not enough text", err)
	}
	res, err = cal(ShortSkip, 1)
	if err != nil || len(res.Calibration.Sequences[0].IDs) != 16 {
		t.Fatalf("skip: %v", err)
	}
	res, err = cal(ShortKeep, 3)
	if err != nil {
		t.Fatal(err)
	}
	lens := 0
	for _, s := range res.Calibration.Sequences {
		lens += len(s.IDs)
	}
	if lens >= 48 {
		t.Fatalf("keep: total length %d, want short sequences", lens)
	}
}

func TestChatMaskInDataset(t *testing.T) {
	tok := tiny(t)
	dir := t.TempDir()
	write(t, filepath.Join(dir, "c.jsonl"), `{"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello, friend."}]}`+"\n")
	spec, _ := ParseSpec("chat=" + filepath.Join(dir, "c.jsonl"))
	res, err := Build(spec, tok, Options{Calibration: SetOptions{Sequences: 1, SeqLen: 4096, Mode: ModeRecord}, EvalFraction: 1e-9})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Calibration.Sequences[0]
	var scored []int
	for i, m := range s.Mask {
		if m {
			scored = append(scored, int(s.IDs[i]))
		}
	}
	got, _ := tok.Decode(scored)
	if got != "Hello, friend.<|im_end|>" {
		t.Fatalf("assistant tokens decode to %q", got)
	}
}

// TestBadInput: each problem is an error naming the file (and line), and
// Build returns no result.
func TestBadInput(t *testing.T) {
	tok := tiny(t)
	dir := t.TempDir()
	opt := Options{Calibration: SetOptions{Sequences: 1, SeqLen: 4}}
	for _, c := range []struct {
		name, file, content, msg string
		is                       error
	}{
		{"invalid UTF-8 in JSONL", "a.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"bad \xff\"}\n", "a.jsonl:2: invalid UTF-8 at column 15", nil},
		{"invalid UTF-8 in txt", "a.txt", "line one\nline \xc3(two\n", "a.txt:2: invalid UTF-8 at byte 14 (column 6)", nil},
		{"not an object", "a.jsonl", "{\"text\": \"ok\"}\n[\"text\"]\n", "a.jsonl:2: not a JSON object", nil},
		{"string line", "a.jsonl", "\"text\"\n", "a.jsonl:1: not a JSON object", nil},
		{"malformed", "a.jsonl", "{\"text\": \"ok\"\n", "a.jsonl:1:", nil},
		{"no field", "a.jsonl", "{\"txt\": \"ok\"}\n", "a.jsonl:1: no \"text\", \"messages\"", nil},
		{"two forms", "a.jsonl", "{\"text\": \"ok\", \"prompt\": \"p\", \"completion\": \"c\"}\n", "a.jsonl:1: more than one", nil},
		{"prompt alone", "a.jsonl", "{\"prompt\": \"p\"}\n", "a.jsonl:1: \"prompt\" and \"completion\" go together", nil},
		{"bad role", "a.jsonl", "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}\n", "a.jsonl:1: chat not renderable: message 0: role \"tool\"", nil},
		{"reasoning", "a.jsonl", "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"reasoning_content\": \"r\"}]}\n", "a.jsonl:1: messages[0]: field \"reasoning_content\" is not supported", nil},
		{"content parts", "a.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]}\n", "a.jsonl:1: messages[0]: \"content\" is not a string", nil},
		{"no assistant", "a.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n", "a.jsonl:1: \"messages\" has no assistant", nil},
		{"empty JSONL", "a.jsonl", "\n\n", "a.jsonl (jsonl): no records", ErrEmpty},
		{"empty txt", "a.txt", "", "a.txt (txt): no records", ErrEmpty},
		{"too little text", "a.txt", "one two", "not enough text", ErrNotEnoughText},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := write(t, filepath.Join(dir, c.file), c.content)
			spec, err := ParseSpec("x=" + p)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Build(spec, tok, Options{Calibration: opt.Calibration, EvalFraction: 1e-9})
			if err == nil || res != nil || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), p) {
				t.Fatalf("got %v, want an error naming %s with %q", err, p, c.msg)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Fatalf("error %v does not wrap %v", err, c.is)
			}
			var de *Error
			if c.is == nil && !errors.As(err, &de) {
				t.Fatalf("error %T is not a *dataset.Error", err)
			}
		})
	}
	// A directory with a binary file fails unless skip_invalid is set.
	src := filepath.Join(dir, "tree")
	write(t, filepath.Join(src, "a.go"), "package a\n"+strings.Repeat("// text\n", 20))
	write(t, filepath.Join(src, "b.go"), "package b\x00")
	spec := &Spec{Sources: []Source{{Label: "code", Kind: KindDir, Path: src}}}
	if _, err := Build(spec, tok, Options{Calibration: opt.Calibration, EvalFraction: 1e-9}); err == nil || !strings.Contains(err.Error(), "b.go:1: a NUL byte") {
		t.Fatalf("binary file: %v", err)
	}
	spec.Sources[0].SkipInvalid = true
	res, err := Build(spec, tok, Options{Calibration: opt.Calibration, EvalFraction: 1e-9})
	if err != nil || !slices.Equal(res.Provenance.Sources[0].Skipped, []string{"b.go"}) {
		t.Fatalf("skip_invalid: %v", err)
	}
	// No sequences requested, a bad fraction.
	if _, err := Build(spec, tok, Options{}); err == nil {
		t.Error("no sequences requested: no error")
	}
	if _, err := Build(spec, tok, Options{Calibration: opt.Calibration, EvalFraction: 1}); err == nil {
		t.Error("eval fraction 1: no error")
	}
}

// TestTinyModelData builds calibration and evaluation sets from the trained
// tiny model's calib.jsonl, labelled by the records' own "corpus" field.
func TestTinyModelData(t *testing.T) {
	tok := tiny(t)
	path := filepath.Join(testdata.Dir(t, "models", "tiny-qwen36-trained"), "calib.jsonl")
	spec, err := ParseSpec(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Build(spec, tok, Options{Calibration: SetOptions{Sequences: 16, SeqLen: 256}, Evaluation: SetOptions{Sequences: 4, SeqLen: 256}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if c := res.Provenance.Calibration; c.ByLabel["code"] != 8 || c.ByLabel["prose"] != 8 || c.Tokens != 16*256 {
		t.Fatalf("calibration %+v", c)
	}
	if f := res.Provenance.Sources[0].Files[0]; f.Records != 260 {
		t.Fatalf("calib.jsonl: %d records, want 260", f.Records)
	}
}

func TestApportion(t *testing.T) {
	for _, c := range []struct {
		n    int
		w    []float64
		want []int
	}{
		{10, []float64{2, 1, 0.5, 0.5}, []int{5, 3, 1, 1}},
		{3, []float64{1, 1, 1, 1}, []int{1, 1, 1, 0}},
		{7, []float64{1}, []int{7}},
		{128, []float64{0.5, 0.25, 0.25}, []int{64, 32, 32}},
	} {
		got := apportion(c.n, c.w)
		if !slices.Equal(got, c.want) {
			t.Errorf("apportion(%d, %v) = %v, want %v", c.n, c.w, got, c.want)
		}
	}
}

// TestAllRecords: every record of every source becomes one whole
// sequence, whatever the weights; sizes with it are refused.
func TestAllRecords(t *testing.T) {
	tok := tiny(t)
	dir := t.TempDir()
	long := strings.Repeat("long text ", 500)
	write(t, filepath.Join(dir, "a.jsonl"), "{\"text\": \"a short one\"}\n{\"text\": \""+long+"\"}\n{\"text\": \"tiny\"}\n")
	write(t, filepath.Join(dir, "b.txt"), "another file")
	spec, err := ParseSpec("a=" + filepath.Join(dir, "a.jsonl") + ",b=txt:" + filepath.Join(dir, "b.txt") + ":5")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Build(spec, tok, Options{Evaluation: SetOptions{AllRecords: true}, EvalFraction: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Evaluation.Sequences); n != 4 {
		t.Fatalf("%d sequences, want one per record (4)", n)
	}
	whole := false
	for _, s := range res.Evaluation.Sequences {
		whole = whole || len(s.IDs) == len(tok.Encode(long))
	}
	if !whole {
		t.Error("the long record was cut")
	}
	for _, so := range []SetOptions{{AllRecords: true, Sequences: 2}, {AllRecords: true, SeqLen: 16}, {AllRecords: true, Mode: ModePack}, {AllRecords: true, Short: ShortPad}} {
		if _, err := Build(spec, tok, Options{Evaluation: so, EvalFraction: 1}); err == nil {
			t.Errorf("%+v accepted", so)
		}
	}
}
