package ttnn

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
)

// NameMapFormat identifies a name map file.
const NameMapFormat = "ttquant-ttnn-names"

// NameMapVersion is the name map format version this package reads.
const NameMapVersion = 1

// ErrNameMap is wrapped by every error about a name map: unreadable JSON, a
// bad rule, a rule that matches no tensor, a tensor that no rule matches, two
// tensors mapped to one file.
var ErrNameMap = errors.New("name map")

// NameMap turns a checkpoint's tensor names into the cache names a tt-metal
// model passes to ttnn.as_tensor, and says how each file is laid out. The
// first rule whose pattern matches the whole tensor name decides. See
// docs/ttnn-export.md for the format.
type NameMap struct {
	Format      string `json:"format"`
	Version     int    `json:"version"`
	Description string `json:"description,omitempty"`
	Rules       []Rule `json:"rules"`

	sha256 string
	res    []*regexp.Regexp
}

// Rule is one name map rule.
type Rule struct {
	// Match is a regular expression (RE2) that must match the whole
	// tensor name.
	Match string `json:"match"`
	// Skip leaves the matched tensors out of the export.
	Skip bool `json:"skip,omitempty"`
	// Name is the cache name, ttnn's cache_file_name without the
	// `_dtype_…_layout_….tensorbin` suffix: $1 or ${1} insert Match's
	// groups; in a stacked rule with a group size, {group} inserts the
	// group number. It may contain '/' (a subdirectory of the output).
	Name string `json:"name,omitempty"`
	// Layout is TILE or ROW_MAJOR; empty means TILE for BFP tensors and
	// ROW_MAJOR for the others.
	Layout string `json:"layout,omitempty"`
	// DType, when set, is the ttnn data type the tensor must export as
	// (BFLOAT8_B, BFLOAT16, ...); a different stored format is an error.
	DType string `json:"dtype,omitempty"`
	// Transpose writes the transpose of the last two dimensions (the
	// [in, out] layout tt-metal models use for matmul weights). A BFP
	// tensor can only be written transposed if it was stored transposed
	// (orientation "transposed"), and only untransposed if stored "row":
	// moving the exponent groups would mean quantizing again.
	Transpose bool `json:"transpose,omitempty"`
	// Rank pads the shape with leading 1s to this rank (0: unchanged).
	Rank int `json:"rank,omitempty"`
	// Stack, when set, gathers the matched tensors that get the same Name
	// into one file, stacked along a new leading dimension in the order of
	// Stack.Index.
	Stack *Stack `json:"stack,omitempty"`
	// Optional rules may match no tensor; any other rule that matches
	// nothing is an error (the map does not fit the checkpoint).
	Optional bool `json:"optional,omitempty"`
}

// Stack says how tensors are stacked into one file.
type Stack struct {
	// Index is a template ($1, ${2}) giving each tensor's position, a
	// non-negative integer (typically the expert number).
	Index string `json:"index"`
	// GroupSize, when positive, puts indices [g·GroupSize, (g+1)·GroupSize)
	// into group g's file (named with {group}); otherwise all indices go to
	// one file. Positions in a file must be consecutive from the group's
	// first index.
	GroupSize int `json:"group_size,omitempty"`
}

// ParseNameMap parses and checks a name map: known fields only, the format
// and version, every pattern compiles, every non-skip rule names its file.
func ParseNameMap(data []byte) (*NameMap, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m NameMap
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNameMap, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrNameMap)
	}
	if m.Format != NameMapFormat {
		return nil, fmt.Errorf("%w: format %q, want %q", ErrNameMap, m.Format, NameMapFormat)
	}
	if m.Version != NameMapVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", ErrNameMap, m.Version, NameMapVersion)
	}
	if len(m.Rules) == 0 {
		return nil, fmt.Errorf("%w: no rules", ErrNameMap)
	}
	for i, r := range m.Rules {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: rule %d (%q): %s", ErrNameMap, i, r.Match, fmt.Sprintf(format, args...))
		}
		re, err := regexp.Compile(`^(?:` + r.Match + `)$`)
		if err != nil || r.Match == "" {
			return nil, bad("bad pattern: %v", err)
		}
		m.res = append(m.res, re)
		if r.Skip {
			if r.Name != "" || r.Stack != nil || r.Layout != "" || r.DType != "" || r.Transpose || r.Rank != 0 {
				return nil, bad("a skip rule takes no other field")
			}
			continue
		}
		if r.Name == "" {
			return nil, bad("no name")
		}
		if r.Layout != "" {
			if _, err := ParseLayout(r.Layout); err != nil {
				return nil, bad("%v", err)
			}
		}
		if r.DType != "" {
			if _, err := ParseDataType(r.DType); err != nil {
				return nil, bad("%v", err)
			}
		}
		if r.Rank < 0 || r.Rank > 8 {
			return nil, bad("rank %d (want 0 to 8)", r.Rank)
		}
		if strings.Contains(r.Name, "{group}") && (r.Stack == nil || r.Stack.GroupSize <= 0) {
			return nil, bad("{group} in the name needs stack.group_size")
		}
		if s := r.Stack; s != nil {
			if s.Index == "" {
				return nil, bad("stack.index is empty")
			}
			if s.GroupSize < 0 {
				return nil, bad("stack.group_size %d is negative", s.GroupSize)
			}
			if s.GroupSize > 0 && !strings.Contains(r.Name, "{group}") {
				return nil, bad("stack.group_size needs {group} in the name")
			}
		}
	}
	sum := sha256.Sum256(data)
	m.sha256 = hex.EncodeToString(sum[:])
	return &m, nil
}

// LoadNameMap reads and parses a name map file.
func LoadNameMap(path string) (*NameMap, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m, err := ParseNameMap(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// builtinMaps are the name maps built into the binary: names/*.json,
// each by its file name without ".json".
//
//go:embed names/*.json
var builtinMaps embed.FS

// BuiltinNameMaps lists the names of the built-in name maps.
func BuiltinNameMaps() []string {
	ents, _ := fs.ReadDir(builtinMaps, "names")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".json"))
	}
	slices.Sort(out)
	return out
}

// ErrUnknownNameMap is wrapped when a name map is neither a built-in name
// nor a file.
var ErrUnknownNameMap = errors.New("no such name map")

// OpenNameMap returns the built-in map of that name, or else reads the
// name map file at that path. A value that names neither (and does not
// look like a path: no separator, no .json) is an ErrUnknownNameMap error
// listing the built-in maps.
func OpenNameMap(nameOrPath string) (*NameMap, error) {
	if slices.Contains(BuiltinNameMaps(), nameOrPath) {
		data, err := builtinMaps.ReadFile(path.Join("names", nameOrPath+".json"))
		if err != nil {
			return nil, err
		}
		m, err := ParseNameMap(data)
		if err != nil {
			return nil, fmt.Errorf("built-in name map %s: %w", nameOrPath, err)
		}
		return m, nil
	}
	if _, err := os.Stat(nameOrPath); errors.Is(err, os.ErrNotExist) && !strings.ContainsRune(nameOrPath, os.PathSeparator) && !strings.HasSuffix(nameOrPath, ".json") {
		return nil, fmt.Errorf("%w %q: give a built-in map (%s) or a name map file", ErrUnknownNameMap, nameOrPath, strings.Join(BuiltinNameMaps(), ", "))
	}
	return LoadNameMap(nameOrPath)
}

// SHA256 returns the sha256 of the map's bytes as parsed.
func (m *NameMap) SHA256() string { return m.sha256 }

// match returns the index of the first rule matching name and its
// submatch indices.
func (m *NameMap) match(name string) (int, []int) {
	for i, re := range m.res {
		if sm := re.FindStringSubmatchIndex(name); sm != nil {
			return i, sm
		}
	}
	return -1, nil
}

func (m *NameMap) expand(i int, tmpl, name string, sm []int) string {
	return string(m.res[i].ExpandString(nil, tmpl, name, sm))
}

// validCacheName reports whether a cache name is a clean relative path.
func validCacheName(name string) bool {
	if name == "" || strings.HasPrefix(name, "/") || strings.ContainsAny(name, "\\\x00\n\r") {
		return false
	}
	for _, p := range strings.Split(name, "/") {
		if p == "" || p == "." || p == ".." {
			return false
		}
	}
	return true
}

// FileName is the name ttnn.as_tensor looks for:
// {cache name}_dtype_{DTYPE}_layout_{LAYOUT}.tensorbin.
func FileName(cacheName string, dt DataType, l Layout) string {
	return cacheName + "_dtype_" + dt.String() + "_layout_" + l.String() + Ext
}
