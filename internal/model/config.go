package model

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// MoEConfig describes one sparse mixture-of-experts block of the Qwen3 MoE
// family (Qwen3-MoE, Qwen3-Next, Qwen3.5/3.6-MoE).
type MoEConfig struct {
	Hidden      int  // model width: the input and output size of the block
	Experts     int  // routed experts
	TopK        int  // experts chosen per token
	ExpertInter int  // width of one routed expert (moe_intermediate_size)
	SharedInter int  // width of the shared expert; 0 when the block has none
	NormTopK    bool // renormalise the top-k probabilities to sum to one
}

// Validate reports whether the configuration is usable.
func (c MoEConfig) Validate() error {
	switch {
	case c.Hidden <= 0:
		return fmt.Errorf("model: MoE config: hidden size %d must be positive", c.Hidden)
	case c.Experts <= 0:
		return fmt.Errorf("model: MoE config: %d experts; need at least one", c.Experts)
	case c.TopK <= 0 || c.TopK > c.Experts:
		return fmt.Errorf("model: MoE config: top-k %d outside 1..%d experts", c.TopK, c.Experts)
	case c.ExpertInter <= 0:
		return fmt.Errorf("model: MoE config: expert width %d must be positive", c.ExpertInter)
	case c.SharedInter < 0:
		return fmt.Errorf("model: MoE config: shared expert width %d is negative", c.SharedInter)
	}
	return nil
}

// Config is the part of a Hugging Face config.json that calibration
// needs.
type Config struct {
	ModelType string
	// Layers is num_hidden_layers, the trunk decoder layers.
	Layers int
	// MTPLayers is mtp_num_hidden_layers, the multi-token-prediction
	// layers (tensors "mtp.layers.k."), 0 when the config does not say.
	// Calibration stores and the native manifest number MTP layer k as
	// layer Layers+k (see NumLayers and LayerPrefix); an MTP layer has the
	// trunk's MoE block and full attention.
	MTPLayers int
	MoE       MoEConfig
	// TensorPrefix is the name prefix of the decoder layers' parent, for
	// example "model.language_model" (Qwen3.5/3.6) or "model" (Qwen3-Next).
	TensorPrefix string
	// Vocab is vocab_size (0 when absent).
	Vocab int
	// LayerTypes is layer_types ("linear_attention", "full_attention"),
	// nil when absent.
	LayerTypes []string
	// AttnInner is the input width of self_attn.o_proj
	// (num_attention_heads × head_dim); LinearValueDim the input width of
	// linear_attn.out_proj (linear_num_value_heads × linear_value_head_dim).
	// 0 when the config does not say.
	AttnInner, LinearValueDim int
}

// NumLayers returns the number of layer indices: the trunk layers
// 0..Layers-1, then the MTP layers Layers..Layers+MTPLayers-1.
func (c *Config) NumLayers() int { return c.Layers + c.MTPLayers }

// LayerPrefix returns the tensor-name prefix of layer i, ending in a dot:
// "model.language_model.layers.3." for a trunk layer, and for i >= Layers
// the MTP layer i-Layers, e.g. "mtp.layers.0.".
func (c *Config) LayerPrefix(i int) string {
	if i >= c.Layers {
		return fmt.Sprintf("mtp.layers.%d.", i-c.Layers)
	}
	return fmt.Sprintf("%s.layers.%d.", c.TensorPrefix, i)
}

// LayerType returns the attention kind of layer i: its layer_types entry
// for a trunk layer, "full_attention" for an MTP layer, "" when the config
// does not say.
func (c *Config) LayerType(i int) string {
	switch {
	case i >= c.Layers:
		return "full_attention"
	case i >= 0 && i < len(c.LayerTypes):
		return c.LayerTypes[i]
	}
	return ""
}

type hfTextConfig struct {
	ModelType           string        `json:"model_type"`
	HiddenSize          *int          `json:"hidden_size"`
	NumHiddenLayers     *int          `json:"num_hidden_layers"`
	NumExperts          *int          `json:"num_experts"`
	NumExpertsPerTok    *int          `json:"num_experts_per_tok"`
	MoEIntermediateSize *int          `json:"moe_intermediate_size"`
	SharedIntermediate  *int          `json:"shared_expert_intermediate_size"`
	NormTopKProb        *bool         `json:"norm_topk_prob"`
	VocabSize           *int          `json:"vocab_size"`
	LayerTypes          []string      `json:"layer_types"`
	NumAttentionHeads   *int          `json:"num_attention_heads"`
	HeadDim             *int          `json:"head_dim"`
	LinearNumValueHeads *int          `json:"linear_num_value_heads"`
	LinearValueHeadDim  *int          `json:"linear_value_head_dim"`
	MTPNumHiddenLayers  *int          `json:"mtp_num_hidden_layers"`
	TextConfig          *hfTextConfig `json:"text_config"`
}

// maxConfigValue bounds every size read from config.json (widths, layer
// and expert counts): the largest real models are far below it, and a
// corrupt or hostile config must be an error, not an allocation of
// terabytes.
const maxConfigValue = 1 << 20

// ReadConfig reads dir/config.json (or the file itself when path names
// a file) and extracts the MoE geometry. Nested text_config sections
// (Qwen3.5/3.6) and flat configs (Qwen3-MoE, Qwen3-Next) are both accepted.
//
// norm_topk_prob: when the field is absent, Qwen3.5/3.6 MoE and Qwen3-Next
// renormalise (their released configs omit it or set it true) while plain
// Qwen3-MoE does not, matching the defaults of those architectures.
func ReadConfig(path string) (*Config, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model: reading model config: %w", err)
	}
	var top hfTextConfig
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("model: %s: %w", path, err)
	}
	tc := &top
	prefix := "model"
	if top.TextConfig != nil {
		tc = top.TextConfig
		prefix = "model.language_model"
		if tc.ModelType == "" {
			tc.ModelType = top.ModelType
		}
	}
	need := func(name string, v *int) (int, error) {
		if v == nil {
			return 0, fmt.Errorf("model: %s: field %s missing", path, name)
		}
		if *v <= 0 {
			return 0, fmt.Errorf("model: %s: field %s = %d must be positive", path, name, *v)
		}
		if *v > maxConfigValue {
			return 0, fmt.Errorf("model: %s: field %s = %d is implausibly large (limit %d)", path, name, *v, maxConfigValue)
		}
		return *v, nil
	}
	cfg := &Config{ModelType: tc.ModelType, TensorPrefix: prefix}
	if cfg.MoE.Hidden, err = need("hidden_size", tc.HiddenSize); err != nil {
		return nil, err
	}
	if cfg.Layers, err = need("num_hidden_layers", tc.NumHiddenLayers); err != nil {
		return nil, err
	}
	if cfg.MoE.Experts, err = need("num_experts", tc.NumExperts); err != nil {
		return nil, err
	}
	if cfg.MoE.TopK, err = need("num_experts_per_tok", tc.NumExpertsPerTok); err != nil {
		return nil, err
	}
	if cfg.MoE.ExpertInter, err = need("moe_intermediate_size", tc.MoEIntermediateSize); err != nil {
		return nil, err
	}
	if tc.SharedIntermediate != nil {
		if *tc.SharedIntermediate < 0 {
			return nil, fmt.Errorf("model: %s: shared_expert_intermediate_size %d is negative", path, *tc.SharedIntermediate)
		}
		cfg.MoE.SharedInter = *tc.SharedIntermediate
	}
	if tc.NormTopKProb != nil {
		cfg.MoE.NormTopK = *tc.NormTopKProb
	} else {
		switch tc.ModelType {
		case "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next":
			cfg.MoE.NormTopK = true
		}
	}
	get := func(v *int) int {
		if v == nil || *v < 0 || *v > maxConfigValue {
			return 0
		}
		return *v
	}
	cfg.Vocab = get(tc.VocabSize)
	if cfg.Vocab == 0 {
		cfg.Vocab = get(top.VocabSize)
	}
	cfg.MTPLayers = get(tc.MTPNumHiddenLayers)
	if cfg.MTPLayers == 0 {
		cfg.MTPLayers = get(top.MTPNumHiddenLayers)
	}
	cfg.AttnInner = get(tc.NumAttentionHeads) * get(tc.HeadDim)
	cfg.LinearValueDim = get(tc.LinearNumValueHeads) * get(tc.LinearValueHeadDim)
	if cfg.AttnInner > maxConfigValue || cfg.LinearValueDim > maxConfigValue || cfg.MTPLayers+cfg.Layers > maxConfigValue {
		return nil, fmt.Errorf("model: %s: attention widths %d / %d or %d+%d layers are implausibly large (limit %d)",
			path, cfg.AttnInner, cfg.LinearValueDim, cfg.Layers, cfg.MTPLayers, maxConfigValue)
	}
	if tc.LayerTypes != nil {
		if len(tc.LayerTypes) != cfg.Layers {
			return nil, fmt.Errorf("model: %s: layer_types has %d entries for %d layers", path, len(tc.LayerTypes), cfg.Layers)
		}
		cfg.LayerTypes = tc.LayerTypes
	}
	if err := cfg.MoE.Validate(); err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return cfg, nil
}
