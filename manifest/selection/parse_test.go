package selection

import (
	"testing"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/manifest"
)

func TestParseCandidatesSizesWeights(t *testing.T) {
	cs, err := ParseCandidates("bfp4_b:GPTQ, BFP8_b:rtn,as_is")
	if err != nil {
		t.Fatal(err)
	}
	want := []Candidate{{manifest.StoreBFP4, manifest.MethodGPTQ}, {manifest.StoreBFP8, manifest.MethodRTN}, {manifest.StoreAsIs, manifest.MethodNone}}
	for i := range want {
		if cs[i] != want[i] {
			t.Errorf("candidate %d = %v, want %v", i, cs[i], want[i])
		}
	}
	for _, bad := range []string{"BFP3_b:gptq", "BFP4_b", "BFP4_b:none", "AS_IS:rtn", "F32", "BFP4_b:gptq,BFP4_b:gptq", ""} {
		if _, err := ParseCandidates(bad); err == nil {
			t.Errorf("candidates %q accepted", bad)
		}
	}
	for s, v := range map[string]float64{"20GB": 20e9, "1.5GiB": 1.5 * (1 << 30), "4718592": 4718592, "3 MB": 3e6, "512B": 512} {
		if got, err := ParseSize(s); err != nil || got != v {
			t.Errorf("ParseSize(%q) = %v, %v; want %v", s, got, err, v)
		}
	}
	for _, bad := range []string{"", "GB", "-1GB", "0", "NaN", "Inf", "5XB"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("size %q accepted", bad)
		}
	}
	w, err := ParseWeights("attn_out=0.13,mlp_in=0.0004,attn_out@0=2")
	if err != nil || w.Of(model.RoleGDNOut, 1) != 0.13 || w.Of(model.RoleGDNOut, 0) != 2 || w.Of(model.RoleExpertGateUp, 0) != 0.0004 || w.Of(model.RoleAttnQ, 0) != 1 {
		t.Errorf("weights %v, %v", w, err)
	}
	if w.String() != "attn_out=0.13,attn_out@0=2,mlp_in=0.0004" {
		t.Errorf("weights print as %q", w.String())
	}
	for _, bad := range []string{"attn=1", "attn_out=-1", "attn_out=x", "attn_out=1,attn_out=2", "attn_out", "attn_out@x=1", "attn_out@-1=1", "attn_out@01=1", "bad@0=1"} {
		if _, err := ParseWeights(bad); err == nil {
			t.Errorf("weights %q accepted", bad)
		}
	}
	// Every matrix role the presets quantize has a class other than
	// "other" except the LM head and the MTP projection.
	for _, r := range []model.Role{model.RoleAttnQ, model.RoleGDNInZ, model.RoleAttnO, model.RoleSharedGate, model.RoleMLPDown, model.RoleExpertDown} {
		if RoleClass(r) == ClassOther {
			t.Errorf("role %s has no class", r)
		}
	}
	if RoleClass(model.RoleLMHead) != ClassOther {
		t.Error("the LM head has a block class")
	}
}
