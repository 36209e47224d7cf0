package dataset

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Kind is the kind of a data source. The zero value is invalid.
type Kind uint8

const (
	kindInvalid Kind = iota
	// KindJSONL: a JSON-lines file, one record per non-blank line.
	KindJSONL
	// KindText: a plain UTF-8 text file, one record.
	KindText
	// KindDir: a directory tree of text files (source code), one record
	// per file.
	KindDir
)

func (k Kind) String() string {
	switch k {
	case KindJSONL:
		return "jsonl"
	case KindText:
		return "txt"
	case KindDir:
		return "dir"
	}
	return "invalid"
}

// MarshalText writes the kind's name.
func (k Kind) MarshalText() ([]byte, error) {
	if k == kindInvalid {
		return nil, fmt.Errorf("dataset: invalid source kind")
	}
	return []byte(k.String()), nil
}

// UnmarshalText reads a kind name.
func (k *Kind) UnmarshalText(b []byte) error {
	v, ok := kindOf(string(b))
	if !ok {
		return fmt.Errorf("unknown source kind %q (jsonl, txt, dir)", b)
	}
	*k = v
	return nil
}

func kindOf(s string) (Kind, bool) {
	switch s {
	case "jsonl":
		return KindJSONL, true
	case "txt":
		return KindText, true
	case "dir":
		return KindDir, true
	}
	return kindInvalid, false
}

// DefaultExtensions are the file name endings a dir source reads when its
// Extensions are not given.
var DefaultExtensions = []string{
	".go", ".py", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".java", ".js", ".ts",
	".sh", ".rb", ".swift", ".kt", ".scala", ".lua", ".pl", ".sql", ".md", ".txt",
}

// Source is one input of a data spec.
type Source struct {
	// Label is the corpus label of the source's records ("code", "prose",
	// "chat"...). Empty only for JSONL sources whose records carry a
	// "corpus" string field, which is then the label of each record.
	Label string `json:"label,omitempty"`
	Kind  Kind   `json:"kind"`
	// Path of the file or directory; relative paths in a spec file are
	// relative to the spec file's directory. Empty in a content-only
	// provenance (Provenance.Content).
	Path string `json:"path,omitempty"`
	// Weight is the source's share of each set's sequences, relative to
	// the other sources' weights (docs/data.md, "Mixture"). Zero means 1.
	Weight float64 `json:"weight,omitempty"`
	// Extensions are the file name endings a dir source reads (default
	// DefaultExtensions). Hidden files and directories are skipped.
	Extensions []string `json:"extensions,omitempty"`
	// SkipInvalid makes a dir source skip files that are not UTF-8 text
	// (invalid UTF-8 or a NUL byte) instead of failing; skipped files are
	// listed in the provenance.
	SkipInvalid bool `json:"skip_invalid,omitempty"`
}

func (s Source) weight() float64 {
	if s.Weight == 0 {
		return 1
	}
	return s.Weight
}

// Spec is a parsed data spec: the sources, and options when the spec was a
// file that gave them.
type Spec struct {
	Sources []Source `json:"sources"`
	// Options is nil for an inline spec (the command's flags give them).
	Options *Options `json:"-"`
	// Text is the spec as given (inline string or file path).
	Text string `json:"-"`
}

var labelRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// ParseSpec reads a data spec: the path of a JSON spec file (a name ending
// in .json), or an inline list of sources
//
//	LABEL=[KIND:]PATH[:WEIGHT],...
//
// KIND is jsonl, txt or dir; without it a directory is dir, a name ending in
// .jsonl is jsonl and one ending in .txt is txt. "LABEL=" may be left out
// for a JSONL source whose records carry a "corpus" field. See docs/data.md.
func ParseSpec(spec string) (*Spec, error) {
	if spec == "" {
		return nil, fmt.Errorf("dataset: empty data spec")
	}
	if strings.HasSuffix(spec, ".json") && !strings.Contains(spec, ",") {
		return parseSpecFile(spec)
	}
	s := &Spec{Text: spec}
	for i, ent := range strings.Split(spec, ",") {
		src, err := parseEntry(ent)
		if err != nil {
			return nil, fmt.Errorf("dataset: data spec entry %d %q: %w", i+1, ent, err)
		}
		s.Sources = append(s.Sources, src)
	}
	if err := s.check(""); err != nil {
		return nil, err
	}
	return s, nil
}

func parseEntry(ent string) (Source, error) {
	var src Source
	if ent == "" {
		return src, fmt.Errorf("empty entry")
	}
	rest := ent
	if l, r, ok := strings.Cut(ent, "="); ok {
		src.Label, rest = l, r
	}
	if k, r, ok := strings.Cut(rest, ":"); ok {
		if kind, known := kindOf(k); known {
			src.Kind, rest = kind, r
		}
	}
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		if w, err := strconv.ParseFloat(rest[i+1:], 64); err == nil {
			if !(w > 0) || w > 1e6 {
				return src, fmt.Errorf("weight %s: want a number in (0, 1e6]", rest[i+1:])
			}
			src.Weight, rest = w, rest[:i]
		}
	}
	if rest == "" {
		return src, fmt.Errorf("no path")
	}
	src.Path = rest
	if src.Kind == kindInvalid {
		k, err := inferKind(rest)
		if err != nil {
			return src, err
		}
		src.Kind = k
	}
	return src, nil
}

func inferKind(path string) (Kind, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return KindDir, nil
	}
	switch {
	case strings.HasSuffix(path, ".jsonl"):
		return KindJSONL, nil
	case strings.HasSuffix(path, ".txt"):
		return KindText, nil
	}
	return kindInvalid, fmt.Errorf("cannot tell what %s holds: write jsonl:, txt: or dir: before it", path)
}

// specFile is the JSON form of a spec file.
type specFile struct {
	Sources      []Source    `json:"sources"`
	Calibration  *SetOptions `json:"calibration"`
	Evaluation   *SetOptions `json:"evaluation"`
	EvalFraction float64     `json:"eval_fraction"`
	Seed         uint64      `json:"seed"`
	Separator    string      `json:"separator"`
}

func parseSpecFile(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dataset: data spec: %w", err)
	}
	var f specFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("dataset: data spec %s: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("dataset: data spec %s: data after the JSON object", path)
	}
	s := &Spec{Text: path, Sources: f.Sources}
	base := filepath.Dir(path)
	for i := range s.Sources {
		if p := s.Sources[i].Path; p != "" && !filepath.IsAbs(p) {
			s.Sources[i].Path = filepath.Join(base, p)
		}
	}
	opt := Options{EvalFraction: f.EvalFraction, Seed: f.Seed, Separator: f.Separator}
	if f.Calibration != nil {
		opt.Calibration = *f.Calibration
	}
	if f.Evaluation != nil {
		opt.Evaluation = *f.Evaluation
	}
	s.Options = &opt
	if err := s.check(path); err != nil {
		return nil, err
	}
	return s, nil
}

// check validates the sources (not their files).
func (s *Spec) check(file string) error {
	where := "data spec"
	if file != "" {
		where = "data spec " + file
	}
	if len(s.Sources) == 0 {
		return fmt.Errorf("dataset: %s: no sources", where)
	}
	for i, src := range s.Sources {
		switch {
		case src.Label != "" && !labelRE.MatchString(src.Label):
			return fmt.Errorf("dataset: %s: source %d: label %q: use letters, digits, '_', '-' and '.'", where, i+1, src.Label)
		case src.Label == "" && src.Kind != KindJSONL:
			return fmt.Errorf("dataset: %s: source %d (%s): a label is required (only JSONL records can carry their own \"corpus\")", where, i+1, src.Path)
		case src.Kind == kindInvalid:
			return fmt.Errorf("dataset: %s: source %d: kind missing (jsonl, txt, dir)", where, i+1)
		case src.Path == "":
			return fmt.Errorf("dataset: %s: source %d: path missing", where, i+1)
		case src.Weight < 0 || src.Weight > 1e6 || src.Weight != src.Weight:
			return fmt.Errorf("dataset: %s: source %d: weight %v: want a number in (0, 1e6]", where, i+1, src.Weight)
		case src.Kind != KindDir && (len(src.Extensions) > 0 || src.SkipInvalid):
			return fmt.Errorf("dataset: %s: source %d: extensions and skip_invalid apply to dir sources only", where, i+1)
		}
	}
	return nil
}
