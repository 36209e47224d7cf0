package plan

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/safetensors"
)

func TestGlobPatterns(t *testing.T) {
	cases := []struct {
		pattern, name string
		want          bool
	}{
		{"lm_head.weight", "lm_head.weight", true},
		{"lm_head.weight", "lm_head.weightx", false},
		{"lm_head.weight", "xlm_head.weight", false},
		{"lm_head?weight", "lm_head.weight", true},
		{"*norm*", "model.language_model.layers.0.input_layernorm.weight", true},
		{"*norm*", "mtp.pre_fc_norm_hidden.weight", true},
		{"*norm*", "model.language_model.layers.0.linear_attn.in_proj_z.weight", false},
		{"*.mlp.experts.*", "mtp.layers.0.mlp.experts.255.down_proj", true},
		{"*.mlp.experts.*", "model.layers.0.mlp.experts", false},
		{"*.self_attn.{q,k,v,o}_proj.weight", "model.layers.3.self_attn.o_proj.weight", true},
		{"*.self_attn.{q,k,v,o}_proj.weight", "model.layers.3.self_attn.x_proj.weight", false},
		{"*.{a,b}.{c,d}", "x.b.c", true},
		{"*.{a,b}.{c,d}", "x.b.e", false},
		{"*a*b*c", "aXbYc", true},
		{"*a*b*c", "aXbYcZ", false},
		{"**", "", true},
		{"", "", true},
		{"re:model\\.layers\\.[0-9]+\\.mlp\\..*", "model.layers.12.mlp.gate.weight", true},
		{"re:layers", "model.layers.0", false}, // anchored
		{"re:a|b", "ab", false},                // the alternation is anchored as a whole
	}
	for _, c := range cases {
		pt, err := compilePattern(c.pattern)
		if err != nil {
			t.Errorf("compile %q: %v", c.pattern, err)
			continue
		}
		if got := pt.match(c.name); got != c.want {
			t.Errorf("%q matches %q = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
	for _, bad := range []string{"a{b", "a}b", "{a{b}}", "re:(", "{a,b}{c,d}{e,f}{g,h}{i,j}{k,l}{m,n}{o,p}{q,r}{s,t}{u,v}{w,x}{y,z}"} {
		if _, err := compilePattern(bad); err == nil {
			t.Errorf("pattern %q accepted", bad)
		}
	}
}

func TestRuleOrder(t *testing.T) {
	specific := Rule{Pattern: "*.mlp.experts.0.*", Format: "BFP8_B"}
	general := Rule{Pattern: "*.mlp.experts.*", Format: "BFP4_B", Method: "gptq"}
	name := "model.layers.1.mlp.experts.0.down_proj"
	p := &Plan{Name: "t", Rules: []Rule{specific, general}}
	if got := p.Match(name); got != 0 {
		t.Errorf("specific first: rule %d matched, want 0", got)
	}
	if got := p.Match("model.layers.1.mlp.experts.1.down_proj"); got != 1 {
		t.Errorf("other expert: rule %d, want 1", got)
	}
	p = &Plan{Name: "t", Rules: []Rule{general, specific}}
	if got := p.Match(name); got != 0 {
		t.Errorf("general first: rule %d matched, want 0 (the first match wins)", got)
	}
	if got := p.Match("lm_head.weight"); got != -1 {
		t.Errorf("unmatched name: rule %d", got)
	}

	// The same order decides a resolved plan: expert 0 of every block BFP8.
	m := microModel(t, testmodel.Default)
	r, err := (&Plan{Name: "order", Rules: append([]Rule{specific, general}, mustPreset(t, PresetQwen36MoE).Rules...)}).Resolve(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, pt := range r.Tensors {
		if !pt.Role.IsExpert() {
			continue
		}
		want := manifest.StoreBFP4
		if pt.Expert == 0 {
			want = manifest.StoreBFP8
		}
		if pt.Format != want {
			t.Errorf("%s: %s, want %s", pt.Name, pt.Format, want)
		}
	}
}

// TestPresetAxisAndWithAxis: every BFP rule of every preset is on the
// output axis (the layout tt-metal's linear reads) and its description
// says so; WithAxis moves every BFP rule, and only those, to the axis
// asked for without touching the plan it is called on; a bad axis, and an
// axis for a plan without BFP rules, are errors.
func TestPresetAxisAndWithAxis(t *testing.T) {
	for _, n := range PresetNames() {
		p, err := Preset(n)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(p.Description, PresetRuntime) {
			t.Errorf("%s: the description does not say the runtime layout: %q", n, p.Description)
		}
		nBFP := 0
		for _, r := range p.Rules {
			if r.Format.IsBFP() {
				nBFP++
				if r.Axis != bfp.AxisOutput {
					t.Errorf("%s: rule %q on the %s axis", n, r.Pattern, r.Axis)
				}
			}
		}
		if nBFP == 0 {
			t.Errorf("%s: no BFP rule", n)
		}
		in, err := p.WithAxis(bfp.AxisInput)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range in.Rules {
			want := p.Rules[i]
			if want.Format.IsBFP() {
				want.Axis = bfp.AxisInput
			}
			if r != want {
				t.Errorf("%s --axis input: rule %d is %+v, want %+v", n, i+1, r, want)
			}
		}
		for _, r := range p.Rules {
			if r.Format.IsBFP() && r.Axis != bfp.AxisOutput {
				t.Errorf("%s: WithAxis changed the plan it was called on (rule %q)", n, r.Pattern)
			}
		}
		if _, err := p.WithAxis("rows"); err == nil {
			t.Errorf("%s: WithAxis(rows) accepted", n)
		}
	}
	lossless := &Plan{Name: "kept", Rules: []Rule{{Pattern: "*", Format: "AS_IS"}}}
	if _, err := lossless.WithAxis(bfp.AxisInput); err == nil || !strings.Contains(err.Error(), "no BFP rule") {
		t.Errorf("WithAxis of a plan without BFP rules: %v", err)
	}
}

func TestRuleValidation(t *testing.T) {
	good, err := (&Plan{Name: "p", Rules: []Rule{
		{Pattern: "a", Format: "bfp4_b"},
		{Pattern: "b", Format: "BFP8_b", Method: "GPTQ", Axis: "Input", Tile: "16x32"},
		{Pattern: "c", Format: "as_is"},
		{Pattern: "d", Format: "f32", Method: "none"},
	}}).Validate()
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		// No axis: DefaultAxis, the output axis tt-metal's linear reads.
		{Pattern: "a", Format: manifest.StoreBFP4, Method: manifest.MethodRTN, Axis: bfp.AxisOutput, Tile: "32x32"},
		{Pattern: "b", Format: manifest.StoreBFP8, Method: manifest.MethodGPTQ, Axis: bfp.AxisInput, Tile: "16x32"},
		{Pattern: "c", Format: manifest.StoreAsIs, Method: manifest.MethodNone},
		{Pattern: "d", Format: manifest.StoreF32, Method: manifest.MethodNone},
	}
	if d := cmp.Diff(want, good.Rules); d != "" {
		t.Errorf("normalised rules (-want +got):\n%s", d)
	}
	bad := []struct {
		rule Rule
		msg  string
	}{
		{Rule{Pattern: "", Format: "BF16"}, "empty pattern"},
		{Rule{Pattern: "x", Format: "INT4"}, "unknown format"},
		{Rule{Pattern: "x"}, "no format"},
		{Rule{Pattern: "x", Format: "BF16", Method: "gptq"}, "needs a BFP format"},
		{Rule{Pattern: "x", Format: "BFP4_B", Method: "awq"}, "method"},
		{Rule{Pattern: "x", Format: "BFP4_B", Axis: "rows"}, "axis"},
		{Rule{Pattern: "x", Format: "BFP4_B", Tile: "33x32"}, "tile"},
		{Rule{Pattern: "x", Format: "AS_IS", Tile: "32x32"}, "BFP formats only"},
		{Rule{Pattern: "x{", Format: "AS_IS"}, "unbalanced"},
	}
	for _, b := range bad {
		_, err := (&Plan{Name: "p", Rules: []Rule{{Pattern: "ok", Format: "BF16"}, b.rule}}).Validate()
		if err == nil || !strings.Contains(err.Error(), b.msg) || !strings.Contains(err.Error(), "rule 2") {
			t.Errorf("rule %+v: error %v, want one naming rule 2 and %q", b.rule, err, b.msg)
		}
	}
	if _, err := (&Plan{Name: "empty"}).Validate(); err == nil {
		t.Error("a plan without rules validated")
	}
}

func TestPlanJSONRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, name := range PresetNames() {
		p := mustPreset(t, name)
		path := filepath.Join(dir, name+".json")
		if err := p.Save(path); err != nil {
			t.Fatal(err)
		}
		q, err := LoadPlan(path)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(p, q); d != "" {
			t.Errorf("%s: round trip (-saved +loaded):\n%s", name, d)
		}
		b1, _ := p.MarshalPlan()
		b2, _ := q.MarshalPlan()
		if !bytes.Equal(b1, b2) {
			t.Errorf("%s: re-encoding differs", name)
		}
		if !bytes.Contains(b1, []byte(`"plan_version": 1`)) {
			t.Errorf("%s: plan file lacks plan_version", name)
		}
	}
	// A hand-written plan in loose spelling loads canonical.
	hand := `{"name": "mine", "rules": [
		{"pattern": "*.mlp.experts.*", "format": "bfp4_b", "method": "gptq"},
		{"pattern": "re:.*", "format": "as_is"}]}`
	p, err := ParsePlan([]byte(hand))
	if err != nil {
		t.Fatal(err)
	}
	if p.Rules[0].Format != manifest.StoreBFP4 || p.Rules[0].Tile != "32x32" || p.Rules[1].Method != manifest.MethodNone {
		t.Errorf("hand-written plan = %+v", p.Rules)
	}
	for _, bad := range []struct{ doc, msg string }{
		{`{"name":"x","rules":[{"pattern":"a","format":"BF16","fromat":"x"}]}`, "unknown field"},
		{`{"plan_version":2,"name":"x","rules":[{"pattern":"a","format":"BF16"}]}`, "plan_version 2"},
		{`{"name":"x","rules":[]}`, "no rules"},
		{`{"name":"x","rules":[{"pattern":"a","format":"BF16"}]} {}`, "trailing"},
		{`[1,2]`, "cannot unmarshal"},
	} {
		if _, err := ParsePlan([]byte(bad.doc)); err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("ParsePlan(%s) = %v, want an error containing %q", bad.doc, err, bad.msg)
		}
	}
	if _, err := LoadPlan(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("LoadPlan of a missing file succeeded")
	}
	if _, err := Preset("qwen4"); !errors.Is(err, ErrUnknownPreset) || !strings.Contains(err.Error(), PresetQwen36MoE) || !strings.Contains(err.Error(), `"qwen4"`) {
		t.Errorf("unknown preset error %v should list the known ones", err)
	}
}

func mustPreset(t testing.TB, name string) *Plan {
	t.Helper()
	p, err := Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// replicaModel writes the sparse 35B shape replica into a temporary
// directory (headers only, a few milliseconds) and opens it.
func replicaModel(tb testing.TB) *safetensors.Model {
	tb.Helper()
	dir := tb.TempDir()
	if err := testmodel.WriteReplica35B(dir); err != nil {
		tb.Fatal(err)
	}
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}

func tinyModel(t testing.TB, v testmodel.Variant) *safetensors.Model {
	t.Helper()
	return generatedModel(t, testmodel.Tiny(), v)
}

// microModel is tinyModel with the smaller Micro profile, for tests that
// need the structure but not the tiny model's dimensions.
func microModel(t testing.TB, v testmodel.Variant) *safetensors.Model {
	t.Helper()
	return generatedModel(t, testmodel.Micro(), v)
}

func generatedModel(t testing.TB, cfg testmodel.Config, v testmodel.Variant) *safetensors.Model {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, cfg, v); err != nil {
		t.Fatal(err)
	}
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestPresetsOnReplica applies every preset to every tensor of the 35B
// shape replica.
func TestPresetsOnReplica(t *testing.T) {
	m := replicaModel(t)
	if m.Len() != 712 {
		t.Fatalf("replica has %d tensors, want 712", m.Len())
	}
	// 712 sources; 82 fused expert tensors (41 blocks × 2) become 41 × 512.
	const wantStored = 712 - 82 + 41*512
	for _, name := range PresetNames() {
		t.Run(name, func(t *testing.T) {
			r, err := mustPreset(t, name).Resolve(m)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Tensors) != wantStored || r.SourceTensors != 712 {
				t.Errorf("%d stored tensors from %d sources, want %d from 712", len(r.Tensors), r.SourceTensors, wantStored)
			}
			if r.NumLayers != 40 || r.NumMTPLayers != 1 || r.Experts != 256 {
				t.Errorf("layers %d, mtp %d, experts %d", r.NumLayers, r.NumMTPLayers, r.Experts)
			}
			if r.ExpertFiles != 1312 { // (40 + 1 MTP) × 16 groups × {gate_up, down}
				t.Errorf("expert files %d, want 1312", r.ExpertFiles)
			}
			for _, pt := range r.Tensors {
				lossless := pt.Format.Lossless(pt.SourceDType)
				if (pt.Role.MustStayLossless() || pt.Role == model.RoleEmbedding) && !lossless {
					t.Errorf("%s (role %s) stored lossily as %s", pt.Name, pt.Role, pt.Format)
				}
				if pt.Role == model.RoleALog || pt.Role == model.RoleGDNNorm {
					if pt.StoredDType != "F32" {
						t.Errorf("%s stored as %s, want F32", pt.Name, pt.StoredDType)
					}
				}
				if pt.Role.IsExpert() != (pt.Expert >= 0) || (pt.Expert >= 0) != (pt.ExpertGroup == pt.Expert/16) {
					t.Errorf("%s: expert %d group %d", pt.Name, pt.Expert, pt.ExpertGroup)
				}
			}
			var sum int64
			for _, ft := range r.Totals {
				sum += ft.StoredBytes
			}
			if sum != r.StoredBytes || r.SourceBytes != 71010512512 {
				t.Errorf("totals sum %d, stored %d, source %d", sum, r.StoredBytes, r.SourceBytes)
			}
		})
	}
}

// TestQwen36PresetFormats checks the 35B preset role by role against the
// published precision table, and its predicted size against an independent
// count of tiles.
func TestQwen36PresetFormats(t *testing.T) {
	r, err := mustPreset(t, PresetQwen36MoE).Resolve(replicaModel(t))
	if err != nil {
		t.Fatal(err)
	}
	want := map[model.Role]struct {
		f manifest.StoredFormat
		m manifest.Method
	}{
		model.RoleExpertGateUp: {manifest.StoreBFP4, manifest.MethodGPTQ}, model.RoleExpertDown: {manifest.StoreBFP4, manifest.MethodGPTQ},
		model.RoleSharedGate: {manifest.StoreBFP4, manifest.MethodGPTQ}, model.RoleSharedUp: {manifest.StoreBFP4, manifest.MethodGPTQ}, model.RoleSharedDown: {manifest.StoreBFP4, manifest.MethodGPTQ},
		model.RoleGDNInQKV: {manifest.StoreBFP8, manifest.MethodRTN}, model.RoleGDNInZ: {manifest.StoreBFP8, manifest.MethodRTN}, model.RoleGDNOut: {manifest.StoreBFP8, manifest.MethodRTN},
		model.RoleAttnQ: {manifest.StoreBFP8, manifest.MethodRTN}, model.RoleAttnK: {manifest.StoreBFP8, manifest.MethodRTN}, model.RoleAttnV: {manifest.StoreBFP8, manifest.MethodRTN}, model.RoleAttnO: {manifest.StoreBFP8, manifest.MethodRTN},
		model.RoleLMHead: {manifest.StoreBFP8, manifest.MethodRTN}, model.RoleMTPFC: {manifest.StoreBFP8, manifest.MethodRTN},
		model.RoleRouter: {manifest.StoreAsIs, manifest.MethodNone}, model.RoleSharedExpertGate: {manifest.StoreAsIs, manifest.MethodNone}, model.RoleNorm: {manifest.StoreAsIs, manifest.MethodNone},
		model.RoleGDNNorm: {manifest.StoreAsIs, manifest.MethodNone}, model.RoleConv1D: {manifest.StoreAsIs, manifest.MethodNone}, model.RoleALog: {manifest.StoreAsIs, manifest.MethodNone},
		model.RoleDTBias: {manifest.StoreAsIs, manifest.MethodNone}, model.RoleEmbedding: {manifest.StoreAsIs, manifest.MethodNone},
		model.RoleGDNInA: {manifest.StoreBFP8, manifest.MethodRTN}, model.RoleGDNInB: {manifest.StoreBFP8, manifest.MethodRTN},
	}
	seen := map[model.Role]int{}
	for _, pt := range r.Tensors {
		w, ok := want[pt.Role]
		if !ok {
			t.Errorf("%s: unexpected role %s", pt.Name, pt.Role)
			continue
		}
		seen[pt.Role]++
		if pt.Format != w.f || pt.Method != w.m {
			t.Errorf("%s (%s): %s/%s, want %s/%s", pt.Name, pt.Role, pt.Format, pt.Method, w.f, w.m)
		}
	}
	if len(seen) != len(want) {
		t.Errorf("roles seen %v", seen)
	}
	// Independent size count. BFP tiles of 32×32: BFP4_b 576 bytes,
	// BFP8_b 1088 bytes (512 or 1024 mantissa bytes + 64 exponent bytes).
	tiles := func(rows, cols int64) int64 { return (rows / 32) * (cols / 32) }
	const blocks, experts = 41, 256
	bfp4 := blocks * (experts*(tiles(1024, 2048)+tiles(2048, 512)) + 2*tiles(512, 2048) + tiles(2048, 512))
	bfp8 := 30*(tiles(8192, 2048)+tiles(4096, 2048)+2*tiles(32, 2048)+tiles(2048, 4096)) + // GDN qkv, z, a, b, out
		11*(tiles(8192, 2048)+2*tiles(512, 2048)+tiles(2048, 4096)) + // attention (10 layers + MTP)
		tiles(248320, 2048) + tiles(2048, 4096) // lm_head, mtp.fc
	var lossless int64 = 248320 * 2048 * 2            // embedding
	lossless += blocks * (256*2048 + 2048) * 2        // router, shared-expert gate
	lossless += 30 * (8192*4*2 + 32*2 + 32*4 + 128*4) // conv1d, dt_bias, A_log, norm
	lossless += (40*2*2048 + 10*2*256 + 2048) * 2     // trunk: layer norms, q/k norms, final norm
	lossless += (3*2048 + 2*2048 + 2*256) * 2         // MTP: embedding/hidden/final norms, layer norms, q/k norms
	wantBytes := bfp4*576 + bfp8*1088 + lossless
	if r.StoredBytes != wantBytes {
		t.Errorf("stored bytes %d, independent count %d", r.StoredBytes, wantBytes)
	}
	// The published checkpoint is 21.7 GB.
	if gb := float64(r.StoredBytes) / 1e9; gb < 21.5 || gb > 21.9 {
		t.Errorf("predicted size %.2f GB, published 21.7 GB", gb)
	}
}

// TestFusedAndPerExpertPlansAgree resolves the fused and per-expert tiny
// variants and compares every planned tensor and its source bytes.
func TestFusedAndPerExpertPlansAgree(t *testing.T) {
	fm, pm := tinyModel(t, testmodel.Default), tinyModel(t, testmodel.PerExpert)
	plan := mustPreset(t, PresetQwen36MoE)
	fr, err := plan.Resolve(fm)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := plan.Resolve(pm)
	if err != nil {
		t.Fatal(err)
	}
	if fr.SourceTensors != 91 || pr.SourceTensors != 321 {
		t.Errorf("sources %d and %d, want 91 and 321", fr.SourceTensors, pr.SourceTensors)
	}
	if len(fr.Tensors) != len(pr.Tensors) || len(fr.Tensors) != 91-10+5*32 {
		t.Fatalf("%d and %d stored tensors, want %d", len(fr.Tensors), len(pr.Tensors), 91-10+5*32)
	}
	if fr.ExpertFiles != 10 || fr.StoredBytes != pr.StoredBytes {
		t.Errorf("expert files %d (want 10), stored %d vs %d", fr.ExpertFiles, fr.StoredBytes, pr.StoredBytes)
	}
	ignore := func(pt PlannedTensor) PlannedTensor { pt.Source, pt.Sources = "", nil; return pt }
	for i := range fr.Tensors {
		a, b := fr.Tensors[i], pr.Tensors[i]
		if d := cmp.Diff(ignore(a), ignore(b)); d != "" {
			t.Errorf("tensor %d differs (-fused +per-expert):\n%s", i, d)
			continue
		}
		if a.Role.IsExpert() || i%7 == 0 {
			ab, err := a.ReadSource(fm)
			if err != nil {
				t.Fatal(err)
			}
			bb, err := b.ReadSource(pm)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(ab, bb) {
				t.Errorf("%s: source bytes differ between layouts", a.Name)
			}
		}
	}
	// Gate rows first: the fused slice of layer 0 expert 3 starts with the
	// all-zero gate rows the generator injects, then non-zero up rows.
	gu, ok := fr.Lookup("model.language_model.layers.0.mlp.experts.3.gate_up_proj")
	if !ok {
		t.Fatal("no planned gate_up for layer 0 expert 3")
	}
	v, err := gu.SourceFloat32s(fm)
	if err != nil {
		t.Fatal(err)
	}
	half := len(v) / 2
	for _, x := range v[:half] {
		if x != 0 {
			t.Fatal("gate rows of layer 0 expert 3 are not the zero rows")
		}
	}
	if v[half] == 0 && v[half+1] == 0 {
		t.Error("up rows of layer 0 expert 3 look zero")
	}
	want, _ := testmodel.Values(testmodel.Tiny(), testmodel.ExpertsFused, "model.language_model.layers.0.mlp.experts.gate_up_proj")
	off := 3 * len(v)
	if d := cmp.Diff(want[off:off+len(v)], v); d != "" {
		t.Errorf("expert 3 slice differs from the generator's values")
	}
}

func TestEveryVariantPlans(t *testing.T) {
	for _, v := range []testmodel.Variant{testmodel.Default, testmodel.PerExpert, testmodel.SingleFile} {
		m := microModel(t, v)
		for _, name := range PresetNames() {
			if _, err := mustPreset(t, name).Resolve(m); err != nil {
				t.Errorf("%s with %s: %v", v, name, err)
			}
		}
	}
}

func TestFP8Refused(t *testing.T) {
	m := tinyModel(t, testmodel.FP8)
	_, err := mustPreset(t, PresetQwen36MoE).Resolve(m)
	if !errors.Is(err, ErrAlreadyQuantized) {
		t.Fatalf("FP8 source: err = %v, want ErrAlreadyQuantized", err)
	}
	for _, s := range []string{"already quantized", "F8_E4M3", "in_proj_qkv", "weight_scale_inv", "BF16"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestQuantizationConfigRefused(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny(), testmodel.SingleFile); err != nil {
		t.Fatal(err)
	}
	cfg, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	cfg = bytes.Replace(cfg, []byte(`"model_type": "qwen3_5_moe",`), []byte(`"model_type": "qwen3_5_moe", "quantization_config": {"quant_method": "gptq", "bits": 4},`), 1)
	os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, err = mustPreset(t, PresetQwen36MoE).Resolve(m)
	if !errors.Is(err, ErrAlreadyQuantized) || !strings.Contains(err.Error(), "gptq") {
		t.Errorf("quantization_config: err = %v", err)
	}
}

// smallModel writes a single-file model of the given tensors (BF16 unless
// the name ends in A_log) and opens it.
func smallModel(t *testing.T, tensors map[string][]int64) *safetensors.Model {
	t.Helper()
	var ts []safetensors.Tensor
	for name, shape := range tensors {
		n := int64(2)
		for _, d := range shape {
			n *= d
		}
		ts = append(ts, safetensors.Tensor{Name: name, DType: safetensors.BF16, Shape: shape, Data: make([]byte, n)})
	}
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := safetensors.WriteFile(path, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	m, err := safetensors.OpenModel(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestUnknownTensorNamed(t *testing.T) {
	m := smallModel(t, map[string][]int64{
		"model.layers.0.self_attn.q_proj.weight": {64, 32},
		"model.layers.0.mlp.mystery_proj.weight": {64, 32},
		"model.layers.0.input_layernorm.weight":  {32},
		"model.embed_tokens.weight":              {100, 32},
	})
	_, err := mustPreset(t, PresetDense9B).Resolve(m)
	if !errors.Is(err, ErrUnknownTensor) || !strings.Contains(err.Error(), "model.layers.0.mlp.mystery_proj.weight") {
		t.Errorf("unknown tensor: err = %v", err)
	}
}

func TestUnmatchedTensorNamed(t *testing.T) {
	m := microModel(t, testmodel.SingleFile)
	p := &Plan{Name: "experts-only", Rules: []Rule{{Pattern: "*.mlp.experts.*", Format: "BFP4_B", Method: "gptq"}}}
	_, err := p.Resolve(m)
	if !errors.Is(err, ErrNoRule) || !strings.Contains(err.Error(), "lm_head.weight") || !strings.Contains(err.Error(), "experts-only") {
		t.Errorf("unmatched tensor: err = %v", err)
	}
}

func TestLosslessRolesEnforced(t *testing.T) {
	m := microModel(t, testmodel.SingleFile)
	for _, c := range []struct {
		rule Rule
		msg  string
	}{
		{Rule{Pattern: "*.input_layernorm.weight", Format: "BFP8_B"}, "needs a 2-D matrix"},
		{Rule{Pattern: "*.mlp.gate.weight", Format: "BFP8_B"}, "must stay lossless"},
		{Rule{Pattern: "*.linear_attn.A_log", Format: "BF16"}, "must stay lossless"},
		{Rule{Pattern: "*.linear_attn.conv1d.weight", Format: "BFP8_B"}, "2-D matrix"},
	} {
		p := &Plan{Name: "bad", Rules: append([]Rule{c.rule}, mustPreset(t, PresetQwen36MoE).Rules...)}
		_, err := p.Resolve(m)
		if err == nil || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), "rule 1") {
			t.Errorf("rule %+v: err = %v, want %q naming rule 1", c.rule, err, c.msg)
		}
	}
	// F32 storage of an F32 source is lossless and allowed.
	p := &Plan{Name: "f32", Rules: append([]Rule{{Pattern: "*.linear_attn.A_log", Format: "F32"}}, mustPreset(t, PresetQwen36MoE).Rules...)}
	if _, err := p.Resolve(m); err != nil {
		t.Error(err)
	}
}

func TestClassifyTensor(t *testing.T) {
	cases := map[string]model.SourceClass{
		"model.language_model.layers.7.self_attn.q_proj.weight": {Role: model.RoleAttnQ, Layer: 7, Expert: -1},
		"model.layers.12.linear_attn.in_proj_qkvz.weight":       {Role: model.RoleGDNInQKVZ, Layer: 12, Expert: -1},
		"mtp.layers.0.mlp.experts.9.up_proj.weight":             {Role: model.RoleExpertGateUp, Layer: 0, MTP: true, Expert: 9, Part: "up", Block: "mtp.layers.0.mlp."},
		"model.language_model.layers.0.mlp.experts.down_proj":   {Role: model.RoleExpertDown, Layer: 0, Fused: true, Expert: -1, Block: "model.language_model.layers.0.mlp."},
		"mtp.pre_fc_norm_embedding.weight":                      {Role: model.RoleNorm, Layer: -1, MTP: true, Expert: -1},
		"model.visual.blocks.0.attn.qkv.bias":                   {Role: model.RoleVision, Layer: -1, Expert: -1},
		"model.layers.3.mlp.down_proj.weight":                   {Role: model.RoleMLPDown, Layer: 3, Expert: -1},
		"model.layers.65536.mlp.experts.65536.gate_proj.weight": {Role: model.RoleExpertGateUp, Layer: 65536, Expert: 65536, Part: "gate", Block: "model.layers.65536.mlp."},
	}
	for name, want := range cases {
		got, err := model.ClassifyTensor(name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got != want {
			t.Errorf("%s: %+v, want %+v", name, got, want)
		}
	}
	for _, bad := range []string{"", "model.layers.x.mlp.gate.weight", "model.layers.01.mlp.gate.weight", "model.layers.0.mlp.experts.03.up_proj.weight", "transformer.h.0.attn.c_attn.weight", "model.language_model.layers.0.mlp.experts.gate_proj",
		"model.layers.65537.mlp.gate.weight", "model.layers.9223372036854775807.mlp.gate.weight", "model.layers.0.mlp.experts.65537.up_proj.weight"} {
		if _, err := model.ClassifyTensor(bad); err == nil || !strings.Contains(err.Error(), "unknown tensor name") {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
}

// TestResolveReadsHeadersOnly resolves the replica after closing its
// files: any read of tensor data would fail.
func TestResolveReadsHeadersOnly(t *testing.T) {
	m := replicaModel(t)
	m.Close()
	r, err := mustPreset(t, PresetQwen36MoE).Resolve(m)
	if err != nil {
		t.Fatalf("resolve on closed files: %v", err)
	}
	if _, err := r.Tensors[0].ReadSource(m); err == nil {
		t.Error("reading data from closed files succeeded; the test proves nothing")
	}
}

func TestNaturalKey(t *testing.T) {
	names := []string{"a.10.b", "a.2.b", "a.2", "a.b", "a.1x", "lm_head.weight", "a.2.a"}
	want := []string{"a.2", "a.2.a", "a.2.b", "a.10.b", "a.1x", "a.b", "lm_head.weight"}
	ts := make([]PlannedTensor, len(names))
	for i, n := range names {
		ts[i].Name = n
	}
	sortNatural(ts)
	for i := range ts {
		if ts[i].Name != want[i] {
			t.Fatalf("natural order %d: %s, want %s", i, ts[i].Name, want[i])
		}
	}
}

func BenchmarkResolveReplica(b *testing.B) {
	m := replicaModel(b)
	p := mustPreset(b, PresetQwen36MoE)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.Resolve(m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Seconds())/float64(b.N), "s/plan")
}

func TestVisionPassThroughAndMicro(t *testing.T) {
	c := testmodel.Micro()
	c.VisionStubs = true
	dir := t.TempDir()
	if err := testmodel.Write(dir, c, testmodel.PerExpert); err != nil {
		t.Fatal(err)
	}
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, name := range PresetNames() {
		r, err := mustPreset(t, name).Resolve(m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		vision := 0
		for _, pt := range r.Tensors {
			if pt.Role == model.RoleVision {
				vision++
				if pt.Format != manifest.StoreAsIs || pt.StoredBytes != pt.SourceBytes {
					t.Errorf("%s: vision tensor %s stored as %s", name, pt.Name, pt.Format)
				}
			}
		}
		// 8 experts per block, 16 per file: one group per block and kind.
		if vision != 3 || r.ExpertFiles != 10 || r.Experts != 8 {
			t.Errorf("%s: %d vision tensors, %d expert files, %d experts", name, vision, r.ExpertFiles, r.Experts)
		}
	}
	r, err := mustPreset(t, PresetQwen36MoE).ResolveWith(m, ResolveOptions{ExpertsPerFile: 3})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExpertFiles != 5*3*2 { // ceil(8/3) groups
		t.Errorf("3 experts per file: %d expert files, want 30", r.ExpertFiles)
	}
}

func TestQwen3NextPlans(t *testing.T) {
	m := generatedModel(t, testmodel.Qwen3NextTiny(), testmodel.Default)
	r, err := mustPreset(t, PresetQwen36MoE).Resolve(m)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]manifest.StoredFormat{
		"model.layers.0.linear_attn.in_proj_qkvz.weight": manifest.StoreBFP8,
		"model.layers.0.linear_attn.in_proj_ba.weight":   manifest.StoreBFP8,
		"model.layers.1.mlp.experts.7.gate_up_proj":      manifest.StoreBFP4,
		"mtp.layers.0.mlp.experts.15.down_proj":          manifest.StoreBFP4,
		"model.embed_tokens.weight":                      manifest.StoreAsIs,
	}
	for name, f := range want {
		pt, ok := r.Lookup(name)
		if !ok {
			t.Errorf("no planned %s", name)
		} else if pt.Format != f {
			t.Errorf("%s: %s, want %s", name, pt.Format, f)
		}
	}
	if r.ExpertFiles != 10 || r.SourceTensors != 315 {
		t.Errorf("expert files %d, sources %d", r.ExpertFiles, r.SourceTensors)
	}
}

func TestBadShapesNamed(t *testing.T) {
	cases := []struct {
		tensors map[string][]int64
		want    []string
	}{
		{map[string][]int64{"model.layers.0.input_layernorm.weight": {32, 2}},
			[]string{"model.safetensors", "model.layers.0.input_layernorm.weight", "[32 2]", "1-D"}},
		{map[string][]int64{"model.layers.0.mlp.experts.gate_up_proj": {4, 2048}},
			[]string{"model.layers.0.mlp.experts.gate_up_proj", "[4 2048]", "3-D"}},
		{map[string][]int64{"model.layers.0.mlp.experts.gate_up_proj": {4, 10, 32}, "model.layers.0.mlp.experts.down_proj": {4, 32, 6}},
			[]string{"model.layers.0.mlp", "[4 10 32]", "[4 32 6]", "disagree"}},
		{map[string][]int64{"model.layers.0.mlp.experts.gate_up_proj": {4, 10, 32}},
			[]string{"experts.down_proj is missing"}},
		{map[string][]int64{"model.layers.0.mlp.experts.2.gate_proj.weight": {8, 32}, "model.layers.0.mlp.experts.2.down_proj.weight": {32, 8}},
			[]string{"model.layers.0.mlp.experts.2", "missing"}},
		{map[string][]int64{"model.layers.0.mlp.experts.gate_up_proj": {4, 16, 32}, "model.layers.0.mlp.experts.down_proj": {4, 32, 8},
			"model.layers.0.mlp.experts.1.gate_proj.weight": {8, 32}, "model.layers.0.mlp.experts.1.up_proj.weight": {8, 32}, "model.layers.0.mlp.experts.1.down_proj.weight": {32, 8}},
			[]string{"model.layers.0.mlp.experts.1.", "both"}},
	}
	for _, c := range cases {
		m := smallModel(t, c.tensors)
		_, err := mustPreset(t, PresetQwen36MoE).Resolve(m)
		if err == nil {
			t.Errorf("%v: resolved", c.tensors)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q lacks %q", c.tensors, err, w)
			}
		}
	}
}

// noFamily knows no tensor: Resolve must ask the family it is given.
type noFamily struct{ model.Family }

func (noFamily) Name() string { return "NoSuchFamily" }
func (noFamily) ClassifyTensor(name string) (model.SourceClass, error) {
	return model.SourceClass{}, errors.New("unknown")
}

func TestResolveAsksTheFamily(t *testing.T) {
	m := microModel(t, testmodel.Default)
	p := mustPreset(t, PresetQwen36MoE)
	if _, err := p.ResolveWith(m, ResolveOptions{Family: model.Qwen3}); err != nil {
		t.Fatalf("Qwen3 family: %v", err)
	}
	_, err := p.ResolveWith(m, ResolveOptions{Family: noFamily{model.Qwen3}})
	if !errors.Is(err, ErrUnknownTensor) || !strings.Contains(err.Error(), "NoSuchFamily") {
		t.Fatalf("a family that knows no tensor: %v", err)
	}
}

// TestDensePresetOn27BReplica: on the Qwen3.5-27B shape replica (dense,
// 64 layers and one MTP layer), qwen3-27b-dense stores the 192 MLP
// matrices of the trunk and the MTP layer's 3 in BFP4_b with GPTQ; no
// other matrix is BFP4_b, and the MoE preset's expert rules match nothing.
func TestDensePresetOn27BReplica(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.WriteReplica27B(dir); err != nil {
		t.Fatal(err)
	}
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := mustPreset(t, PresetDense27B).Resolve(m)
	if err != nil {
		t.Fatal(err)
	}
	if r.SourceTensors != 866 || len(r.Tensors) != 866 || r.NumLayers != 64 || r.NumMTPLayers != 1 || r.Experts != 0 || r.ExpertFiles != 0 {
		t.Fatalf("resolved %d/%d tensors, %d+%d layers, %d experts, %d expert files", r.SourceTensors, len(r.Tensors), r.NumLayers, r.NumMTPLayers, r.Experts, r.ExpertFiles)
	}
	trunk, mtp := 0, 0
	for _, pt := range r.Tensors {
		if pt.Format != manifest.StoreBFP4 {
			continue
		}
		if pt.Method != manifest.MethodGPTQ || !pt.Role.IsMLPMatrix() {
			t.Errorf("%s (role %s): BFP4_b %s, want only MLP matrices with GPTQ", pt.Name, pt.Role, pt.Method)
		}
		if pt.MTP {
			mtp++
		} else {
			trunk++
		}
	}
	if trunk != 192 || mtp != 3 {
		t.Errorf("%d trunk and %d MTP BFP4_b matrices, want 192 and 3", trunk, mtp)
	}
}

// TestResolveOptionsRefuseNegatives: a negative layout size is an error.
func TestResolveOptionsRefuseNegatives(t *testing.T) {
	for _, o := range []ResolveOptions{{ExpertsPerFile: -1}, {DenseShardBytes: -1}} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if err := (ResolveOptions{}).Validate(); err != nil {
		t.Error(err)
	}
}
