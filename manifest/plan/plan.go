package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/manifest"
)

// PlanVersion is the version of the plan file format Save writes and
// LoadPlan reads.
const PlanVersion = 1

// Rule is one line of a precision plan: tensors whose stored name matches
// Pattern are stored in Format, quantized with Method, with BFP exponent
// groups along Axis, in tiles of Tile.
//
// Pattern syntax: a glob over the whole stored tensor name where `*`
// matches any run of characters (dots included), `?` one character, and
// `{a,b,c}` one of the comma-separated alternatives; every other character
// is literal. A pattern starting with `re:` is instead a Go regular
// expression (RE2) that must match the whole name.
//
// Format is one of BFP8_b, BFP4_b, BFP2_b, BF16, F32, AS_IS (case does not
// matter; Validate gives the canonical spelling). Method is gptq or rtn for BFP formats (default rtn) and none
// otherwise (the default). Axis (input or output, default bfp.DefaultAxis) and
// Tile ("HxW", default 32x32) apply to BFP formats only.
type Rule struct {
	Pattern string                `json:"pattern"`
	Format  manifest.StoredFormat `json:"format"`
	Method  manifest.Method       `json:"method,omitempty"`
	Axis    bfp.Axis              `json:"axis,omitempty"`
	Tile    string                `json:"tile,omitempty"`
	// Note says why the rule exists; it is carried into reports only.
	Note string `json:"note,omitempty"`
}

// Plan is an ordered list of rules: the first rule whose pattern matches a
// stored tensor's name decides how it is stored. A tensor no rule matches
// is an error.
type Plan struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Rules       []Rule `json:"rules"`
}

// normalizeRule returns r with canonical spellings and defaults filled in,
// or an error naming the rule and the bad field.
func normalizeRule(i int, r Rule) (Rule, error) {
	bad := func(format string, args ...any) (Rule, error) {
		return Rule{}, fmt.Errorf("rule %d (pattern %q): %s", i+1, r.Pattern, fmt.Sprintf(format, args...))
	}
	if r.Pattern == "" {
		return bad("empty pattern")
	}
	if _, err := compilePattern(r.Pattern); err != nil {
		return bad("%v", err)
	}
	if strings.TrimSpace(string(r.Format)) == "" {
		return bad("no format (want BFP8_b, BFP4_b, BFP2_b, BF16, F32 or AS_IS)")
	}
	f, err := manifest.ParseStoredFormat(string(r.Format))
	if err != nil {
		return bad("%v", err)
	}
	r.Format = f
	m := manifest.Method(strings.ToLower(strings.TrimSpace(string(r.Method))))
	a := bfp.Axis(strings.ToLower(strings.TrimSpace(string(r.Axis))))
	if f.IsBFP() {
		switch m {
		case "":
			m = manifest.MethodRTN
		case manifest.MethodRTN, manifest.MethodGPTQ:
		default:
			return bad("method %q for %s (want gptq or rtn)", r.Method, f)
		}
		switch a {
		case "":
			a = bfp.DefaultAxis
		case bfp.AxisInput, bfp.AxisOutput:
		default:
			return bad("unknown axis %q (want input or output)", r.Axis)
		}
		tile := strings.TrimSpace(r.Tile)
		if tile == "" {
			tile = manifest.DefaultTile
		}
		t, err := bfp.ParseTile(tile)
		if err != nil {
			return bad("tile %q: %v", r.Tile, err)
		}
		r.Tile = t.String()
	} else {
		switch m {
		case "", manifest.MethodNone:
			m = manifest.MethodNone
		default:
			return bad("method %q needs a BFP format, not %s", r.Method, f)
		}
		if a != "" || strings.TrimSpace(r.Tile) != "" {
			return bad("axis and tile apply to BFP formats only, not %s", f)
		}
		r.Tile = ""
	}
	r.Method, r.Axis = m, a
	return r, nil
}

// Validate checks every rule and returns the plan with canonical spellings
// and defaults filled in (p itself is not modified).
func (p *Plan) Validate() (*Plan, error) {
	if p == nil {
		return nil, errors.New("plan: nil plan")
	}
	if len(p.Rules) == 0 {
		return nil, fmt.Errorf("plan %q has no rules", p.Name)
	}
	out := &Plan{Name: p.Name, Description: p.Description, Rules: make([]Rule, len(p.Rules))}
	for i, r := range p.Rules {
		nr, err := normalizeRule(i, r)
		if err != nil {
			return nil, fmt.Errorf("plan %q: %w", p.Name, err)
		}
		out.Rules[i] = nr
	}
	return out, nil
}

// planFile is the JSON document of a plan file.
type planFile struct {
	PlanVersion int    `json:"plan_version"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Rules       []Rule `json:"rules"`
}

// MarshalPlan returns the plan file bytes of p: indented JSON with a
// plan_version field, ending in a newline.
func (p *Plan) MarshalPlan() ([]byte, error) {
	b, err := json.MarshalIndent(planFile{PlanVersion: PlanVersion, Name: p.Name, Description: p.Description, Rules: p.Rules}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Save writes p to path as JSON (see MarshalPlan), replacing the file
// atomically.
func (p *Plan) Save(path string) error {
	b, err := p.MarshalPlan()
	if err != nil {
		return fmt.Errorf("plan %q: %w", p.Name, err)
	}
	_, err = atomicfile.WriteFile(path, b)
	return err
}

// ParsePlan decodes a plan file. Unknown fields, a plan_version other than
// PlanVersion (an absent one means PlanVersion) and invalid rules are
// errors; the result is validated and canonical.
func ParsePlan(data []byte) (*Plan, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var pf planFile
	if err := dec.Decode(&pf); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if dec.More() {
		return nil, errors.New("plan: trailing data after the JSON object")
	}
	if pf.PlanVersion != 0 && pf.PlanVersion != PlanVersion {
		return nil, fmt.Errorf("plan: plan_version %d, this build reads %d", pf.PlanVersion, PlanVersion)
	}
	return (&Plan{Name: pf.Name, Description: pf.Description, Rules: pf.Rules}).Validate()
}

// WithAxis returns a validated copy of p with every BFP rule's axis set to
// a (the plan's other rules, and p itself, unchanged). An axis other than
// input or output, and a plan without a BFP rule, are errors.
func (p *Plan) WithAxis(a bfp.Axis) (*Plan, error) {
	if err := a.Valid(); err != nil {
		return nil, err
	}
	v, err := p.Validate()
	if err != nil {
		return nil, err
	}
	n := 0
	for i := range v.Rules {
		if v.Rules[i].Format.IsBFP() {
			v.Rules[i].Axis = a
			n++
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("plan %q has no BFP rule: a block axis applies to BFP formats only", p.Name)
	}
	return v, nil
}

// LoadPlan reads and validates a plan file (JSON, see ParsePlan).
func LoadPlan(path string) (*Plan, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := ParsePlan(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if p.Name == "" {
		p.Name = path
	}
	return p, nil
}

// pattern is a compiled rule pattern: either a regular expression or a set
// of alternative globs made only of literals, `*` and `?`.
type pattern struct {
	re    *regexp.Regexp
	globs []glob
}

// glob is one brace-free alternative with its literal head and tail (the
// text before the first and after the last wildcard), checked first.
type glob struct {
	g, head, tail string
}

func newGlob(g string) glob {
	i := strings.IndexAny(g, "*?")
	if i < 0 {
		return glob{g: g, head: g}
	}
	j := strings.LastIndexAny(g, "*?")
	return glob{g: g, head: g[:i], tail: g[j+1:]}
}

func (p *pattern) match(name string) bool {
	if p.re != nil {
		return p.re.MatchString(name)
	}
	for _, g := range p.globs {
		if len(name) >= len(g.head)+len(g.tail) && strings.HasPrefix(name, g.head) && strings.HasSuffix(name, g.tail) &&
			globMatch(g.g, name) {
			return true
		}
	}
	return false
}

// maxGlobAlternatives bounds the expansion of {a,b} groups.
const maxGlobAlternatives = 4096

// compilePattern parses a rule pattern (see Rule).
func compilePattern(p string) (*pattern, error) {
	if re, ok := strings.CutPrefix(p, "re:"); ok {
		r, err := regexp.Compile(`^(?:` + re + `)$`)
		if err != nil {
			return nil, fmt.Errorf("bad regular expression: %v", err)
		}
		return &pattern{re: r}, nil
	}
	globs := []string{""}
	for len(p) > 0 {
		open := strings.IndexAny(p, "{}")
		if open < 0 {
			for i := range globs {
				globs[i] += p
			}
			break
		}
		if p[open] == '}' {
			return nil, errors.New("unbalanced } in glob")
		}
		end := strings.IndexAny(p[open+1:], "{}")
		if end < 0 || p[open+1+end] == '{' {
			if end < 0 {
				return nil, errors.New("unbalanced { in glob")
			}
			return nil, errors.New("nested { in glob")
		}
		lit, alts := p[:open], strings.Split(p[open+1:open+1+end], ",")
		if len(globs)*len(alts) > maxGlobAlternatives {
			return nil, fmt.Errorf("glob expands to more than %d alternatives", maxGlobAlternatives)
		}
		next := make([]string, 0, len(globs)*len(alts))
		for _, g := range globs {
			for _, a := range alts {
				next = append(next, g+lit+a)
			}
		}
		globs = next
		p = p[open+1+end+1:]
	}
	pt := &pattern{}
	for _, g := range globs {
		pt.globs = append(pt.globs, newGlob(g))
	}
	return pt, nil
}

// globMatch reports whether name matches glob g made of literals, `*` (any
// run) and `?` (one byte). It backtracks only to the last star, so it runs
// in O(len(g)·len(name)) at worst.
func globMatch(g, name string) bool {
	gi, ni := 0, 0
	star, mark := -1, 0
	for ni < len(name) {
		switch {
		case gi < len(g) && (g[gi] == '?' || g[gi] == name[ni]) && g[gi] != '*':
			gi++
			ni++
		case gi < len(g) && g[gi] == '*':
			star, mark = gi, ni
			gi++
		case star >= 0:
			mark++
			ni = mark
			gi = star + 1
		default:
			return false
		}
	}
	for gi < len(g) && g[gi] == '*' {
		gi++
	}
	return gi == len(g)
}

// Match returns the index of the first rule of p whose pattern matches
// name, or -1. Invalid patterns never match (Validate reports them).
func (p *Plan) Match(name string) int {
	for i, r := range p.Rules {
		pt, err := compilePattern(r.Pattern)
		if err == nil && pt.match(name) {
			return i
		}
	}
	return -1
}

// matcher caches compiled patterns of a validated plan.
type matcher struct{ pats []*pattern }

func newMatcher(p *Plan) (*matcher, error) {
	m := &matcher{pats: make([]*pattern, len(p.Rules))}
	for i, r := range p.Rules {
		pt, err := compilePattern(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("plan %q rule %d (pattern %q): %v", p.Name, i+1, r.Pattern, err)
		}
		m.pats[i] = pt
	}
	return m, nil
}

func (m *matcher) match(name string) int {
	for i, pt := range m.pats {
		if pt.match(name) {
			return i
		}
	}
	return -1
}
