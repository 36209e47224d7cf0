package model

import "testing"

// TestSitesAndLayouts: the calibration site of every role that has one,
// and the expert layout of classified names.
func TestSitesAndLayouts(t *testing.T) {
	sites := map[Role]string{
		RoleAttnQ: SiteAttn, RoleAttnK: SiteAttn, RoleAttnV: SiteAttn, RoleAttnO: SiteOProj,
		RoleGDNInQKV: SiteAttn, RoleGDNInZ: SiteAttn, RoleGDNInQKVZ: SiteAttn, RoleGDNOut: SiteOutProj,
		RoleExpertGateUp: SiteMoE, RoleExpertDown: SiteMoE, RoleSharedGate: SiteMoE, RoleSharedUp: SiteMoE,
		RoleMLPGate: SiteMoE, RoleMLPUp: SiteMoE,
		RoleSharedDown: "", RoleMLPDown: "", RoleRouter: "", RoleNorm: "", RoleEmbedding: "", RoleLMHead: "",
	}
	for r, want := range sites {
		if got := Qwen3.Site(r); got != want {
			t.Errorf("Site(%s) = %q, want %q", r, got, want)
		}
	}
	layouts := map[string]ExpertLayout{
		"model.language_model.layers.3.mlp.experts.gate_up_proj":         LayoutFused,
		"model.layers.1.mlp.experts.7.down_proj.weight":                  LayoutPerExpert,
		"model.language_model.layers.3.mlp.shared_expert.up_proj.weight": LayoutUnknown,
	}
	for name, want := range layouts {
		c, err := Qwen3.ClassifyTensor(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := LayoutOf(c); got != want {
			t.Errorf("%s: layout %s, want %s", name, got, want)
		}
	}
	if LayoutUnknown.String() != "unknown" || LayoutFused.String() != "fused" || LayoutPerExpert.String() != "per-expert" {
		t.Error("layout names")
	}
}
