package testmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// LayerType is the attention kind of one decoder layer, spelled as in the
// `layer_types` list of config.json.
type LayerType string

// Layer types of the hybrid Qwen3.5/3.6 stack.
const (
	LinearAttention LayerType = "linear_attention" // Gated DeltaNet
	FullAttention   LayerType = "full_attention"   // gated softmax attention
)

// Config describes a Qwen3.5/3.6-MoE-shaped text model: the dimensions that
// decide every tensor shape, the routing parameters, and the special token
// ids written into config.json. Tiny and Qwen36_35B return the two built-in
// profiles.
type Config struct {
	// Name identifies the profile ("tiny", "qwen3.6-35b-a3b").
	Name string

	Hidden     int         // hidden_size
	Layers     int         // num_hidden_layers (MTP layers excluded)
	LayerTypes []LayerType // one entry per layer
	// FullAttentionInterval is written to config.json; LayerTypes is authoritative.
	FullAttentionInterval int

	Heads          int  // num_attention_heads
	KVHeads        int  // num_key_value_heads
	HeadDim        int  // head_dim
	AttnOutputGate bool // q_proj carries a per-head sigmoid gate (doubles its rows)

	// PartialRotaryFactor is the fraction of head_dim that is rotated.
	PartialRotaryFactor float64
	MRopeSection        []int // mrope_section; sums to rotary dim / 2
	RopeTheta           float64

	LinearKeyHeads     int // linear_num_key_heads
	LinearValueHeads   int // linear_num_value_heads
	LinearKeyHeadDim   int // linear_key_head_dim
	LinearValueHeadDim int // linear_value_head_dim
	ConvKernel         int // linear_conv_kernel_dim

	Experts            int // num_experts (routed)
	TopK               int // num_experts_per_tok
	MoEIntermediate    int // moe_intermediate_size: routed expert width
	SharedIntermediate int // shared_expert_intermediate_size
	// NormTopKProb says whether the router renormalises the top-k
	// probabilities. Qwen3.5/3.6 always does and omits the field from
	// config.json; WriteNormTopKProb controls whether it is written.
	NormTopKProb      bool
	WriteNormTopKProb bool

	Vocab        int // vocab_size
	MTPLayers    int // mtp_num_hidden_layers
	RMSNormEps   float64
	MaxPositions int // max_position_embeddings

	// Special token ids written to config.json.
	BOSToken, EOSToken                   int
	ImageToken, VideoToken               int
	VisionStartToken, VisionEndToken     int
	VisionDepth, VisionHidden, VisionOut int // tiny vision_config (the real one is larger)

	// Qwen3Next switches to the Qwen3-Next-80B-A3B flavour: trunk prefix
	// `model.`, fused Gated DeltaNet projections `in_proj_qkvz` and
	// `in_proj_ba`, per-expert routed experts only, no vision tower, and a
	// flat config.json (model_type qwen3_next) with norm_topk_prob.
	Qwen3Next bool

	// Dense switches to the dense Qwen3.5 flavour: a SwiGLU MLP
	// (mlp.{gate,up,down}_proj of width Intermediate) in every layer and
	// the MTP layer instead of the MoE block, model_type qwen3_5 /
	// qwen3_5_text, and no MoE keys in config.json. The MoE fields are
	// ignored.
	Dense        bool
	Intermediate int // intermediate_size (Dense only)

	// VisionStubs adds three `model.visual.*` tensors (one of rank 5) to
	// the generated checkpoint, to exercise pass-through of non-text
	// tensors. Off in both built-in profiles.
	VisionStubs bool
}

// hybridLayers returns n layer types where layer i is full attention when
// (i+1) % interval == 0.
func hybridLayers(n, interval int) []LayerType {
	t := make([]LayerType, n)
	for i := range t {
		if (i+1)%interval == 0 {
			t[i] = FullAttention
		} else {
			t[i] = LinearAttention
		}
	}
	return t
}

// Tiny returns the tiny Qwen3.6-MoE profile: hidden 256, 4 layers (three
// linear-attention layers then one full-attention layer), 8/2 heads of 64,
// Gated DeltaNet with 4 key and 8 value heads of 64, 16 experts of width 64
// with top-4 routing, a shared expert of width 128, vocabulary 768 and one
// MTP layer. The dimensions are small and deliberately distinct so that
// transpositions and mix-ups fail loudly; their ratios mirror the real
// model (heads·head_dim = 2·hidden, value heads = 2·key heads, expert width
// = hidden/4). The fused layout has 91 tensors, 14,977,936 bytes of data.
func Tiny() Config {
	return Config{
		Name:                  "tiny",
		Hidden:                256,
		Layers:                4,
		LayerTypes:            hybridLayers(4, 4),
		FullAttentionInterval: 4,
		Heads:                 8,
		KVHeads:               2,
		HeadDim:               64,
		AttnOutputGate:        true,
		PartialRotaryFactor:   0.25,
		MRopeSection:          []int{3, 3, 2},
		RopeTheta:             1e7,
		LinearKeyHeads:        4,
		LinearValueHeads:      8,
		LinearKeyHeadDim:      64,
		LinearValueHeadDim:    64,
		ConvKernel:            4,
		Experts:               16,
		TopK:                  4,
		MoEIntermediate:       64,
		SharedIntermediate:    128,
		NormTopKProb:          true,
		Vocab:                 768,
		MTPLayers:             1,
		RMSNormEps:            1e-6,
		MaxPositions:          4096,
		BOSToken:              752,
		EOSToken:              752,
		VisionStartToken:      761,
		VisionEndToken:        762,
		ImageToken:            764,
		VideoToken:            765,
		VisionDepth:           1,
		VisionHidden:          32,
		VisionOut:             256,
	}
}

// Micro returns a smaller profile of the same structure for fast unit
// tests: hidden 64, 4 layers (3 linear, 1 full), 4/2 heads of 32, Gated
// DeltaNet 2/4 heads of 16, 8 experts of width 32 with top-2 routing, a
// shared expert of width 32, vocabulary 128 and one MTP layer.
func Micro() Config {
	c := Tiny()
	c.Name = "micro"
	c.Hidden = 64
	c.Heads, c.KVHeads, c.HeadDim = 4, 2, 32
	c.MRopeSection = []int{2, 1, 1}
	c.LinearKeyHeads, c.LinearValueHeads = 2, 4
	c.LinearKeyHeadDim, c.LinearValueHeadDim = 16, 16
	c.Experts, c.TopK = 8, 2
	c.MoEIntermediate, c.SharedIntermediate = 32, 32
	c.Vocab = 128
	c.BOSToken, c.EOSToken = 112, 112
	c.VisionStartToken, c.VisionEndToken, c.ImageToken, c.VideoToken = 121, 122, 124, 125
	c.VisionOut = 64
	return c
}

// Qwen36_35B returns the text configuration of the released
// Qwen3.6-35B-A3B: hidden 2048, 40 layers (every fourth full attention),
// 16/2 heads of 256, Gated DeltaNet 16/32 heads of 128, 256 experts of
// width 512 with top-8 routing, a shared expert of width 512, vocabulary
// 248,320 and one MTP layer: 712 text tensors, about 71 GB in BF16.
func Qwen36_35B() Config {
	return Config{
		Name:                  "qwen3.6-35b-a3b",
		Hidden:                2048,
		Layers:                40,
		LayerTypes:            hybridLayers(40, 4),
		FullAttentionInterval: 4,
		Heads:                 16,
		KVHeads:               2,
		HeadDim:               256,
		AttnOutputGate:        true,
		PartialRotaryFactor:   0.25,
		MRopeSection:          []int{11, 11, 10},
		RopeTheta:             1e7,
		LinearKeyHeads:        16,
		LinearValueHeads:      32,
		LinearKeyHeadDim:      128,
		LinearValueHeadDim:    128,
		ConvKernel:            4,
		Experts:               256,
		TopK:                  8,
		MoEIntermediate:       512,
		SharedIntermediate:    512,
		NormTopKProb:          true,
		Vocab:                 248320,
		MTPLayers:             1,
		RMSNormEps:            1e-6,
		MaxPositions:          262144,
		BOSToken:              248044,
		EOSToken:              248044,
		VisionStartToken:      248053,
		VisionEndToken:        248054,
		ImageToken:            248056,
		VideoToken:            248057,
		VisionDepth:           27,
		VisionHidden:          1152,
		VisionOut:             2048,
	}
}

// DenseTiny returns the tiny profile in the dense Qwen3.5 flavour: the
// geometry of Tiny with a SwiGLU MLP of width 512 (2·hidden) in every layer and
// the MTP layer.
func DenseTiny() Config {
	c := Tiny()
	c.Name = "tiny-dense"
	c.Dense = true
	c.Intermediate = 512
	c.Experts, c.TopK, c.MoEIntermediate, c.SharedIntermediate, c.NormTopKProb = 0, 0, 0, 0, false
	return c
}

// Qwen35_27B returns the text configuration of a Qwen3.5-27B-shaped dense
// model: hidden 5120, 64 layers (every fourth full attention), 24/4
// heads of 256, Gated DeltaNet 16/48 heads of 128, a dense MLP of width
// 17,408 in every layer, vocabulary 248,320 and one MTP layer.
func Qwen35_27B() Config {
	c := Qwen36_35B()
	c.Name = "qwen3.5-27b"
	c.Hidden = 5120
	c.Layers = 64
	c.LayerTypes = hybridLayers(64, 4)
	c.Heads, c.KVHeads, c.HeadDim = 24, 4, 256
	c.LinearKeyHeads, c.LinearValueHeads = 16, 48
	c.Dense = true
	c.Intermediate = 17408
	c.Experts, c.TopK, c.MoEIntermediate, c.SharedIntermediate, c.NormTopKProb = 0, 0, 0, 0, false
	c.VisionOut = 5120
	return c
}

// Qwen3NextTiny returns the tiny profile in the Qwen3-Next flavour.
func Qwen3NextTiny() Config {
	c := Tiny()
	c.Name = "tiny-qwen3-next"
	c.Qwen3Next = true
	c.WriteNormTopKProb = true
	return c
}

// Prefix returns the trunk name prefix: TrunkPrefix, or "model." for the
// Qwen3-Next flavour.
func (c Config) Prefix() string {
	if c.Qwen3Next {
		return "model."
	}
	return TrunkPrefix
}

// KeyDim is the Gated DeltaNet key width (key heads × key head dim).
func (c Config) KeyDim() int { return c.LinearKeyHeads * c.LinearKeyHeadDim }

// ValueDim is the Gated DeltaNet value width (value heads × value head dim).
func (c Config) ValueDim() int { return c.LinearValueHeads * c.LinearValueHeadDim }

// ConvDim is the number of depthwise conv channels: q, k and v.
func (c Config) ConvDim() int { return 2*c.KeyDim() + c.ValueDim() }

// QRows is the number of rows of q_proj: heads × head_dim, doubled when
// the attention output gate is on (per head: head_dim query rows then
// head_dim gate rows).
func (c Config) QRows() int {
	r := c.Heads * c.HeadDim
	if c.AttnOutputGate {
		r *= 2
	}
	return r
}

// KVRows is the number of rows of k_proj and v_proj.
func (c Config) KVRows() int { return c.KVHeads * c.HeadDim }

// Validate reports the first inconsistency of c, naming the field.
func (c Config) Validate() error {
	pos := []struct {
		name string
		v    int
	}{
		{"Hidden", c.Hidden}, {"Layers", c.Layers}, {"Heads", c.Heads}, {"KVHeads", c.KVHeads},
		{"HeadDim", c.HeadDim}, {"LinearKeyHeads", c.LinearKeyHeads},
		{"LinearValueHeads", c.LinearValueHeads}, {"LinearKeyHeadDim", c.LinearKeyHeadDim},
		{"LinearValueHeadDim", c.LinearValueHeadDim}, {"ConvKernel", c.ConvKernel},
		{"Vocab", c.Vocab},
	}
	if c.Dense {
		pos = append(pos, struct {
			name string
			v    int
		}{"Intermediate", c.Intermediate})
	} else {
		pos = append(pos, []struct {
			name string
			v    int
		}{{"Experts", c.Experts}, {"TopK", c.TopK}, {"MoEIntermediate", c.MoEIntermediate}, {"SharedIntermediate", c.SharedIntermediate}}...)
	}
	for _, p := range pos {
		if p.v <= 0 {
			return fmt.Errorf("testmodel: config %q: %s = %d, want > 0", c.Name, p.name, p.v)
		}
	}
	if len(c.LayerTypes) != c.Layers {
		return fmt.Errorf("testmodel: config %q: %d layer types for %d layers", c.Name, len(c.LayerTypes), c.Layers)
	}
	for i, t := range c.LayerTypes {
		if t != LinearAttention && t != FullAttention {
			return fmt.Errorf("testmodel: config %q: layer %d has unknown type %q", c.Name, i, t)
		}
	}
	if c.Dense && c.Qwen3Next {
		return fmt.Errorf("testmodel: config %q: the dense flavour is Qwen3.5, not Qwen3-Next", c.Name)
	}
	if !c.Dense && c.TopK > c.Experts {
		return fmt.Errorf("testmodel: config %q: top-k %d exceeds %d experts", c.Name, c.TopK, c.Experts)
	}
	if c.LinearValueHeads%c.LinearKeyHeads != 0 {
		return fmt.Errorf("testmodel: config %q: %d value heads not a multiple of %d key heads", c.Name, c.LinearValueHeads, c.LinearKeyHeads)
	}
	if c.Heads%c.KVHeads != 0 {
		return fmt.Errorf("testmodel: config %q: %d heads not a multiple of %d kv heads", c.Name, c.Heads, c.KVHeads)
	}
	if c.Qwen3Next && c.VisionStubs {
		return fmt.Errorf("testmodel: config %q: the Qwen3-Next flavour has no vision tower", c.Name)
	}
	if c.MTPLayers < 0 {
		return fmt.Errorf("testmodel: config %q: MTPLayers = %d", c.Name, c.MTPLayers)
	}
	return nil
}

// IsFull reports whether decoder layer i is a full-attention layer.
func (c Config) IsFull(i int) bool { return c.LayerTypes[i] == FullAttention }

// ConfigJSON returns the config.json of the checkpoint: the nested
// Qwen3.5/3.6 MoE layout (`text_config` plus a small `vision_config`),
// deterministic bytes ending in a newline. When fp8 is true a
// quantization_config describing block-128 FP8 weights is added.
//
// It is long by design: one literal of config.json's keys in their order.
func (c Config) ConfigJSON(fp8 bool) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	type ropeParams struct {
		RopeType            string  `json:"rope_type"`
		RopeTheta           float64 `json:"rope_theta"`
		PartialRotaryFactor float64 `json:"partial_rotary_factor"`
		MRopeInterleaved    bool    `json:"mrope_interleaved"`
		MRopeSection        []int   `json:"mrope_section"`
	}
	type textConfig struct {
		AttnOutputGate            bool        `json:"attn_output_gate"`
		BOSTokenID                int         `json:"bos_token_id"`
		DType                     string      `json:"dtype"`
		EOSTokenID                int         `json:"eos_token_id"`
		FullAttentionInterval     int         `json:"full_attention_interval"`
		HeadDim                   int         `json:"head_dim"`
		HiddenAct                 string      `json:"hidden_act"`
		HiddenSize                int         `json:"hidden_size"`
		IntermediateSize          int         `json:"intermediate_size,omitempty"`
		LayerTypes                []LayerType `json:"layer_types"`
		LinearConvKernelDim       int         `json:"linear_conv_kernel_dim"`
		LinearKeyHeadDim          int         `json:"linear_key_head_dim"`
		LinearNumKeyHeads         int         `json:"linear_num_key_heads"`
		LinearNumValueHeads       int         `json:"linear_num_value_heads"`
		LinearValueHeadDim        int         `json:"linear_value_head_dim"`
		MambaSSMDType             string      `json:"mamba_ssm_dtype"`
		MaxPositionEmbeddings     int         `json:"max_position_embeddings"`
		ModelType                 string      `json:"model_type"`
		MoEIntermediateSize       *int        `json:"moe_intermediate_size,omitempty"`
		MTPNumHiddenLayers        int         `json:"mtp_num_hidden_layers"`
		MTPUseDedicatedEmbeddings bool        `json:"mtp_use_dedicated_embeddings"`
		NormTopKProb              *bool       `json:"norm_topk_prob,omitempty"`
		NumAttentionHeads         int         `json:"num_attention_heads"`
		NumExperts                *int        `json:"num_experts,omitempty"`
		NumExpertsPerTok          *int        `json:"num_experts_per_tok,omitempty"`
		NumHiddenLayers           int         `json:"num_hidden_layers"`
		NumKeyValueHeads          int         `json:"num_key_value_heads"`
		OutputRouterLogits        *bool       `json:"output_router_logits,omitempty"`
		PartialRotaryFactor       float64     `json:"partial_rotary_factor"`
		RMSNormEps                float64     `json:"rms_norm_eps"`
		RopeParameters            ropeParams  `json:"rope_parameters"`
		RouterAuxLossCoef         *float64    `json:"router_aux_loss_coef,omitempty"`
		SharedExpertIntermediate  *int        `json:"shared_expert_intermediate_size,omitempty"`
		TieWordEmbeddings         bool        `json:"tie_word_embeddings"`
		VocabSize                 int         `json:"vocab_size"`
	}
	type visionConfig struct {
		Depth             int `json:"depth"`
		HiddenSize        int `json:"hidden_size"`
		OutHiddenSize     int `json:"out_hidden_size"`
		PatchSize         int `json:"patch_size"`
		SpatialMergeSize  int `json:"spatial_merge_size"`
		TemporalPatchSize int `json:"temporal_patch_size"`
	}
	type quantConfig struct {
		ActivationScheme string `json:"activation_scheme"`
		Fmt              string `json:"fmt"`
		QuantMethod      string `json:"quant_method"`
		WeightBlockSize  []int  `json:"weight_block_size"`
	}
	type top struct {
		Architectures      []string     `json:"architectures"`
		ImageTokenID       int          `json:"image_token_id"`
		ModelType          string       `json:"model_type"`
		QuantizationConfig *quantConfig `json:"quantization_config,omitempty"`
		TextConfig         textConfig   `json:"text_config"`
		TieWordEmbeddings  bool         `json:"tie_word_embeddings"`
		VideoTokenID       int          `json:"video_token_id"`
		VisionConfig       visionConfig `json:"vision_config"`
		VisionEndTokenID   int          `json:"vision_end_token_id"`
		VisionStartTokenID int          `json:"vision_start_token_id"`
	}
	var ntp *bool
	if c.WriteNormTopKProb {
		v := c.NormTopKProb
		ntp = &v
	}
	doc := top{
		Architectures: []string{"Qwen3_5MoeForConditionalGeneration"},
		ImageTokenID:  c.ImageToken,
		ModelType:     "qwen3_5_moe",
		TextConfig: textConfig{
			AttnOutputGate:            c.AttnOutputGate,
			BOSTokenID:                c.BOSToken,
			DType:                     "bfloat16",
			EOSTokenID:                c.EOSToken,
			FullAttentionInterval:     c.FullAttentionInterval,
			HeadDim:                   c.HeadDim,
			HiddenAct:                 "silu",
			HiddenSize:                c.Hidden,
			LayerTypes:                c.LayerTypes,
			LinearConvKernelDim:       c.ConvKernel,
			LinearKeyHeadDim:          c.LinearKeyHeadDim,
			LinearNumKeyHeads:         c.LinearKeyHeads,
			LinearNumValueHeads:       c.LinearValueHeads,
			LinearValueHeadDim:        c.LinearValueHeadDim,
			MambaSSMDType:             "float32",
			MaxPositionEmbeddings:     c.MaxPositions,
			ModelType:                 "qwen3_5_moe_text",
			MTPNumHiddenLayers:        c.MTPLayers,
			MTPUseDedicatedEmbeddings: false,
			NormTopKProb:              ntp,
			NumAttentionHeads:         c.Heads,
			NumHiddenLayers:           c.Layers,
			NumKeyValueHeads:          c.KVHeads,
			PartialRotaryFactor:       c.PartialRotaryFactor,
			RMSNormEps:                c.RMSNormEps,
			RopeParameters: ropeParams{
				RopeType:            "default",
				RopeTheta:           c.RopeTheta,
				PartialRotaryFactor: c.PartialRotaryFactor,
				MRopeInterleaved:    true,
				MRopeSection:        c.MRopeSection,
			},
			TieWordEmbeddings: false,
			VocabSize:         c.Vocab,
		},
		TieWordEmbeddings:  false,
		VideoTokenID:       c.VideoToken,
		VisionEndTokenID:   c.VisionEndToken,
		VisionStartTokenID: c.VisionStartToken,
		VisionConfig: visionConfig{
			Depth:             c.VisionDepth,
			HiddenSize:        c.VisionHidden,
			OutHiddenSize:     c.VisionOut,
			PatchSize:         16,
			SpatialMergeSize:  2,
			TemporalPatchSize: 2,
		},
	}
	if fp8 {
		doc.QuantizationConfig = &quantConfig{
			ActivationScheme: "dynamic",
			Fmt:              "e4m3",
			QuantMethod:      "fp8",
			WeightBlockSize:  []int{128, 128},
		}
	}
	if c.Dense {
		doc.Architectures = []string{"Qwen3_5ForConditionalGeneration"}
		doc.ModelType = "qwen3_5"
		doc.TextConfig.ModelType = "qwen3_5_text"
		doc.TextConfig.IntermediateSize = c.Intermediate
		doc.TextConfig.NormTopKProb = nil
	} else {
		aux, no := 0.001, false
		tc := &doc.TextConfig
		tc.MoEIntermediateSize, tc.NumExperts, tc.NumExpertsPerTok = &c.MoEIntermediate, &c.Experts, &c.TopK
		tc.OutputRouterLogits, tc.RouterAuxLossCoef, tc.SharedExpertIntermediate = &no, &aux, &c.SharedIntermediate
	}
	var v any = doc
	if c.Qwen3Next {
		type flat struct {
			Architectures      []string     `json:"architectures"`
			DecoderSparseStep  int          `json:"decoder_sparse_step"`
			MLPOnlyLayers      []int        `json:"mlp_only_layers"`
			QuantizationConfig *quantConfig `json:"quantization_config,omitempty"`
			textConfig
		}
		tc := doc.TextConfig
		tc.ModelType = "qwen3_next"
		v = flat{
			Architectures:      []string{"Qwen3NextForCausalLM"},
			DecoderSparseStep:  1,
			MLPOnlyLayers:      []int{},
			QuantizationConfig: doc.QuantizationConfig,
			textConfig:         tc,
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("testmodel: encoding config.json: %w", err)
	}
	return buf.Bytes(), nil
}
