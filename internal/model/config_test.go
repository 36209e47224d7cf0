package model

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const flatConfig = `"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 2,
	"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32`

// TestReadModelConfigFields reads a flat (Qwen3-Next style) and a nested
// (text_config) config and checks the fields calibration uses, MTP layers
// included.
func TestReadModelConfigFields(t *testing.T) {
	c, err := ReadConfig(writeConfig(t, `{`+flatConfig+`, "mtp_num_hidden_layers": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.TensorPrefix != "model" || c.Layers != 2 || c.MTPLayers != 1 || c.NumLayers() != 3 || !c.MoE.NormTopK {
		t.Errorf("flat config: %+v", c)
	}
	if p, lt := c.LayerPrefix(2), c.LayerType(2); p != "mtp.layers.0." || lt != "full_attention" {
		t.Errorf("layer 2 (MTP): prefix %q, type %q", p, lt)
	}
	if p, lt := c.LayerPrefix(1), c.LayerType(1); p != "model.layers.1." || lt != "" {
		t.Errorf("layer 1: prefix %q, type %q (no layer_types given)", p, lt)
	}
	c, err = ReadConfig(writeConfig(t, `{"model_type": "qwen3_moe", "text_config": {`+flatConfig+`}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.TensorPrefix != "model.language_model" || c.MTPLayers != 0 || c.NumLayers() != 2 {
		t.Errorf("nested config without MTP: %+v", c)
	}
}

// TestReadModelConfigErrors: bad configs are errors naming the file and the
// field, never a panic or a huge allocation later.
func TestReadModelConfigErrors(t *testing.T) {
	cases := map[string]string{
		`{"hidden_size": 64}`: "num_hidden_layers missing",
		`{"model_type": "qwen3_next", "hidden_size": -4, "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}`:            "hidden_size = -4 must be positive",
		`{"model_type": "qwen3_next", "hidden_size": 1000000000000, "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}`: "hidden_size = 1000000000000 is implausibly large",
		`{` + flatConfig + `, "num_attention_heads": 1048576, "head_dim": 1048576}`:                                                                                   "implausibly large",
		`{` + flatConfig + `, "layer_types": ["full_attention"]}`:                                                                                                     "layer_types has 1 entries for 2 layers",
		`{` + flatConfig + `, "num_experts_per_tok": 9}`:                                                                                                              "top-k 9 outside 1..8",
		`[1, 2]`: "cannot unmarshal",
	}
	for body, want := range cases {
		p := writeConfig(t, body)
		_, err := ReadConfig(p)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: err = %v, want one naming %s and saying %q", body, err, p, want)
		}
	}
	if _, err := ReadConfig(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing config accepted")
	}
}

// TestNormTopK: Qwen3.5/3.6 always renormalises the router weights, even
// with a norm_topk_prob: false in its config (the architecture has no
// switch, and the forward pass ignores the field too); Qwen3-Next and
// Qwen3-MoE follow the field, with their own defaults.
func TestNormTopK(t *testing.T) {
	geo := `"hidden_size": 64, "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32`
	for _, c := range []struct {
		typ, field string
		want       bool
	}{
		{"qwen3_5_moe_text", "", true},
		{"qwen3_5_moe_text", `, "norm_topk_prob": false`, true},
		{"qwen3_5_moe", `, "norm_topk_prob": false`, true},
		{"qwen3_next", "", true},
		{"qwen3_next", `, "norm_topk_prob": false`, false},
		{"qwen3_moe", "", false},
		{"qwen3_moe", `, "norm_topk_prob": true`, true},
	} {
		cfg, err := ReadConfig(writeConfig(t, `{"model_type": "`+c.typ+`", `+geo+c.field+`}`))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MoE.NormTopK != c.want {
			t.Errorf("%s%s: renormalise %v, want %v", c.typ, c.field, cfg.MoE.NormTopK, c.want)
		}
	}
	// Nested: the text_config's model type decides.
	cfg, err := ReadConfig(writeConfig(t, `{"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_moe_text", `+geo+`, "norm_topk_prob": false}}`))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.MoE.NormTopK {
		t.Error("nested Qwen3.5 config with norm_topk_prob false: not renormalising")
	}
}
