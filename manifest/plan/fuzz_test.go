package plan

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// globRegexp translates a brace-free glob into an anchored regular
// expression, independently of globMatch.
func globRegexp(g string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`^`)
	for _, c := range []byte(g) {
		switch c {
		case '*':
			b.WriteString(`(?s:.*)`)
		case '?':
			b.WriteString(`(?s:.)`)
		default:
			b.WriteString(regexp.QuoteMeta(string([]byte{c})))
		}
	}
	b.WriteString(`$`)
	return regexp.MustCompile(b.String())
}

// FuzzGlobMatch checks the glob matcher against a regular-expression
// translation on ASCII inputs.
func FuzzGlobMatch(f *testing.F) {
	f.Add("*.mlp.experts.*", "model.layers.0.mlp.experts.3.down_proj")
	f.Add("*a*b?c", "xxaYYbZc")
	f.Add("a**b", "ab")
	f.Add("?", "")
	f.Add("*x", "xxxxxxxxy")
	f.Add("a*a", "a")
	f.Add("ab?", "ab")
	f.Fuzz(func(t *testing.T, g, name string) {
		if len(g) > 64 || len(name) > 256 || strings.ContainsAny(g, "{},") || strings.HasPrefix(g, "re:") {
			return
		}
		for _, s := range []string{g, name} {
			for i := 0; i < len(s); i++ {
				if s[i] >= 0x80 {
					return // the matcher works on bytes, the regexp on runes
				}
			}
		}
		pt, err := compilePattern(g)
		if err != nil {
			t.Fatalf("compilePattern(%q): %v", g, err)
		}
		if got, want := pt.match(name), globRegexp(g).MatchString(name); got != want {
			t.Errorf("pattern %q matches %q = %v, regexp says %v", g, name, got, want)
		}
	})
}

// FuzzParsePlan checks that ParsePlan never panics and that every plan it
// accepts survives a save/load round trip unchanged.
func FuzzParsePlan(f *testing.F) {
	f.Add(`{"name":"x","rules":[{"pattern":"*","format":"bfp4_b","method":"gptq"}]}`)
	f.Add(`{"plan_version":1,"name":"y","rules":[{"pattern":"re:a|b","format":"AS_IS"},{"pattern":"{a,b}.c","format":"BFP8_B","axis":"output","tile":"16x32"}]}`)
	f.Add(`{"rules":[{"pattern":"a{","format":"BF16"}]}`)
	f.Add(`{"rules":null}`)
	f.Fuzz(func(t *testing.T, doc string) {
		p, err := ParsePlan([]byte(doc))
		if err != nil {
			return
		}
		b, err := p.MarshalPlan()
		if err != nil {
			t.Fatal(err)
		}
		q, err := ParsePlan(b)
		if err != nil {
			t.Fatalf("re-parsing a saved plan: %v\n%s", err, b)
		}
		if d := cmp.Diff(p, q); d != "" {
			t.Errorf("round trip changed the plan:\n%s", d)
		}
	})
}
