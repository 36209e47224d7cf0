package testmodel

import (
	"fmt"
	"strconv"
)

// TrunkPrefix is the name prefix of the decoder trunk in Qwen3.5/3.6
// checkpoints (the text model nested in the vision-language wrapper).
const TrunkPrefix = "model.language_model."

// MTPPrefix is the name prefix of the multi-token-prediction module.
const MTPPrefix = "mtp."

// ExpertLayout says how routed experts are stored.
type ExpertLayout int

const (
	// ExpertsFused stores each MoE block's routed experts as two 3-D
	// tensors, `mlp.experts.gate_up_proj` [E, 2I, H] (per expert the gate
	// rows, then the up rows) and `mlp.experts.down_proj` [E, H, I]: the
	// Qwen3.5/3.6 release layout.
	ExpertsFused ExpertLayout = iota
	// ExpertsPerExpert stores 2-D tensors
	// `mlp.experts.{e}.{gate,up}_proj.weight` [I, H] and
	// `mlp.experts.{e}.down_proj.weight` [H, I]: the Qwen3-Next naming.
	ExpertsPerExpert
)

// Init says how a tensor's values are generated (see Values).
type Init int

// Value generators.
const (
	InitMatrix    Init = iota // s·c·row scale, c = 2^-round(log2(sqrt(fan_in))), plus outliers
	InitEmbedding             // s/32 · row scale, plus outliers
	InitNorm                  // zero-centred RMSNorm weight: s/16
	InitGatedNorm             // linear_attn.norm (plain scale): 1 + s/16
	InitDTBias                // 1 + s/8
	InitALog                  // 2.75·u
	InitBias                  // s/16
	InitFP8                   // raw F8_E4M3 codes (NaN codes avoided)
	InitScaleInv              // powers of two 2^-8 .. 2^-11 (F32)
)

// TensorSpec is one tensor of a generated checkpoint.
type TensorSpec struct {
	Name  string
	DType string // safetensors dtype name: "BF16", "F32", "F8_E4M3"
	Shape []int64
	Init  Init
	// Layer is the decoder layer index (the MTP layer index when MTP is
	// true), or -1 for tensors outside any layer.
	Layer int
	MTP   bool
	// Expert is the routed expert index of a per-expert tensor, else -1.
	Expert int
	// From names the fused tensor whose values a per-expert tensor
	// carries (rows FromRow .. FromRow+Shape[0] of expert Expert), or "".
	From    string
	FromRow int64
}

// NumElements is the product of the shape.
func (s TensorSpec) NumElements() int64 {
	n := int64(1)
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

// Size is the number of data bytes of the tensor.
func (s TensorSpec) Size() int64 { return s.NumElements() * int64(dtypeBytes(s.DType)) }

func dtypeBytes(d string) int {
	switch d {
	case "F32":
		return 4
	case "BF16":
		return 2
	case "F8_E4M3":
		return 1
	}
	panic("testmodel: unknown dtype " + d)
}

func sh(d ...int) []int64 {
	s := make([]int64, len(d))
	for i, v := range d {
		s[i] = int64(v)
	}
	return s
}

// Specs lists every tensor of the checkpoint described by cfg with the
// given expert layout, in a fixed logical order: embedding, decoder layers
// 0..L-1, final norm, lm_head, MTP, then the optional vision stubs. When fp8
// is true, layer 0's `linear_attn.in_proj_qkv.weight` is F8_E4M3 and is
// followed by its F32 `weight_scale_inv` companion (block 128×128).
//
// It is long by design: the checkpoint's tensor list in its order, one line
// a tensor.
func Specs(cfg Config, layout ExpertLayout, fp8 bool) ([]TensorSpec, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if layout != ExpertsFused && layout != ExpertsPerExpert {
		return nil, fmt.Errorf("testmodel: unknown expert layout %d", layout)
	}
	if cfg.Qwen3Next {
		layout = ExpertsPerExpert
	}
	H := cfg.Hidden
	P := cfg.Prefix()
	var out []TensorSpec
	add := func(name, dtype string, shape []int64, init Init, layer int, mtp bool) {
		out = append(out, TensorSpec{Name: name, DType: dtype, Shape: shape, Init: init, Layer: layer, MTP: mtp, Expert: -1})
	}
	layer := func(prefix string, i int, full, mtp bool) {
		add(prefix+"input_layernorm.weight", "BF16", sh(H), InitNorm, i, mtp)
		add(prefix+"post_attention_layernorm.weight", "BF16", sh(H), InitNorm, i, mtp)
		if full {
			a := prefix + "self_attn."
			add(a+"q_proj.weight", "BF16", sh(cfg.QRows(), H), InitMatrix, i, mtp)
			add(a+"k_proj.weight", "BF16", sh(cfg.KVRows(), H), InitMatrix, i, mtp)
			add(a+"v_proj.weight", "BF16", sh(cfg.KVRows(), H), InitMatrix, i, mtp)
			add(a+"o_proj.weight", "BF16", sh(H, cfg.Heads*cfg.HeadDim), InitMatrix, i, mtp)
			add(a+"q_norm.weight", "BF16", sh(cfg.HeadDim), InitNorm, i, mtp)
			add(a+"k_norm.weight", "BF16", sh(cfg.HeadDim), InitNorm, i, mtp)
		} else {
			a := prefix + "linear_attn."
			if cfg.Qwen3Next {
				// Grouped per key head: q, k, v, z rows, then b, a rows.
				add(a+"in_proj_qkvz.weight", "BF16", sh(2*cfg.KeyDim()+2*cfg.ValueDim(), H), InitMatrix, i, mtp)
				add(a+"in_proj_ba.weight", "BF16", sh(2*cfg.LinearValueHeads, H), InitMatrix, i, mtp)
			} else {
				qkv := a + "in_proj_qkv.weight"
				if fp8 && !mtp && i == 0 {
					add(qkv, "F8_E4M3", sh(cfg.ConvDim(), H), InitFP8, i, mtp)
					add(a+"in_proj_qkv.weight_scale_inv", "F32", sh((cfg.ConvDim()+127)/128, (H+127)/128), InitScaleInv, i, mtp)
				} else {
					add(qkv, "BF16", sh(cfg.ConvDim(), H), InitMatrix, i, mtp)
				}
				add(a+"in_proj_z.weight", "BF16", sh(cfg.ValueDim(), H), InitMatrix, i, mtp)
				add(a+"in_proj_b.weight", "BF16", sh(cfg.LinearValueHeads, H), InitMatrix, i, mtp)
				add(a+"in_proj_a.weight", "BF16", sh(cfg.LinearValueHeads, H), InitMatrix, i, mtp)
			}
			add(a+"conv1d.weight", "BF16", sh(cfg.ConvDim(), 1, cfg.ConvKernel), InitMatrix, i, mtp)
			add(a+"dt_bias", "BF16", sh(cfg.LinearValueHeads), InitDTBias, i, mtp)
			add(a+"A_log", "F32", sh(cfg.LinearValueHeads), InitALog, i, mtp)
			add(a+"norm.weight", "F32", sh(cfg.LinearValueHeadDim), InitGatedNorm, i, mtp)
			add(a+"out_proj.weight", "BF16", sh(H, cfg.ValueDim()), InitMatrix, i, mtp)
		}
		m := prefix + "mlp."
		if cfg.Dense {
			add(m+"gate_proj.weight", "BF16", sh(cfg.Intermediate, H), InitMatrix, i, mtp)
			add(m+"up_proj.weight", "BF16", sh(cfg.Intermediate, H), InitMatrix, i, mtp)
			add(m+"down_proj.weight", "BF16", sh(H, cfg.Intermediate), InitMatrix, i, mtp)
			return
		}
		E, I, S := cfg.Experts, cfg.MoEIntermediate, cfg.SharedIntermediate
		add(m+"gate.weight", "BF16", sh(E, H), InitMatrix, i, mtp)
		gateUp, down := m+"experts.gate_up_proj", m+"experts.down_proj"
		if layout == ExpertsFused {
			add(gateUp, "BF16", sh(E, 2*I, H), InitMatrix, i, mtp)
			add(down, "BF16", sh(E, H, I), InitMatrix, i, mtp)
		} else {
			for e := 0; e < E; e++ {
				p := m + "experts." + strconv.Itoa(e) + "."
				out = append(out,
					TensorSpec{Name: p + "gate_proj.weight", DType: "BF16", Shape: sh(I, H), Init: InitMatrix, Layer: i, MTP: mtp, Expert: e, From: gateUp, FromRow: 0},
					TensorSpec{Name: p + "up_proj.weight", DType: "BF16", Shape: sh(I, H), Init: InitMatrix, Layer: i, MTP: mtp, Expert: e, From: gateUp, FromRow: int64(I)},
					TensorSpec{Name: p + "down_proj.weight", DType: "BF16", Shape: sh(H, I), Init: InitMatrix, Layer: i, MTP: mtp, Expert: e, From: down, FromRow: 0},
				)
			}
		}
		add(m+"shared_expert.gate_proj.weight", "BF16", sh(S, H), InitMatrix, i, mtp)
		add(m+"shared_expert.up_proj.weight", "BF16", sh(S, H), InitMatrix, i, mtp)
		add(m+"shared_expert.down_proj.weight", "BF16", sh(H, S), InitMatrix, i, mtp)
		add(m+"shared_expert_gate.weight", "BF16", sh(1, H), InitMatrix, i, mtp)
	}

	add(P+"embed_tokens.weight", "BF16", sh(cfg.Vocab, H), InitEmbedding, -1, false)
	for i := 0; i < cfg.Layers; i++ {
		layer(P+"layers."+strconv.Itoa(i)+".", i, cfg.IsFull(i), false)
	}
	add(P+"norm.weight", "BF16", sh(H), InitNorm, -1, false)
	add("lm_head.weight", "BF16", sh(cfg.Vocab, H), InitEmbedding, -1, false)
	if cfg.MTPLayers > 0 {
		add(MTPPrefix+"fc.weight", "BF16", sh(H, 2*H), InitMatrix, -1, true)
		add(MTPPrefix+"pre_fc_norm_embedding.weight", "BF16", sh(H), InitNorm, -1, true)
		add(MTPPrefix+"pre_fc_norm_hidden.weight", "BF16", sh(H), InitNorm, -1, true)
		add(MTPPrefix+"norm.weight", "BF16", sh(H), InitNorm, -1, true)
		for i := 0; i < cfg.MTPLayers; i++ {
			layer(MTPPrefix+"layers."+strconv.Itoa(i)+".", i, true, true)
		}
	}
	if cfg.VisionStubs {
		v := cfg.VisionHidden
		add("model.visual.patch_embed.proj.weight", "BF16", sh(v, 3, 2, 4, 4), InitMatrix, -1, false)
		add("model.visual.blocks.0.attn.qkv.weight", "BF16", sh(3*v, v), InitMatrix, -1, false)
		add("model.visual.blocks.0.attn.qkv.bias", "BF16", sh(3*v), InitBias, -1, false)
	}
	return out, nil
}
