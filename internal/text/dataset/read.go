package dataset

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/ttquant/ttquant/internal/text/tokenizer"
)

// Error is a problem with one data file, at one line when Line > 0.
type Error struct {
	File string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("dataset: %s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("dataset: %s: %s", e.File, e.Msg)
}

// ErrEmpty is wrapped by the errors for sources (or whole datasets) that
// yield no records.
var ErrEmpty = errors.New("no records")

// RecordKind says how a record's text was given.
type RecordKind uint8

const (
	recordInvalid RecordKind = iota
	// RecordText: plain text (a "text" field, a .txt file, a source file).
	RecordText
	// RecordChat: a "messages" conversation.
	RecordChat
	// RecordInstruct: a "prompt"/"completion" pair.
	RecordInstruct
)

func (k RecordKind) String() string {
	switch k {
	case RecordText:
		return "text"
	case RecordChat:
		return "chat"
	case RecordInstruct:
		return "instruct"
	}
	return "invalid"
}

// Record is one unit of text: a JSONL line, a .txt file or a source file.
// Records are never split between the calibration and evaluation sets.
type Record struct {
	Label      string // corpus label
	File       string // path relative to the source path ("" for a file source)
	Line       int    // 1-based JSONL line; 0 for whole files
	Kind       RecordKind
	Text       string              // RecordText
	Messages   []tokenizer.Message // RecordChat
	Prompt     string              // RecordInstruct
	Completion string              // RecordInstruct
}

// where names the record for errors and provenance.
func (r *Record) where(src *Source) string {
	p := src.Path
	if r.File != "" {
		p = filepath.Join(src.Path, r.File)
	}
	if r.Line > 0 {
		return fmt.Sprintf("%s:%d", p, r.Line)
	}
	return p
}

// FileInfo is the provenance of one file read.
type FileInfo struct {
	// Path is relative to the source path for dir sources; empty for the
	// file of a jsonl or txt source in a content-only provenance.
	Path    string `json:"path,omitempty"`
	SHA256  string `json:"sha256"`
	Bytes   int64  `json:"bytes"`
	Records int    `json:"records"`
}

// loaded is a source read into memory.
type loaded struct {
	src     Source
	records []Record
	files   []FileInfo
	skipped []string // dir files skipped as not UTF-8 text
}

func readSource(src Source) (*loaded, error) {
	l := &loaded{src: src}
	switch src.Kind {
	case KindJSONL:
		if err := l.readJSONL(src.Path, ""); err != nil {
			return nil, err
		}
	case KindText:
		if err := l.readText(src.Path, ""); err != nil {
			return nil, err
		}
	case KindDir:
		if err := l.readDir(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("dataset: %s: invalid source kind", src.Path)
	}
	if len(l.records) == 0 {
		return nil, fmt.Errorf("dataset: source %s (%s): %w", src.Path, src.Kind, ErrEmpty)
	}
	return l, nil
}

func readData(path string) ([]byte, FileInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("dataset: %w", err)
	}
	sum := sha256.Sum256(b)
	return b, FileInfo{SHA256: hex.EncodeToString(sum[:]), Bytes: int64(len(b))}, nil
}

// invalidUTF8 returns the byte offset of the first invalid UTF-8 in b, or -1.
func invalidUTF8(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, w := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && w == 1 {
			return i
		}
		i += w
	}
	return -1
}

// lineOf returns the 1-based line and column (byte) of offset off in b.
func lineOf(b []byte, off int) (int, int) {
	line := 1 + bytes.Count(b[:off], []byte{'\n'})
	col := off - bytes.LastIndexByte(b[:off], '\n')
	return line, col
}

func (l *loaded) readText(path, rel string) error {
	b, info, err := readData(path)
	if err != nil {
		return err
	}
	if off := invalidUTF8(b); off >= 0 {
		line, col := lineOf(b, off)
		return &Error{File: path, Line: line, Msg: fmt.Sprintf("invalid UTF-8 at byte %d (column %d)", off, col)}
	}
	info.Path = rel
	if rel == "" {
		info.Path = path
	}
	if len(b) > 0 {
		l.records = append(l.records, Record{Label: l.src.Label, File: rel, Kind: RecordText, Text: string(b)})
		info.Records = 1
	}
	l.files = append(l.files, info)
	return nil
}

// jsonRecord is the accepted shape of a JSONL record. Other fields are
// ignored.
type jsonRecord struct {
	Text       *string            `json:"text"`
	Messages   *[]json.RawMessage `json:"messages"`
	Prompt     *string            `json:"prompt"`
	Completion *string            `json:"completion"`
	Corpus     *string            `json:"corpus"`
}

func (l *loaded) readJSONL(path, rel string) error {
	b, info, err := readData(path)
	if err != nil {
		return err
	}
	info.Path = path
	n0 := len(l.records)
	line := 0
	for len(b) > 0 {
		line++
		var ln []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			ln, b = b[:i], b[i+1:]
		} else {
			ln, b = b, nil
		}
		t := bytes.TrimSpace(ln)
		if len(t) == 0 {
			continue // blank lines are allowed
		}
		fail := func(format string, args ...any) error {
			return &Error{File: path, Line: line, Msg: fmt.Sprintf(format, args...)}
		}
		if off := invalidUTF8(ln); off >= 0 {
			return fail("invalid UTF-8 at column %d", off+1)
		}
		if t[0] != '{' {
			return fail("not a JSON object")
		}
		var jr jsonRecord
		if err := json.Unmarshal(t, &jr); err != nil {
			return fail("%v", err)
		}
		r := Record{Label: l.src.Label, File: rel, Line: line}
		if l.src.Label == "" {
			if jr.Corpus == nil || !labelRE.MatchString(*jr.Corpus) {
				return fail("the source has no label, so the record needs a \"corpus\" string of letters, digits, '_', '-', '.'")
			}
			r.Label = *jr.Corpus
		}
		forms := 0
		if jr.Text != nil {
			forms++
			r.Kind, r.Text = RecordText, *jr.Text
		}
		if jr.Messages != nil {
			forms++
			r.Kind = RecordChat
			if r.Messages, err = parseMessages(*jr.Messages); err != nil {
				return fail("%v", err)
			}
			if _, _, err := tokenizer.RenderChat(r.Messages); err != nil {
				return fail("%v", err)
			}
			assistant := false
			for _, m := range r.Messages {
				assistant = assistant || m.Role == tokenizer.RoleAssistant
			}
			if !assistant {
				return fail("\"messages\" has no assistant message: nothing would be scored")
			}
		}
		if jr.Prompt != nil || jr.Completion != nil {
			forms++
			if jr.Prompt == nil || jr.Completion == nil {
				return fail("\"prompt\" and \"completion\" go together")
			}
			r.Kind, r.Prompt, r.Completion = RecordInstruct, *jr.Prompt, *jr.Completion
		}
		switch {
		case forms == 0:
			return fail("no \"text\", \"messages\" or \"prompt\"/\"completion\" field")
		case forms > 1:
			return fail("more than one of \"text\", \"messages\", \"prompt\"/\"completion\"")
		}
		l.records = append(l.records, r)
	}
	info.Records = len(l.records) - n0
	l.files = append(l.files, info)
	return nil
}

func (l *loaded) readDir() error {
	root := l.src.Path
	fi, err := os.Stat(root)
	if err != nil {
		return fmt.Errorf("dataset: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("dataset: %s: not a directory", root)
	}
	exts := l.src.Extensions
	if len(exts) == 0 {
		exts = DefaultExtensions
	}
	var paths []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		for _, e := range exts {
			if strings.HasSuffix(d.Name(), e) {
				paths = append(paths, p)
				break
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("dataset: %w", err)
	}
	sort.Strings(paths)
	for _, p := range paths {
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		b, info, err := readData(p)
		if err != nil {
			return err
		}
		off := invalidUTF8(b)
		if off < 0 {
			off = bytes.IndexByte(b, 0)
		}
		if off >= 0 {
			if l.src.SkipInvalid {
				l.skipped = append(l.skipped, rel)
				continue
			}
			line, col := lineOf(b, off)
			what := "invalid UTF-8"
			if b[off] == 0 {
				what = "a NUL byte"
			}
			return &Error{File: p, Line: line, Msg: fmt.Sprintf("%s at byte %d (column %d); not text (set skip_invalid on the source to skip such files)", what, off, col)}
		}
		info.Path = rel
		if len(b) > 0 {
			l.records = append(l.records, Record{Label: l.src.Label, File: rel, Kind: RecordText, Text: string(b)})
			info.Records = 1
		}
		l.files = append(l.files, info)
	}
	return nil
}

// parseMessages reads a "messages" list strictly: every message is an
// object with a string "role" and a string "content" and nothing else, so
// that tool calls, reasoning blocks or multimodal parts are refused rather
// than dropped.
func parseMessages(raw []json.RawMessage) ([]tokenizer.Message, error) {
	out := make([]tokenizer.Message, len(raw))
	for i, m := range raw {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(m, &fields); err != nil || fields == nil {
			return nil, fmt.Errorf("messages[%d]: not an object", i)
		}
		for k := range fields {
			if k != "role" && k != "content" {
				return nil, fmt.Errorf("messages[%d]: field %q is not supported (plain-text role and content only)", i, k)
			}
		}
		for _, k := range []string{"role", "content"} {
			v, ok := fields[k]
			if !ok {
				return nil, fmt.Errorf("messages[%d]: no %q", i, k)
			}
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, fmt.Errorf("messages[%d]: %q is not a string (only plain-text content is supported)", i, k)
			}
			if k == "role" {
				out[i].Role = s
			} else {
				out[i].Content = s
			}
		}
	}
	return out, nil
}
