package model

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/safetensors"
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
// norm_topk_prob: Qwen3.5/3.6 MoE always renormalises the top-k router
// weights (the architecture has no switch; a norm_topk_prob field is
// ignored); Qwen3-Next and plain Qwen3-MoE follow the field, which
// defaults to renormalising for Qwen3-Next and not for Qwen3-MoE.
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
	switch {
	case tc.ModelType == "qwen3_5_moe" || tc.ModelType == "qwen3_5_moe_text":
		// The Qwen3.5/3.6 router has no switch: it always renormalises, and
		// a norm_topk_prob in such a config is ignored by the model (as the
		// forward pass ignores it).
		cfg.MoE.NormTopK = true
	case tc.NormTopKProb != nil:
		cfg.MoE.NormTopK = *tc.NormTopKProb
	case tc.ModelType == "qwen3_next":
		cfg.MoE.NormTopK = true
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

// CheckTensors compares the configuration with a model's tensor headers
// (no tensor data is read): the number of trunk and MTP layers, the
// embedding width, and in every MoE block the router, routed expert and
// shared expert shapes. The error names the first tensor that disagrees,
// its shape and what the configuration implies.
func (c *Config) CheckTensors(m *safetensors.Model) error {
	trunk := c.TensorPrefix + ".layers."
	maxTrunk, maxMTP := -1, -1
	for _, name := range m.Names() {
		if rest, ok := strings.CutPrefix(name, trunk); ok {
			if i, ok := leadingIndex(rest); ok {
				maxTrunk = max(maxTrunk, i)
			}
		} else if rest, ok := strings.CutPrefix(name, "mtp.layers."); ok {
			if i, ok := leadingIndex(rest); ok {
				maxMTP = max(maxMTP, i)
			}
		}
	}
	if maxTrunk < 0 {
		return fmt.Errorf("model: config.json describes a %s model with %d layers under %q; the checkpoint has no tensor named %s0.…", c.ModelType, c.Layers, trunk, trunk)
	}
	if maxTrunk+1 != c.Layers {
		return fmt.Errorf("model: config.json says num_hidden_layers = %d; the tensors have layers 0..%d under %q", c.Layers, maxTrunk, trunk)
	}
	if c.MTPLayers > 0 && maxMTP+1 != c.MTPLayers {
		return fmt.Errorf("model: config.json says mtp_num_hidden_layers = %d; the tensors have %d MTP layers", c.MTPLayers, maxMTP+1)
	}
	h := int64(c.MoE.Hidden)
	if _, ti, ok := m.Lookup(c.TensorPrefix + ".embed_tokens.weight"); ok {
		want := []int64{int64(c.Vocab), h}
		if c.Vocab == 0 {
			want[0] = -1
		}
		if len(ti.Shape) != 2 || ti.Shape[1] != h || (want[0] >= 0 && ti.Shape[0] != want[0]) {
			return shapeError(c.TensorPrefix+".embed_tokens.weight", ti.Shape, want, "vocab_size, hidden_size")
		}
	}
	for l := 0; l < c.NumLayers(); l++ {
		if err := c.checkMoEBlock(m, c.LayerPrefix(l)+"mlp."); err != nil {
			return err
		}
	}
	return nil
}

// checkMoEBlock checks one MoE block's shapes; a layer without a router
// and without routed experts is not an MoE layer and is skipped.
func (c *Config) checkMoEBlock(m *safetensors.Model, prefix string) error {
	mc := c.MoE
	h, e, in, s := int64(mc.Hidden), int64(mc.Experts), int64(mc.ExpertInter), int64(mc.SharedInter)
	shapeOf := func(name string) ([]int64, bool) {
		_, ti, ok := m.Lookup(name)
		return ti.Shape, ok
	}
	expect := func(name, fields string, want ...int64) error {
		got, ok := shapeOf(name)
		if !ok {
			return fmt.Errorf("model: the checkpoint has no tensor %s, which config.json (%s) implies", name, fields)
		}
		if !slices.Equal(got, want) {
			return shapeError(name, got, want, fields)
		}
		return nil
	}
	_, hasRouter := shapeOf(prefix + "gate.weight")
	_, fused := shapeOf(prefix + "experts.gate_up_proj")
	_, perExpert := shapeOf(prefix + "experts.0.gate_proj.weight")
	if !hasRouter && !fused && !perExpert {
		return nil
	}
	if err := expect(prefix+"gate.weight", "num_experts, hidden_size", e, h); err != nil {
		return err
	}
	if fused {
		if err := expect(prefix+"experts.gate_up_proj", "num_experts, 2×moe_intermediate_size, hidden_size", e, 2*in, h); err != nil {
			return err
		}
		if err := expect(prefix+"experts.down_proj", "num_experts, hidden_size, moe_intermediate_size", e, h, in); err != nil {
			return err
		}
	} else {
		for x := int64(0); x < e; x++ {
			p := fmt.Sprintf("%sexperts.%d.", prefix, x)
			for _, kind := range []string{"gate_proj", "up_proj"} {
				if err := expect(p+kind+".weight", "moe_intermediate_size, hidden_size", in, h); err != nil {
					return err
				}
			}
			if err := expect(p+"down_proj.weight", "hidden_size, moe_intermediate_size", h, in); err != nil {
				return err
			}
		}
		if _, extra := shapeOf(fmt.Sprintf("%sexperts.%d.gate_proj.weight", prefix, e)); extra {
			return fmt.Errorf("model: the checkpoint has expert %d in %s; config.json says num_experts = %d", e, prefix, e)
		}
	}
	if s > 0 {
		for _, kind := range []string{"gate_proj", "up_proj"} {
			if err := expect(prefix+"shared_expert."+kind+".weight", "shared_expert_intermediate_size, hidden_size", s, h); err != nil {
				return err
			}
		}
		if err := expect(prefix+"shared_expert.down_proj.weight", "hidden_size, shared_expert_intermediate_size", h, s); err != nil {
			return err
		}
	} else if _, ok := shapeOf(prefix + "shared_expert.gate_proj.weight"); ok {
		return fmt.Errorf("model: the checkpoint has a shared expert in %s; config.json gives no shared_expert_intermediate_size", prefix)
	}
	return nil
}

func shapeError(name string, got, want []int64, fields string) error {
	w := make([]string, len(want))
	for i, d := range want {
		if d < 0 {
			w[i] = "?"
		} else {
			w[i] = strconv.FormatInt(d, 10)
		}
	}
	return fmt.Errorf("model: tensor %s has shape %v; config.json (%s) implies [%s]", name, got, fields, strings.Join(w, " "))
}

// leadingIndex parses the layer index at the start of "N.rest".
func leadingIndex(s string) (int, bool) {
	d, _, ok := strings.Cut(s, ".")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(d)
	return i, err == nil && i >= 0 && strconv.Itoa(i) == d
}
