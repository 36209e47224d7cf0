package forward

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

// flatConfig returns a Qwen3-Next style (flat, model_type qwen3_next)
// config.json object for the fixture geometry.
func flatConfig(cfg testmodel.Config) map[string]any {
	types := make([]string, len(cfg.LayerTypes))
	for i, t := range cfg.LayerTypes {
		types[i] = string(t)
	}
	return map[string]any{
		"model_type":                      "qwen3_next",
		"architectures":                   []string{"Qwen3NextForCausalLM"},
		"hidden_size":                     cfg.Hidden,
		"num_hidden_layers":               cfg.Layers,
		"layer_types":                     types,
		"num_attention_heads":             cfg.Heads,
		"num_key_value_heads":             cfg.KVHeads,
		"head_dim":                        cfg.HeadDim,
		"partial_rotary_factor":           cfg.PartialRotaryFactor,
		"rope_theta":                      cfg.RopeTheta,
		"linear_num_key_heads":            cfg.LinearKeyHeads,
		"linear_num_value_heads":          cfg.LinearValueHeads,
		"linear_key_head_dim":             cfg.LinearKeyHeadDim,
		"linear_value_head_dim":           cfg.LinearValueHeadDim,
		"linear_conv_kernel_dim":          cfg.ConvKernel,
		"num_experts":                     cfg.Experts,
		"num_experts_per_tok":             cfg.TopK,
		"moe_intermediate_size":           cfg.MoEIntermediate,
		"shared_expert_intermediate_size": cfg.SharedIntermediate,
		"norm_topk_prob":                  true,
		"decoder_sparse_step":             1,
		"mlp_only_layers":                 []int{},
		"intermediate_size":               4 * cfg.Hidden,
		"vocab_size":                      cfg.Vocab,
		"rms_norm_eps":                    cfg.RMSNormEps,
		"mtp_num_hidden_layers":           cfg.MTPLayers,
		"tie_word_embeddings":             false,
	}
}

func writeJSONFile(tb testing.TB, path string, v any) {
	tb.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		tb.Fatal(err)
	}
}

func writeFlatConfig(tb testing.TB, dir string, cfg testmodel.Config) {
	writeJSONFile(tb, filepath.Join(dir, "config.json"), flatConfig(cfg))
}
