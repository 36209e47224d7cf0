package model

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// configJSON returns the config.json of a generated model, edited: the
// text model's fields (the whole object of a flat config) go through edit.
func configJSON(t *testing.T, c testmodel.Config, edit func(tc map[string]any)) string {
	t.Helper()
	raw, err := c.ConfigJSON(false)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	tc := top
	if n, ok := top["text_config"].(map[string]any); ok {
		tc = n
	}
	if edit != nil {
		edit(tc)
	}
	b, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// flat is the Qwen3-Next (flat) tiny config with two layers.
func flat(t *testing.T, edit func(tc map[string]any)) string {
	return configJSON(t, testmodel.Qwen3NextTiny(), func(tc map[string]any) {
		tc["num_hidden_layers"] = 2
		tc["layer_types"] = []string{"linear_attention", "full_attention"}
		if edit != nil {
			edit(tc)
		}
	})
}

// TestReadModelConfigFields reads a flat (Qwen3-Next style) and a nested
// (text_config) config and checks the fields calibration uses, MTP layers
// included.
func TestReadModelConfigFields(t *testing.T) {
	c, err := ReadConfig(writeConfig(t, flat(t, func(tc map[string]any) { tc["mtp_num_hidden_layers"] = 1 })))
	if err != nil {
		t.Fatal(err)
	}
	if c.Prefix != "model." || c.Layers != 2 || c.MTPLayers != 1 || c.NumLayers() != 3 || !c.MoE().NormTopK || c.Arch != ArchQwen3Next {
		t.Errorf("flat config: %+v", c)
	}
	if p, k := c.LayerPrefix(2), c.Kind(2); p != "mtp.layers.0." || k != FullAttention {
		t.Errorf("layer 2 (MTP): prefix %q, kind %v", p, k)
	}
	if p, k := c.LayerPrefix(0), c.Kind(0); p != "model.layers.0." || k != LinearAttention {
		t.Errorf("layer 0: prefix %q, kind %v", p, k)
	}
	// Without layer_types, every full_attention_interval-th layer is full
	// attention.
	c, err = ReadConfig(writeConfig(t, configJSON(t, testmodel.Micro(), func(tc map[string]any) {
		delete(tc, "layer_types")
		tc["full_attention_interval"] = 2
		tc["mtp_num_hidden_layers"] = 0
	})))
	if err != nil {
		t.Fatal(err)
	}
	if c.Prefix != "model.language_model." || c.MTPLayers != 0 || c.NumLayers() != 4 || c.Kind(0) != LinearAttention || c.Kind(1) != FullAttention {
		t.Errorf("nested config without MTP or layer_types: %+v", c)
	}
}

// TestReadModelConfigErrors: bad configs are errors naming the file and the
// field, never a panic or a huge allocation later.
func TestReadModelConfigErrors(t *testing.T) {
	set := func(k string, v any) func(map[string]any) { return func(tc map[string]any) { tc[k] = v } }
	cases := map[string]string{
		flat(t, func(tc map[string]any) { delete(tc, "num_hidden_layers") }):                              "num_hidden_layers missing",
		flat(t, set("hidden_size", -4)):                                                                   "hidden_size = -4 must be positive",
		flat(t, set("hidden_size", 1000000000000)):                                                        "hidden_size = 1000000000000 is implausibly large",
		flat(t, func(tc map[string]any) { tc["num_attention_heads"], tc["head_dim"] = 1048576, 1048576 }): "implausibly large",
		flat(t, set("layer_types", []string{"full_attention"})):                                           "layer_types has 1 entries for 2 layers",
		flat(t, set("num_experts_per_tok", 99)):                                                           "top-k 99 outside 1..16",
		flat(t, set("model_type", "qwen3_moe")):                                                           `model_type "qwen3_moe" is not supported`,
		`[1, 2]`:                                                                                          "cannot unmarshal",
	}
	for body, want := range cases {
		p := writeConfig(t, body)
		_, err := ReadConfig(p)
		var ce *ConfigError
		if err == nil || !errors.As(err, &ce) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%.80s…: err = %v, want a ConfigError naming %s and saying %q", body, err, p, want)
		}
	}
	if _, err := ReadConfig(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing config accepted")
	}
}

// TestModelTypeTable: every model_type of the table selects its
// architecture, a dense one needs intermediate_size, and an MoE one its
// expert geometry.
func TestModelTypeTable(t *testing.T) {
	moe := []string{"num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"}
	for _, c := range []struct {
		typ   string
		dense bool
		want  Arch
	}{
		{"qwen3_5_moe", false, ArchQwen35MoE}, {"qwen3_5_moe_text", false, ArchQwen35MoE},
		{"qwen3_5", true, ArchQwen35Dense}, {"qwen3_5_text", true, ArchQwen35Dense},
	} {
		body := configJSON(t, testmodel.Micro(), func(tc map[string]any) {
			tc["model_type"] = c.typ
			if c.dense {
				for _, k := range moe {
					delete(tc, k)
				}
				tc["intermediate_size"] = 96
			}
		})
		cfg, err := ParseConfig([]byte(body), "config.json")
		if err != nil {
			t.Fatalf("%s: %v", c.typ, err)
		}
		if cfg.Arch != c.want || cfg.HasMoE() == c.dense || (c.dense && cfg.Intermediate != 96) {
			t.Errorf("%s: architecture %v, MoE %v, intermediate %d", c.typ, cfg.Arch, cfg.HasMoE(), cfg.Intermediate)
		}
	}
	dense := configJSON(t, testmodel.Micro(), func(tc map[string]any) { tc["model_type"] = "qwen3_5_text" })
	if _, err := ParseConfig([]byte(dense), "config.json"); err == nil || !strings.Contains(err.Error(), "intermediate_size") {
		t.Errorf("dense config without intermediate_size: %v", err)
	}
	noExperts := configJSON(t, testmodel.Micro(), func(tc map[string]any) { delete(tc, "num_experts") })
	if _, err := ParseConfig([]byte(noExperts), "config.json"); err == nil || !strings.Contains(err.Error(), "num_experts missing") {
		t.Errorf("MoE config without num_experts: %v", err)
	}
}

// TestNormTopK: Qwen3.5/3.6 always renormalises the router weights, even
// with a norm_topk_prob: false in its config (the architecture has no
// switch, and the forward pass ignores the field too); Qwen3-Next follows
// the field, which defaults to renormalising.
func TestNormTopK(t *testing.T) {
	for _, c := range []struct {
		typ   string
		field any // nil: absent
		want  bool
	}{
		{"qwen3_5_moe_text", nil, true},
		{"qwen3_5_moe_text", false, true},
		{"qwen3_5_moe", false, true},
		{"qwen3_next", nil, true},
		{"qwen3_next", false, false},
		{"qwen3_next", true, true},
	} {
		mc := testmodel.Micro()
		if c.typ == "qwen3_next" {
			mc = testmodel.Qwen3NextTiny()
		}
		body := configJSON(t, mc, func(tc map[string]any) {
			tc["model_type"] = c.typ
			delete(tc, "norm_topk_prob")
			if c.field != nil {
				tc["norm_topk_prob"] = c.field
			}
		})
		cfg, err := ReadConfig(writeConfig(t, body))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MoE().NormTopK != c.want {
			t.Errorf("%s norm_topk_prob %v: renormalise %v, want %v", c.typ, c.field, cfg.MoE().NormTopK, c.want)
		}
	}
}
