package model

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Arch is the architecture a config.json's model_type names (one row of
// modelTypes). The zero value is invalid.
type Arch int

// Supported architectures.
const (
	ArchQwen35MoE   Arch = iota + 1 // Qwen3.5/3.6 MoE (qwen3_5_moe, qwen3_5_moe_text)
	ArchQwen3Next                   // Qwen3-Next (qwen3_next)
	ArchQwen35Dense                 // dense Qwen3.5 (qwen3_5, qwen3_5_text)
)

func (a Arch) String() string {
	switch a {
	case ArchQwen35MoE:
		return "qwen3.5-moe"
	case ArchQwen3Next:
		return "qwen3-next"
	case ArchQwen35Dense:
		return "qwen3.5-dense"
	}
	return "Arch(" + strconv.Itoa(int(a)) + ")"
}

// modelTypes is the one table of the model_type values ttquant reads:
// which architecture each is. A model_type not in it is refused.
var modelTypes = []struct {
	name string
	arch Arch
}{
	{"qwen3_5_moe", ArchQwen35MoE},
	{"qwen3_5_moe_text", ArchQwen35MoE},
	{"qwen3_next", ArchQwen3Next},
	{"qwen3_5", ArchQwen35Dense},
	{"qwen3_5_text", ArchQwen35Dense},
}

// ModelTypes lists the model_type values the table accepts, in its order.
func ModelTypes() []string {
	out := make([]string, len(modelTypes))
	for i, t := range modelTypes {
		out[i] = t.name
	}
	return out
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

// MoEConfig describes one sparse mixture-of-experts block of the Qwen3 MoE
// family (Qwen3-Next, Qwen3.5/3.6-MoE): the view of Config the MoE block
// needs (Config.MoE).
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

// Config is the model description ttquant reads from a Hugging Face
// config.json: geometry, the kind of every layer, which layers have the
// sparse MoE block and which a dense SwiGLU MLP, and the MTP layers.
// ReadConfig (Family.ReadConfig) fills and validates it; the forward
// pass, plans, builds, calibration and evaluation all take it.
//
// Layer indices: trunk layers 0..Layers-1, then MTP layer k as Layers+k
// (NumLayers, LayerPrefix); calibration stores and the native manifest
// use the same numbering. An MTP layer has full attention and the
// trunk's MLP (the MoE block, or the dense MLP of a dense model).
type Config struct {
	Arch      Arch
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

	// Quantization is the quantization_config as written (the top level's,
	// else the text model's), nil when absent or null: a source that has
	// one is already quantized, and plans refuse it.
	Quantization json.RawMessage
}

// KeyDim is the Gated DeltaNet key width (key heads × key head dim).
func (c *Config) KeyDim() int { return c.LinKeyHeads * c.LinKeyDim }

// ValueDim is the Gated DeltaNet value width: the input width of
// linear_attn.out_proj.
func (c *Config) ValueDim() int { return c.LinValueHeads * c.LinValueDim }

// ConvDim is the number of convolved channels: q, k and v.
func (c *Config) ConvDim() int { return 2*c.KeyDim() + c.ValueDim() }

// AttnInner is the input width of self_attn.o_proj (heads × head_dim).
func (c *Config) AttnInner() int { return c.Heads * c.HeadDim }

// CheckTokens checks that every id of a token sequence is a row of the
// embedding: the one vocabulary check of calibration, evaluation and runs
// (the caller names the sequence).
func (c *Config) CheckTokens(ids []int32) error {
	for t, id := range ids {
		if id < 0 || int(id) >= c.Vocab {
			return fmt.Errorf("token %d: id %d outside the model's vocabulary 0..%d", t, id, c.Vocab-1)
		}
	}
	return nil
}

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
	switch c.Arch {
	case ArchQwen35Dense:
		return false
	case ArchQwen3Next:
		if c.Experts == 0 {
			return false
		}
		if i >= c.Layers {
			return true // the MTP layer carries the trunk's MoE block
		}
		if slices.Contains(c.MLPOnlyLayers, i) {
			return false
		}
		return (i+1)%c.DecoderSparseStep == 0
	}
	return true
}

// HasMoE reports whether any layer has the sparse MoE block.
func (c *Config) HasMoE() bool {
	for i := 0; i < c.NumLayers(); i++ {
		if c.IsMoE(i) {
			return true
		}
	}
	return false
}

// MoE returns the geometry of the model's MoE blocks (meaningful when
// HasMoE).
func (c *Config) MoE() MoEConfig {
	return MoEConfig{Hidden: c.Hidden, Experts: c.Experts, TopK: c.TopK, ExpertInter: c.ExpertInter, SharedInter: c.SharedInter, NormTopK: c.NormTopK}
}

// LayerPrefix returns the tensor-name prefix of layer i, ending in a dot:
// "model.language_model.layers.3." for a trunk layer, and for i >= Layers
// the MTP layer i-Layers, e.g. "mtp.layers.0.".
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
	QuantizationConfig    json.RawMessage `json:"quantization_config"`
}

type ropeParams struct {
	RopeType            *string  `json:"rope_type"`
	Type                *string  `json:"type"`
	RopeTheta           *float64 `json:"rope_theta"`
	PartialRotaryFactor *float64 `json:"partial_rotary_factor"`
}

// MaxConfigValue bounds every size read from config.json (widths, head
// counts, layer and expert counts) and the widths derived from them (q
// rows, conv channels). The largest such number in any released model is
// a vocabulary of a few hundred thousand rows (248,320 for Qwen3.5/3.6),
// four times below it, and a 2^20 × 2^20 matrix would already be 2 TiB of
// BF16: anything larger is a corrupt or hostile config, refused before it
// can size an allocation.
const MaxConfigValue = 1 << 20

// ConfigError is a problem with config.json: the file, the field and what
// is wrong.
type ConfigError struct {
	Path, Field, Problem string
}

func (e *ConfigError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("model: %s: %s", e.Path, e.Problem)
	}
	return fmt.Sprintf("model: %s: field %s %s", e.Path, e.Field, e.Problem)
}

// ReadConfig reads dir/config.json (or the file path names) and returns
// the validated configuration (see ParseConfig).
func ReadConfig(path string) (*Config, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model: reading model config: %w", err)
	}
	return ParseConfig(raw, path)
}

// ParseConfig is ReadConfig on the bytes of a config.json; name is used in
// errors, which are *ConfigError values naming the field. Qwen3.5/3.6
// configs nest the text model in text_config; Qwen3-Next configs are flat.
// The model_type (the text_config's, else the top level's) selects the
// architecture from one table (ModelTypes); every size is bounded by
// MaxConfigValue.
//
// norm_topk_prob: Qwen3.5/3.6 MoE always renormalises the top-k router
// weights (the architecture has no switch; the field is ignored);
// Qwen3-Next follows the field, which defaults to renormalising.
func ParseConfig(data []byte, name string) (*Config, error) {
	var top rawConfig
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, &ConfigError{Path: name, Problem: "not a JSON config: " + err.Error()}
	}
	p := &parser{name: name, top: &top, tc: &top}
	if top.TextConfig != nil {
		p.tc = top.TextConfig
	}
	c := &Config{ModelType: p.tc.ModelType}
	if c.ModelType == "" {
		c.ModelType = top.ModelType
	}
	for _, t := range modelTypes {
		if t.name == c.ModelType {
			c.Arch = t.arch
		}
	}
	if c.Arch == 0 {
		return nil, p.bad("model_type", "%q is not supported (want one of %s)", c.ModelType, strings.Join(ModelTypes(), ", "))
	}
	c.Prefix = "model."
	if top.TextConfig != nil || c.Arch != ArchQwen3Next {
		c.Prefix = "model.language_model."
	}
	for _, step := range []func(*Config) error{p.geometry, p.rope, p.kinds, p.feedForward, p.tail} {
		if err := step(c); err != nil {
			return nil, err
		}
	}
	if err := c.Validate(); err != nil {
		return nil, &ConfigError{Path: name, Problem: err.Error()}
	}
	return c, nil
}

// parser holds the state of one ParseConfig: the top level and the text
// model's section (the same for a flat config).
type parser struct {
	name    string
	top, tc *rawConfig
}

func (p *parser) bad(field, format string, args ...any) error {
	return &ConfigError{Path: p.name, Field: field, Problem: fmt.Sprintf(format, args...)}
}

// need reads a required positive size.
func (p *parser) need(field string, v *int, dst *int) error {
	switch {
	case v == nil:
		return p.bad(field, "missing")
	case *v <= 0:
		return p.bad(field, "= %d must be positive", *v)
	case *v > MaxConfigValue:
		return p.bad(field, "= %d is implausibly large (limit %d)", *v, MaxConfigValue)
	}
	*dst = *v
	return nil
}

// opt reads an optional non-negative size, def when absent.
func (p *parser) opt(field string, v *int, def int, dst *int) error {
	switch {
	case v == nil:
		*dst = def
		return nil
	case *v < 0:
		return p.bad(field, "= %d is negative", *v)
	case *v > MaxConfigValue:
		return p.bad(field, "= %d is implausibly large (limit %d)", *v, MaxConfigValue)
	}
	*dst = *v
	return nil
}

// geometry reads the widths, head counts and layer count.
func (p *parser) geometry(c *Config) error {
	tc := p.tc
	vocab := tc.VocabSize
	if vocab == nil {
		vocab = p.top.VocabSize
	}
	for _, f := range []struct {
		name string
		v    *int
		dst  *int
	}{
		{"hidden_size", tc.HiddenSize, &c.Hidden},
		{"num_hidden_layers", tc.NumHiddenLayers, &c.Layers},
		{"vocab_size", vocab, &c.Vocab},
		{"num_attention_heads", tc.NumAttentionHeads, &c.Heads},
		{"num_key_value_heads", tc.NumKeyValueHeads, &c.KVHeads},
		{"linear_num_key_heads", tc.LinearNumKeyHeads, &c.LinKeyHeads},
		{"linear_num_value_heads", tc.LinearNumValueHeads, &c.LinValueHeads},
		{"linear_key_head_dim", tc.LinearKeyHeadDim, &c.LinKeyDim},
		{"linear_value_head_dim", tc.LinearValueHeadDim, &c.LinValueDim},
		{"linear_conv_kernel_dim", tc.LinearConvKernelDim, &c.ConvKernel},
	} {
		if err := p.need(f.name, f.v, f.dst); err != nil {
			return err
		}
	}
	if tc.HeadDim != nil {
		if err := p.need("head_dim", tc.HeadDim, &c.HeadDim); err != nil {
			return err
		}
	} else {
		c.HeadDim = c.Hidden / c.Heads
	}
	// Derived widths size tensors too: bound them (in int64, so that the
	// check itself cannot overflow).
	if w := 2 * int64(c.Heads) * int64(c.HeadDim); w > MaxConfigValue {
		return p.bad("num_attention_heads", "× head_dim: attention width %d (%d × %d, doubled by the output gate) is implausibly large (limit %d)", w, c.Heads, c.HeadDim, MaxConfigValue)
	}
	if w := 2*int64(c.LinKeyHeads)*int64(c.LinKeyDim) + 2*int64(c.LinValueHeads)*int64(c.LinValueDim); w > MaxConfigValue {
		return p.bad("linear_num_value_heads", "× linear_value_head_dim: Gated DeltaNet width %d is implausibly large (limit %d)", w, MaxConfigValue)
	}
	c.Eps = 1e-6
	if tc.RMSNormEps != nil {
		if !(*tc.RMSNormEps > 0 && *tc.RMSNormEps < 1) {
			return p.bad("rms_norm_eps", "%g outside (0, 1)", *tc.RMSNormEps)
		}
		c.Eps = *tc.RMSNormEps
	}
	return nil
}

// rope reads the rotary embedding: only the default (unscaled) type is
// implemented.
func (p *parser) rope(c *Config) error {
	tc := p.tc
	ropeType := "default"
	theta, partial := tc.RopeTheta, tc.PartialRotaryFactor
	if rp := tc.RopeParameters; rp != nil {
		if rp.RopeType != nil {
			ropeType = *rp.RopeType
		} else if rp.Type != nil {
			ropeType = *rp.Type
		}
		if rp.RopeTheta != nil {
			theta = rp.RopeTheta
		}
		if rp.PartialRotaryFactor != nil {
			partial = rp.PartialRotaryFactor
		}
	}
	if len(tc.RopeScaling) > 0 && string(tc.RopeScaling) != "null" {
		var rs ropeParams
		if err := json.Unmarshal(tc.RopeScaling, &rs); err != nil {
			return p.bad("rope_scaling", "is not an object: %v", err)
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
		return p.bad("rope_parameters.rope_type", "%q is not supported (only \"default\"; YaRN and other scaled RoPE are not implemented)", ropeType)
	}
	c.RopeTheta = 10000
	if theta != nil {
		if !(*theta > 1) {
			return p.bad("rope_theta", "%g must be greater than 1", *theta)
		}
		c.RopeTheta = *theta
	}
	pf := 0.25
	if partial != nil {
		pf = *partial
	}
	if !(pf > 0 && pf <= 1) {
		return p.bad("partial_rotary_factor", "%g outside (0, 1]", pf)
	}
	c.RotaryDim = int(float64(c.HeadDim) * pf)
	if c.RotaryDim < 2 || c.RotaryDim%2 != 0 {
		return p.bad("partial_rotary_factor", "gives rotary dimension %d (head_dim %d × %g); it must be even and at least 2", c.RotaryDim, c.HeadDim, pf)
	}
	return nil
}

// kinds reads the layer pattern: layer_types, else every
// full_attention_interval-th layer full attention.
func (p *parser) kinds(c *Config) error {
	tc := p.tc
	c.Kinds = make([]LayerKind, c.Layers)
	if tc.LayerTypes != nil {
		if len(tc.LayerTypes) != c.Layers {
			return p.bad("layer_types", "has %d entries for %d layers", len(tc.LayerTypes), c.Layers)
		}
		for i, s := range tc.LayerTypes {
			switch s {
			case "linear_attention":
				c.Kinds[i] = LinearAttention
			case "full_attention":
				c.Kinds[i] = FullAttention
			default:
				return p.bad("layer_types", "entry %d is %q (want linear_attention or full_attention)", i, s)
			}
		}
		return nil
	}
	var interval int
	if err := p.opt("full_attention_interval", tc.FullAttentionInterval, 4, &interval); err != nil {
		return err
	}
	if interval == 0 {
		return p.bad("full_attention_interval", "must be positive")
	}
	for i := range c.Kinds {
		c.Kinds[i] = LinearAttention
		if (i+1)%interval == 0 {
			c.Kinds[i] = FullAttention
		}
	}
	return nil
}

// feedForward reads the MoE geometry (MoE architectures), Qwen3-Next's
// layer pattern of MoE and dense layers, and the dense MLP width when any
// layer is dense.
func (p *parser) feedForward(c *Config) error {
	tc := p.tc
	if c.Arch == ArchQwen35MoE || c.Arch == ArchQwen3Next {
		for _, f := range []struct {
			name string
			v    *int
			dst  *int
		}{
			{"num_experts", tc.NumExperts, &c.Experts},
			{"num_experts_per_tok", tc.NumExpertsPerTok, &c.TopK},
			{"moe_intermediate_size", tc.MoEIntermediateSize, &c.ExpertInter},
		} {
			if err := p.need(f.name, f.v, f.dst); err != nil {
				return err
			}
		}
		if c.TopK > c.Experts {
			return p.bad("num_experts_per_tok", "is top-k %d outside 1..%d experts (num_experts)", c.TopK, c.Experts)
		}
		if err := p.opt("shared_expert_intermediate_size", tc.SharedIntermediate, 0, &c.SharedInter); err != nil {
			return err
		}
		// Qwen3.5/3.6 has no switch and always renormalises; Qwen3-Next
		// reads norm_topk_prob, which its released config sets to true.
		c.NormTopK = true
		if c.Arch == ArchQwen3Next && tc.NormTopKProb != nil {
			c.NormTopK = *tc.NormTopKProb
		}
	}
	if c.Arch == ArchQwen3Next {
		if err := p.opt("decoder_sparse_step", tc.DecoderSparseStep, 1, &c.DecoderSparseStep); err != nil {
			return err
		}
		if c.DecoderSparseStep == 0 {
			return p.bad("decoder_sparse_step", "must be positive")
		}
		for _, l := range tc.MLPOnlyLayers {
			if l < 0 || l >= c.Layers {
				return p.bad("mlp_only_layers", "names layer %d outside 0..%d", l, c.Layers-1)
			}
		}
		c.MLPOnlyLayers = tc.MLPOnlyLayers
	}
	needDense := c.Arch == ArchQwen35Dense
	for i := 0; i < c.Layers && !needDense; i++ {
		needDense = !c.IsMoE(i)
	}
	if needDense {
		return p.need("intermediate_size", tc.IntermediateSize, &c.Intermediate)
	}
	return p.opt("intermediate_size", tc.IntermediateSize, 0, &c.Intermediate)
}

// tail reads the head's tying and the MTP layers (either level).
func (p *parser) tail(c *Config) error {
	tie := p.tc.TieWordEmbeddings
	if tie == nil {
		tie = p.top.TieWordEmbeddings
	}
	c.TieEmbeddings = tie != nil && *tie
	q := p.top.QuantizationConfig
	if len(q) == 0 {
		q = p.tc.QuantizationConfig
	}
	if len(q) > 0 && string(q) != "null" {
		c.Quantization = q
	}
	mtp := p.tc.MTPNumHiddenLayers
	if mtp == nil {
		mtp = p.top.MTPNumHiddenLayers
	}
	if err := p.opt("mtp_num_hidden_layers", mtp, 0, &c.MTPLayers); err != nil {
		return err
	}
	if c.Layers+c.MTPLayers > MaxConfigValue {
		return p.bad("mtp_num_hidden_layers", "= %d with %d trunk layers is implausibly large (limit %d)", c.MTPLayers, c.Layers, MaxConfigValue)
	}
	return nil
}

// Validate checks the relations between sizes that the forward pass and
// the builders rely on (ReadConfig calls it; a Config built by hand should
// too).
func (c *Config) Validate() error {
	switch {
	case c.Arch < ArchQwen35MoE || c.Arch > ArchQwen35Dense:
		return fmt.Errorf("unknown architecture %v", c.Arch)
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
	if c.Arch != ArchQwen35Dense {
		if err := c.MoE().Validate(); err != nil {
			return err
		}
	}
	if c.Intermediate <= 0 {
		for i := 0; i < c.NumLayers(); i++ {
			if !c.IsMoE(i) {
				return fmt.Errorf("layer %d has a dense MLP of width %d (intermediate_size): it must be positive", i, c.Intermediate)
			}
		}
	}
	return nil
}
