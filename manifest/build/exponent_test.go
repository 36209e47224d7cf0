package build

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
)

// TestExponentRuleNames: the manifest's spellings of the rules are
// package gptq's, less the packer's own (recorded as none).
func TestExponentRuleNames(t *testing.T) {
	var want []string
	for _, r := range gptq.ExponentRules() {
		if p := exponentParam(r); p != "" {
			want = append(want, p)
		}
		back, err := exponentOf(exponentParam(r))
		if err != nil || back != r {
			t.Errorf("rule %v: recorded as %q, read back as %v (%v)", r, exponentParam(r), back, err)
		}
	}
	if !slices.Equal(want, manifest.BFPExponentRules) {
		t.Errorf("manifest.BFPExponentRules = %q, gptq's rules give %q", manifest.BFPExponentRules, want)
	}
	if exponentParam(0) != "" || exponentParam(gptq.ExpMax) != "" {
		t.Error("the default rule is recorded")
	}
}

// TestExponentRuleRefused: an invalid rule, a rule for a plan without BFP
// tensors, two different rules, and convert's calibration store without
// the weighted rule are refused before anything is written.
func TestExponentRuleRefused(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	bf16, err := plan.ParsePlan([]byte(`{"plan_version": 1, "name": "bf16", "rules": [{"pattern": "*", "format": "BF16"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, store := tinyFixture(t)
	cases := []struct {
		name string
		mod  func(*BuildOptions)
		want string
	}{
		{"invalid rule", func(o *BuildOptions) { o.Exponent = gptq.ExponentRule(9) }, "invalid exponent rule"},
		{"no BFP tensor", func(o *BuildOptions) { o.Exponent, o.Plan = gptq.ExpTTMetal, bf16 }, "stores no tensor in a BFP format"},
		{"two rules", func(o *BuildOptions) {
			g := gptq.DefaultOptions()
			g.Exponent = gptq.ExpTTMetal
			o.Exponent, o.GPTQOptions = gptq.ExpSearch, &g
		}, "set the rule once"},
		{"store without search", func(o *BuildOptions) { o.Exponent, o.Calib = gptq.ExpTTMetal, store }, "only weights the exponent search"},
	}
	for _, c := range cases {
		o := convertOpts(t, out, 1)
		c.mod(&o)
		_, err := Convert(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("%s: %s was created", c.name, out)
		}
	}
	o := convertOpts(t, out, 1)
	o.Calib = store
	if _, err := Convert(context.Background(), o); !errors.Is(err, ErrConvertCalib) {
		t.Errorf("a store without a rule: %v, want ErrConvertCalib", err)
	}
	if o.Plan = bf16; o.Validate() != nil {
		t.Errorf("the default rule refused for a plan without BFP tensors: %v", o.Validate())
	}
}

// TestExponentRulesBuildAndVerify: convert with each rule records it in
// the manifest (nothing for the default, whose bytes are those of a build
// that does not name it), gives each its own identity, and verifies
// against the source; verification re-applies the recorded rule, so a
// manifest whose rule is removed fails.
func TestExponentRulesBuildAndVerify(t *testing.T) {
	ids := map[string]gptq.ExponentRule{}
	dirs := map[gptq.ExponentRule]string{}
	for _, r := range gptq.ExponentRules() {
		dir := filepath.Join(t.TempDir(), r.String())
		o := convertOpts(t, dir, 2)
		o.Exponent = r
		res, err := Convert(context.Background(), o)
		if err != nil {
			t.Fatalf("%v: %v", r, err)
		}
		if got := res.Manifest.TTQuant.Options.BFPExponent; got != exponentParam(r) {
			t.Errorf("%v: manifest records bfp_exponent %q", r, got)
		}
		if prev, dup := ids[res.Identity]; dup {
			t.Errorf("rules %v and %v give one identity %s", prev, r, res.Identity)
		}
		ids[res.Identity] = r
		dirs[r] = dir
		if rep := mustVerify(t, dir, VerifyOptions{Source: o.Source}); !rep.OK {
			t.Errorf("%v: verify against the source: %v", r, rep.Failures)
		}
	}
	sameTree(t, "the default rule named and not", reference(t, "convert"), dirs[gptq.ExpMax])
	if bytes.Contains(readManifestBytes(t, dirs[gptq.ExpMax]), []byte("bfp_exponent")) {
		t.Error("the default build's manifest names the rule")
	}
	src, _ := tinyFixture(t)
	for _, r := range []gptq.ExponentRule{gptq.ExpTTMetal, gptq.ExpSearch} {
		dir := filepath.Join(t.TempDir(), "forged")
		copyTree(t, dirs[r], dir)
		m, err := manifest.DecodeManifest(readManifestBytes(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		m.TTQuant.Options.BFPExponent = ""
		rewriteManifest(t, dir, m)
		rep := mustVerify(t, dir, VerifyOptions{Source: src})
		if !slices.ContainsFunc(rep.Failures, func(f manifest.Failure) bool {
			return strings.Contains(f.What, "RTN tensor is not what") && strings.Contains(f.What, "exponent rule max")
		}) {
			t.Errorf("%v build verified as max: ok=%v %v", r, rep.OK, rep.Failures)
		}
	}
	dir := filepath.Join(t.TempDir(), "unknown")
	copyTree(t, dirs[gptq.ExpSearch], dir)
	m, err := manifest.DecodeManifest(readManifestBytes(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	m.TTQuant.Options.BFPExponent = "min"
	rewriteManifest(t, dir, m)
	wantFailure(t, mustVerify(t, dir, VerifyOptions{}), manifest.ManifestName, "bfp_exponent", "min")
}

// TestWeightedRounding: with calibration rows the search rule weights the
// rounding of the tensors outside GPTQ by their input Hessian's diagonal,
// in a GPTQ store build and in convert with the store: some tensor with a
// calibration site differs from the unweighted build, tensors without a
// site (the LM head) do not, and both verify. The builds are on the input
// axis: on the output axis a group lies in one input column, whose values
// share one weight, so weighting changes nothing there
// (TestWeightedRoundingOutputAxis).
func TestWeightedRounding(t *testing.T) {
	src, store := tinyFixture(t)
	inputAxis := func(o *BuildOptions) {
		p, err := o.Plan.WithAxis(bfp.AxisInput)
		if err != nil {
			t.Fatal(err)
		}
		o.Plan = p
	}
	unweighted := filepath.Join(t.TempDir(), "u")
	o := convertOpts(t, unweighted, 2)
	inputAxis(&o)
	o.Exponent = gptq.ExpSearch
	if _, err := Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	conv := filepath.Join(t.TempDir(), "c")
	o = convertOpts(t, conv, 2)
	inputAxis(&o)
	o.Exponent, o.Calib, o.AllowSyntheticCalibration = gptq.ExpSearch, store, true
	if _, err := Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	gq := filepath.Join(t.TempDir(), "g")
	og := gptq1Opts(t, gq, 2)
	inputAxis(&og)
	og.Exponent = gptq.ExpSearch
	if _, err := GPTQ(context.Background(), og); err != nil {
		t.Fatal(err)
	}
	u := tensorBytes(t, unweighted)
	for _, dir := range []string{conv, gq} {
		if rep := mustVerify(t, dir, VerifyOptions{Source: src}); !rep.OK {
			t.Errorf("%s: verify: %v", filepath.Base(dir), rep.Failures)
		}
		got := tensorBytes(t, dir)
		differ := 0
		for name, b := range got {
			if strings.Contains(name, "self_attn.") && !bytes.Equal(b, u[name]) {
				differ++
			}
		}
		if differ == 0 {
			t.Errorf("%s: no attention projection is rounded differently with weights", filepath.Base(dir))
		}
		if !bytes.Equal(got["lm_head.weight"], u["lm_head.weight"]) {
			t.Errorf("%s: the LM head (no calibration site) is weighted", filepath.Base(dir))
		}
	}
}

// TestWeightedRoundingOutputAxis: on the output axis (the presets') a BFP
// group is 16 outputs of one input column, all with that column's weight,
// so convert with the store and the weighted search stores exactly the
// bytes of the unweighted search.
func TestWeightedRoundingOutputAxis(t *testing.T) {
	_, store := tinyFixture(t)
	unweighted := filepath.Join(t.TempDir(), "u")
	o := convertOpts(t, unweighted, 2)
	o.Exponent = gptq.ExpSearch
	if _, err := Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	conv := filepath.Join(t.TempDir(), "c")
	o = convertOpts(t, conv, 2)
	o.Exponent, o.Calib, o.AllowSyntheticCalibration = gptq.ExpSearch, store, true
	if _, err := Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	u, got := tensorBytes(t, unweighted), tensorBytes(t, conv)
	n := 0
	for name, b := range got {
		if strings.Contains(name, "self_attn.") {
			n++
			if !bytes.Equal(b, u[name]) {
				t.Errorf("%s: weighting changed an output-axis tensor", name)
			}
		}
	}
	if n == 0 {
		t.Fatal("no attention projection")
	}
}

// tensorBytes returns every stored tensor's bytes by name.
func tensorBytes(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	m, err := manifest.DecodeManifest(readManifestBytes(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	files := readTree(t, dir)
	out := map[string][]byte{}
	for _, te := range m.Tensors {
		f := files[te.File]
		out[te.Name] = f[te.Offset : te.Offset+te.Length]
	}
	return out
}

// TestSequentialWeightedVerifies: a sequential build with the search rule
// decides the weighted tensors at their stage (the forward pass and the
// written checkpoint see the same bytes) and verifies.
func TestSequentialWeightedVerifies(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "seq")
	o := seqOpts(t, dir, 2)
	o.Exponent, o.Asymmetric = gptq.ExpSearch, true
	res, err := GPTQ(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Manifest.TTQuant.Options.BFPExponent != "search" {
		t.Errorf("bfp_exponent %q", res.Manifest.TTQuant.Options.BFPExponent)
	}
	if rep := mustVerify(t, dir, VerifyOptions{Source: o.Source}); !rep.OK {
		t.Errorf("verify: %v", rep.Failures)
	}
	ref, _ := seqReference(t)
	a, b := tensorBytes(t, ref), tensorBytes(t, dir)
	differ := 0
	for name, v := range b {
		if strings.Contains(name, "self_attn.") && !bytes.Equal(v, a[name]) {
			differ++
		}
	}
	if differ == 0 {
		t.Error("no attention projection differs from the max rule's build")
	}
}
