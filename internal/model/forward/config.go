package forward

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Family is the model family a config.json describes. The zero value is
// invalid.
type Family int

// Supported families.
const (
	FamilyQwen35MoE   Family = iota + 1 // Qwen3.5/3.6 MoE (qwen3_5_moe, qwen3_5_moe_text)
	FamilyQwen3Next                     // Qwen3-Next (qwen3_next)
	FamilyQwen35Dense                   // dense Qwen3.5 (qwen3_5, qwen3_5_text)
)

func (f Family) String() string {
	switch f {
	case FamilyQwen35MoE:
		return "qwen3.5-moe"
	case FamilyQwen3Next:
		return "qwen3-next"
	case FamilyQwen35Dense:
		return "qwen3.5-dense"
	}
	return "Family(" + strconv.Itoa(int(f)) + ")"
}

// LayerKind is the token mixer of one decoder layer. The zero value is
// invalid.
type LayerKind int

// Layer kinds, spelled in config.json's layer_types as "linear_attention"
// and "full_attention".
const (
	LinearAttention LayerKind = iota + 1 // Gated DeltaNet
	FullAttention                        // gated softmax attention
)

func (k LayerKind) String() string {
	switch k {
	case LinearAttention:
		return "linear_attention"
	case FullAttention:
		return "full_attention"
	}
	return "LayerKind(" + strconv.Itoa(int(k)) + ")"
}

// Config is everything the forward pass needs from a Hugging Face
// config.json, with derived sizes. ReadConfig fills it; Validate checks it.
type Config struct {
	Family    Family
	ModelType string // the text model's model_type as written
	// Prefix is the trunk's tensor-name prefix, ending in a dot:
	// "model.language_model." (Qwen3.5/3.6) or "model." (Qwen3-Next).
	Prefix string

	Hidden int     // hidden_size
	Layers int     // num_hidden_layers (trunk)
	Vocab  int     // vocab_size (rows of the embedding and LM head)
	Eps    float64 // rms_norm_eps

	Kinds []LayerKind // one per trunk layer

	// Full attention.
	Heads, KVHeads, HeadDim int
	RopeTheta               float64
	RotaryDim               int // rotated dims per head: int(HeadDim · partial_rotary_factor), even

	// Gated DeltaNet.
	LinKeyHeads, LinValueHeads int
	LinKeyDim, LinValueDim     int
	ConvKernel                 int

	// Feed-forward.
	Experts, TopK     int  // 0 experts: no MoE anywhere
	ExpertInter       int  // moe_intermediate_size
	SharedInter       int  // shared_expert_intermediate_size (0: none)
	NormTopK          bool // renormalise the top-k router weights
	Intermediate      int  // intermediate_size: dense MLP width (dense layers only)
	DecoderSparseStep int  // Qwen3-Next: MoE iff (i+1) % step == 0
	MLPOnlyLayers     []int

	TieEmbeddings bool // lm_head shares embed_tokens
	MTPLayers     int  // mtp_num_hidden_layers
}

// KeyDim is the Gated DeltaNet key width (key heads × key head dim).
func (c *Config) KeyDim() int { return c.LinKeyHeads * c.LinKeyDim }

// ValueDim is the Gated DeltaNet value width.
func (c *Config) ValueDim() int { return c.LinValueHeads * c.LinValueDim }

// ConvDim is the number of convolved channels: q, k and v.
func (c *Config) ConvDim() int { return 2*c.KeyDim() + c.ValueDim() }

// NumLayers is the number of layer indices: trunk layers 0..Layers-1, then
// MTP layer k as Layers+k.
func (c *Config) NumLayers() int { return c.Layers + c.MTPLayers }

// Kind returns layer i's token mixer; MTP layers are full attention.
func (c *Config) Kind(i int) LayerKind {
	if i >= c.Layers {
		return FullAttention
	}
	return c.Kinds[i]
}

// IsMoE reports whether layer i (trunk or MTP) has the sparse MoE block
// rather than a dense SwiGLU MLP.
func (c *Config) IsMoE(i int) bool {
	switch c.Family {
	case FamilyQwen35Dense:
		return false
	case FamilyQwen3Next:
		if c.Experts == 0 {
			return false
		}
		if i >= c.Layers {
			return true // the MTP layer carries the trunk's MoE block
		}
		for _, l := range c.MLPOnlyLayers {
			if l == i {
				return false
			}
		}
		return (i+1)%c.DecoderSparseStep == 0
	}
	return true
}

// LayerPrefix returns the tensor-name prefix of layer i, ending in a dot.
func (c *Config) LayerPrefix(i int) string {
	if i >= c.Layers {
		return "mtp.layers." + strconv.Itoa(i-c.Layers) + "."
	}
	return c.Prefix + "layers." + strconv.Itoa(i) + "."
}

// rawConfig mirrors the config.json fields read; pointers tell absent from
// zero.
type rawConfig struct {
	ModelType             string          `json:"model_type"`
	TextConfig            *rawConfig      `json:"text_config"`
	HiddenSize            *int            `json:"hidden_size"`
	NumHiddenLayers       *int            `json:"num_hidden_layers"`
	VocabSize             *int            `json:"vocab_size"`
	RMSNormEps            *float64        `json:"rms_norm_eps"`
	LayerTypes            []string        `json:"layer_types"`
	FullAttentionInterval *int            `json:"full_attention_interval"`
	NumAttentionHeads     *int            `json:"num_attention_heads"`
	NumKeyValueHeads      *int            `json:"num_key_value_heads"`
	HeadDim               *int            `json:"head_dim"`
	RopeTheta             *float64        `json:"rope_theta"`
	PartialRotaryFactor   *float64        `json:"partial_rotary_factor"`
	RopeParameters        *ropeParams     `json:"rope_parameters"`
	RopeScaling           json.RawMessage `json:"rope_scaling"`
	LinearNumKeyHeads     *int            `json:"linear_num_key_heads"`
	LinearNumValueHeads   *int            `json:"linear_num_value_heads"`
	LinearKeyHeadDim      *int            `json:"linear_key_head_dim"`
	LinearValueHeadDim    *int            `json:"linear_value_head_dim"`
	LinearConvKernelDim   *int            `json:"linear_conv_kernel_dim"`
	NumExperts            *int            `json:"num_experts"`
	NumExpertsPerTok      *int            `json:"num_experts_per_tok"`
	MoEIntermediateSize   *int            `json:"moe_intermediate_size"`
	SharedIntermediate    *int            `json:"shared_expert_intermediate_size"`
	IntermediateSize      *int            `json:"intermediate_size"`
	NormTopKProb          *bool           `json:"norm_topk_prob"`
	DecoderSparseStep     *int            `json:"decoder_sparse_step"`
	MLPOnlyLayers         []int           `json:"mlp_only_layers"`
	TieWordEmbeddings     *bool           `json:"tie_word_embeddings"`
	MTPNumHiddenLayers    *int            `json:"mtp_num_hidden_layers"`
}

type ropeParams struct {
	RopeType            *string  `json:"rope_type"`
	Type                *string  `json:"type"`
	RopeTheta           *float64 `json:"rope_theta"`
	PartialRotaryFactor *float64 `json:"partial_rotary_factor"`
}

// maxDim bounds every size read from config.json so that a corrupt config
// is an error rather than a huge allocation.
const maxDim = 1 << 22

// ConfigError is a problem with config.json: the file, the field and what
// is wrong.
type ConfigError struct {
	Path, Field, Problem string
}

func (e *ConfigError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("forward: %s: %s", e.Path, e.Problem)
	}
	return fmt.Sprintf("forward: %s: %s: %s", e.Path, e.Field, e.Problem)
}

// ReadConfig reads dir/config.json (or the file path names) and returns
// the validated configuration. Qwen3.5/3.6 configs nest the text model in
// text_config; Qwen3-Next configs are flat.
func ReadConfig(path string) (*Config, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("forward: reading model config: %w", err)
	}
	return ParseConfig(raw, path)
}

// ParseConfig is ReadConfig on the bytes of a config.json; name is used in
// errors.
func ParseConfig(data []byte, name string) (*Config, error) {
	var top rawConfig
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, &ConfigError{Path: name, Problem: "not a JSON config: " + err.Error()}
	}
	tc := &top
	nested := top.TextConfig != nil
	if nested {
		tc = top.TextConfig
	}
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Path: name, Field: field, Problem: fmt.Sprintf(format, args...)}
	}
	c := &Config{ModelType: tc.ModelType}
	if c.ModelType == "" {
		c.ModelType = top.ModelType
	}
	switch c.ModelType {
	case "qwen3_5_moe", "qwen3_5_moe_text":
		c.Family = FamilyQwen35MoE
	case "qwen3_next":
		c.Family = FamilyQwen3Next
	case "qwen3_5", "qwen3_5_text":
		c.Family = FamilyQwen35Dense
	default:
		return nil, bad("model_type", "%q is not supported (want qwen3_5_moe, qwen3_5_moe_text, qwen3_next, qwen3_5 or qwen3_5_text)", c.ModelType)
	}
	c.Prefix = "model."
	if nested || c.Family != FamilyQwen3Next {
		c.Prefix = "model.language_model."
	}
	need := func(field string, v *int, dst *int) error {
		if v == nil {
			return bad(field, "missing")
		}
		if *v <= 0 || *v > maxDim {
			return bad(field, "%d outside 1..%d", *v, maxDim)
		}
		*dst = *v
		return nil
	}
	opt := func(field string, v *int, def int, dst *int) error {
		if v == nil {
			*dst = def
			return nil
		}
		if *v < 0 || *v > maxDim {
			return bad(field, "%d outside 0..%d", *v, maxDim)
		}
		*dst = *v
		return nil
	}
	for _, f := range []struct {
		name string
		v    *int
		dst  *int
	}{
		{"hidden_size", tc.HiddenSize, &c.Hidden},
		{"num_hidden_layers", tc.NumHiddenLayers, &c.Layers},
		{"vocab_size", tc.VocabSize, &c.Vocab},
		{"num_attention_heads", tc.NumAttentionHeads, &c.Heads},
		{"num_key_value_heads", tc.NumKeyValueHeads, &c.KVHeads},
		{"linear_num_key_heads", tc.LinearNumKeyHeads, &c.LinKeyHeads},
		{"linear_num_value_heads", tc.LinearNumValueHeads, &c.LinValueHeads},
		{"linear_key_head_dim", tc.LinearKeyHeadDim, &c.LinKeyDim},
		{"linear_value_head_dim", tc.LinearValueHeadDim, &c.LinValueDim},
		{"linear_conv_kernel_dim", tc.LinearConvKernelDim, &c.ConvKernel},
	} {
		v := f.v
		if v == nil && f.name == "vocab_size" {
			v = top.VocabSize
		}
		if err := need(f.name, v, f.dst); err != nil {
			return nil, err
		}
	}
	if tc.HeadDim != nil {
		if err := need("head_dim", tc.HeadDim, &c.HeadDim); err != nil {
			return nil, err
		}
	} else {
		c.HeadDim = c.Hidden / c.Heads
	}
	c.Eps = 1e-6
	if tc.RMSNormEps != nil {
		if !(*tc.RMSNormEps > 0 && *tc.RMSNormEps < 1) {
			return nil, bad("rms_norm_eps", "%g outside (0, 1)", *tc.RMSNormEps)
		}
		c.Eps = *tc.RMSNormEps
	}

	// Rotary embedding: only the default (unscaled) type is implemented.
	ropeType := "default"
	theta, partial := tc.RopeTheta, tc.PartialRotaryFactor
	if p := tc.RopeParameters; p != nil {
		if p.RopeType != nil {
			ropeType = *p.RopeType
		} else if p.Type != nil {
			ropeType = *p.Type
		}
		if p.RopeTheta != nil {
			theta = p.RopeTheta
		}
		if p.PartialRotaryFactor != nil {
			partial = p.PartialRotaryFactor
		}
	}
	if len(tc.RopeScaling) > 0 && string(tc.RopeScaling) != "null" {
		var rs ropeParams
		if err := json.Unmarshal(tc.RopeScaling, &rs); err != nil {
			return nil, bad("rope_scaling", "not an object: %v", err)
		}
		switch {
		case rs.RopeType != nil:
			ropeType = *rs.RopeType
		case rs.Type != nil:
			ropeType = *rs.Type
		default:
			ropeType = "unspecified scaling"
		}
	}
	if ropeType != "default" {
		return nil, bad("rope_parameters.rope_type", "%q is not supported (only \"default\"; YaRN and other scaled RoPE are not implemented)", ropeType)
	}
	c.RopeTheta = 10000
	if theta != nil {
		if !(*theta > 1) {
			return nil, bad("rope_theta", "%g must be greater than 1", *theta)
		}
		c.RopeTheta = *theta
	}
	pf := 0.25
	if partial != nil {
		pf = *partial
	}
	if !(pf > 0 && pf <= 1) {
		return nil, bad("partial_rotary_factor", "%g outside (0, 1]", pf)
	}
	c.RotaryDim = int(float64(c.HeadDim) * pf)
	if c.RotaryDim < 2 || c.RotaryDim%2 != 0 {
		return nil, bad("partial_rotary_factor", "rotary dimension %d (head_dim %d × %g) must be even and at least 2", c.RotaryDim, c.HeadDim, pf)
	}

	// Layer pattern.
	if tc.LayerTypes != nil {
		if len(tc.LayerTypes) != c.Layers {
			return nil, bad("layer_types", "%d entries for %d layers", len(tc.LayerTypes), c.Layers)
		}
		c.Kinds = make([]LayerKind, c.Layers)
		for i, s := range tc.LayerTypes {
			switch s {
			case "linear_attention":
				c.Kinds[i] = LinearAttention
			case "full_attention":
				c.Kinds[i] = FullAttention
			default:
				return nil, bad("layer_types", "entry %d is %q (want linear_attention or full_attention)", i, s)
			}
		}
	} else {
		var interval int
		if err := opt("full_attention_interval", tc.FullAttentionInterval, 4, &interval); err != nil {
			return nil, err
		}
		if interval == 0 {
			return nil, bad("full_attention_interval", "must be positive")
		}
		c.Kinds = make([]LayerKind, c.Layers)
		for i := range c.Kinds {
			c.Kinds[i] = LinearAttention
			if (i+1)%interval == 0 {
				c.Kinds[i] = FullAttention
			}
		}
	}

	// Feed-forward.
	switch c.Family {
	case FamilyQwen35MoE, FamilyQwen3Next:
		for _, f := range []struct {
			name string
			v    *int
			dst  *int
		}{
			{"num_experts", tc.NumExperts, &c.Experts},
			{"num_experts_per_tok", tc.NumExpertsPerTok, &c.TopK},
			{"moe_intermediate_size", tc.MoEIntermediateSize, &c.ExpertInter},
		} {
			if err := need(f.name, f.v, f.dst); err != nil {
				return nil, err
			}
		}
		if c.TopK > c.Experts {
			return nil, bad("num_experts_per_tok", "%d exceeds num_experts %d", c.TopK, c.Experts)
		}
		if err := opt("shared_expert_intermediate_size", tc.SharedIntermediate, 0, &c.SharedInter); err != nil {
			return nil, err
		}
		// Qwen3.5/3.6 has no switch and always renormalises; Qwen3-Next
		// reads norm_topk_prob, which its released config sets to true.
		c.NormTopK = true
		if c.Family == FamilyQwen3Next && tc.NormTopKProb != nil {
			c.NormTopK = *tc.NormTopKProb
		}
	}
	if c.Family == FamilyQwen3Next {
		if err := opt("decoder_sparse_step", tc.DecoderSparseStep, 1, &c.DecoderSparseStep); err != nil {
			return nil, err
		}
		if c.DecoderSparseStep == 0 {
			return nil, bad("decoder_sparse_step", "must be positive")
		}
		for _, l := range tc.MLPOnlyLayers {
			if l < 0 || l >= c.Layers {
				return nil, bad("mlp_only_layers", "layer %d outside 0..%d", l, c.Layers-1)
			}
		}
		c.MLPOnlyLayers = tc.MLPOnlyLayers
	}
	needDense := c.Family == FamilyQwen35Dense
	for i := 0; i < c.Layers && !needDense; i++ {
		needDense = !c.IsMoE(i)
	}
	if needDense {
		if err := need("intermediate_size", tc.IntermediateSize, &c.Intermediate); err != nil {
			return nil, err
		}
	} else if err := opt("intermediate_size", tc.IntermediateSize, 0, &c.Intermediate); err != nil {
		return nil, err
	}

	tie := tc.TieWordEmbeddings
	if tie == nil {
		tie = top.TieWordEmbeddings
	}
	c.TieEmbeddings = tie != nil && *tie
	mtp := tc.MTPNumHiddenLayers
	if mtp == nil {
		mtp = top.MTPNumHiddenLayers
	}
	if err := opt("mtp_num_hidden_layers", mtp, 0, &c.MTPLayers); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, &ConfigError{Path: name, Problem: err.Error()}
	}
	return c, nil
}

// Validate checks the relations between sizes that the forward pass
// relies on.
func (c *Config) Validate() error {
	switch {
	case c.Family < FamilyQwen35MoE || c.Family > FamilyQwen35Dense:
		return fmt.Errorf("unknown family %v", c.Family)
	case c.Hidden <= 0 || c.Layers <= 0 || c.Vocab <= 0:
		return fmt.Errorf("hidden %d, layers %d and vocab %d must be positive", c.Hidden, c.Layers, c.Vocab)
	case len(c.Kinds) != c.Layers:
		return fmt.Errorf("%d layer kinds for %d layers", len(c.Kinds), c.Layers)
	case c.Heads <= 0 || c.KVHeads <= 0 || c.Heads%c.KVHeads != 0:
		return fmt.Errorf("num_attention_heads %d must be a positive multiple of num_key_value_heads %d", c.Heads, c.KVHeads)
	case c.HeadDim <= 0 || c.RotaryDim > c.HeadDim:
		return fmt.Errorf("rotary dimension %d exceeds head_dim %d", c.RotaryDim, c.HeadDim)
	case c.LinKeyHeads <= 0 || c.LinValueHeads%c.LinKeyHeads != 0:
		return fmt.Errorf("linear_num_value_heads %d must be a multiple of linear_num_key_heads %d", c.LinValueHeads, c.LinKeyHeads)
	case c.LinKeyDim <= 0 || c.LinValueDim <= 0 || c.ConvKernel <= 0:
		return fmt.Errorf("linear head dims %d/%d and conv kernel %d must be positive", c.LinKeyDim, c.LinValueDim, c.ConvKernel)
	case c.MTPLayers < 0:
		return fmt.Errorf("negative MTP layer count %d", c.MTPLayers)
	}
	for i, k := range c.Kinds {
		if k != LinearAttention && k != FullAttention {
			return fmt.Errorf("layer %d has kind %v", i, k)
		}
	}
	if c.Family != FamilyQwen35Dense && (c.Experts <= 0 || c.TopK <= 0 || c.TopK > c.Experts || c.ExpertInter <= 0) {
		return fmt.Errorf("MoE geometry: %d experts, top-%d, width %d", c.Experts, c.TopK, c.ExpertInter)
	}
	return nil
}
