package model

import (
	"fmt"
	"strconv"
	"strings"
)

// Role says what a checkpoint tensor is, independently of any plan.
// Roles are derived from tensor names of the Qwen3 / Qwen3-Next /
// Qwen3.5 / Qwen3.6 families (dense and MoE, with or without MTP).
type Role string

// Tensor roles.
const (
	RoleEmbedding Role = "embedding" // embed_tokens
	RoleLMHead    Role = "lm_head"
	RoleNorm      Role = "norm"     // an RMSNorm weight (layer, final, q/k, MTP norms)
	RoleGDNNorm   Role = "gdn_norm" // linear_attn.norm (gated RMSNorm, plain scale)

	RoleAttnQ Role = "attn_q"
	RoleAttnK Role = "attn_k"
	RoleAttnV Role = "attn_v"
	RoleAttnO Role = "attn_o"

	RoleGDNInQKV  Role = "gdn_in_qkv"  // linear_attn.in_proj_qkv
	RoleGDNInZ    Role = "gdn_in_z"    // linear_attn.in_proj_z
	RoleGDNInA    Role = "gdn_in_a"    // linear_attn.in_proj_a (decay input, one row per value head)
	RoleGDNInB    Role = "gdn_in_b"    // linear_attn.in_proj_b (beta, one row per value head)
	RoleGDNInQKVZ Role = "gdn_in_qkvz" // Qwen3-Next fused in_proj_qkvz
	RoleGDNInBA   Role = "gdn_in_ba"   // Qwen3-Next fused in_proj_ba
	RoleGDNOut    Role = "gdn_out"     // linear_attn.out_proj
	RoleConv1D    Role = "gdn_conv1d"
	RoleDTBias    Role = "gdn_dt_bias"
	RoleALog      Role = "gdn_a_log"

	RoleRouter           Role = "router"         // mlp.gate
	RoleExpertGateUp     Role = "expert_gate_up" // routed expert gate+up ([2I, H] per expert)
	RoleExpertDown       Role = "expert_down"    // routed expert down ([H, I] per expert)
	RoleSharedGate       Role = "shared_gate"    // mlp.shared_expert.gate_proj
	RoleSharedUp         Role = "shared_up"
	RoleSharedDown       Role = "shared_down"
	RoleSharedExpertGate Role = "shared_expert_gate" // the shared expert's sigmoid gate [1, H]
	RoleMLPGate          Role = "mlp_gate"           // dense MLP gate_proj
	RoleMLPUp            Role = "mlp_up"
	RoleMLPDown          Role = "mlp_down"

	RoleMTPFC  Role = "mtp_fc" // mtp.fc: projection of concat(embedding, hidden)
	RoleVision Role = "vision" // model.visual.*: passed through or dropped by text plans
)

// maxNameIndex bounds the layer and expert indices read from tensor names.
// Real models have at most a few hundred of either; a larger index is not a
// known layout, and accepting it would let one name size the layer and
// expert counts (and overflow NumLayers+k for MTP layers).
const maxNameIndex = 1 << 16

// MustStayLossless reports whether tensors of this role must never be
// stored lossily: norms, the Gated DeltaNet conv1d, A_log and dt_bias, the
// router and the shared expert's gate. Resolve refuses a plan that stores
// one of them in a BFP format or rounds an F32 one to BF16.
func (r Role) MustStayLossless() bool {
	switch r {
	case RoleNorm, RoleGDNNorm, RoleConv1D, RoleDTBias, RoleALog, RoleRouter, RoleSharedExpertGate:
		return true
	}
	return false
}

// IsMLPMatrix reports whether the role is a matrix of a layer's MLP
// block: a routed expert, the shared expert's gate, up or down projection,
// or a dense MLP's (not the router or the shared expert's sigmoid gate).
// A dense layer's MLP takes the place of an MoE layer's experts: build's
// "--layers experts" selects these.
func (r Role) IsMLPMatrix() bool {
	switch r {
	case RoleExpertGateUp, RoleExpertDown, RoleSharedGate, RoleSharedUp, RoleSharedDown, RoleMLPGate, RoleMLPUp, RoleMLPDown:
		return true
	}
	return false
}

// IsExpert reports whether the role is a routed expert matrix.
func (r Role) IsExpert() bool { return r == RoleExpertGateUp || r == RoleExpertDown }

// SourceClass is the classification of one source tensor name.
type SourceClass struct {
	Role Role
	// Layer is the decoder (or MTP) layer index, -1 outside layers.
	Layer int
	MTP   bool
	// Fused is true for a 3-D fused routed-expert tensor [E, rows, cols].
	Fused bool
	// Expert is the expert index of a per-expert source tensor, else -1.
	Expert int
	// Part is "gate", "up" or "down" for per-expert sources, else "".
	Part string
	// Block is the name prefix of the layer's MoE block ("…mlp."), for
	// expert tensors.
	Block string
}

// quantizedSuffixes mark companions of already-quantized weights.
var quantizedSuffixes = []string{
	"weight_scale_inv", "weight_scale", "input_scale", "weight_scale_2",
	".qweight", ".qzeros", ".scales", ".g_idx", ".absmax", ".quant_map", ".quant_state",
	"weight_packed", "weight_shape", "weight_zero_point",
}

// QuantizedCompanion reports whether name looks like the scale or packing
// companion of an already-quantized weight.
func QuantizedCompanion(name string) bool {
	for _, s := range quantizedSuffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// ClassifyTensor returns the role of a source tensor name, or an error
// naming it when the name is not one of the known Qwen3.x layouts.
func ClassifyTensor(name string) (SourceClass, error) {
	c := SourceClass{Layer: -1, Expert: -1}
	unknown := func() (SourceClass, error) {
		return SourceClass{}, fmt.Errorf("tensor %q: unknown tensor name (not a Qwen3/Qwen3-Next/Qwen3.5/Qwen3.6 text tensor)", name)
	}
	switch {
	case strings.HasPrefix(name, "model.visual.") || strings.HasPrefix(name, "visual."):
		c.Role = RoleVision
		return c, nil
	case name == "lm_head.weight":
		c.Role = RoleLMHead
		return c, nil
	}
	var rest string
	switch {
	case strings.HasPrefix(name, "mtp."):
		c.MTP = true
		rest = name[len("mtp."):]
		switch rest {
		case "fc.weight":
			c.Role = RoleMTPFC
			return c, nil
		case "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight":
			c.Role = RoleNorm
			return c, nil
		}
	case strings.HasPrefix(name, "model.language_model."):
		rest = name[len("model.language_model."):]
	case strings.HasPrefix(name, "model."):
		rest = name[len("model."):]
	default:
		return unknown()
	}
	if !c.MTP {
		switch rest {
		case "embed_tokens.weight":
			c.Role = RoleEmbedding
			return c, nil
		case "norm.weight":
			c.Role = RoleNorm
			return c, nil
		}
	}
	after, ok := strings.CutPrefix(rest, "layers.")
	if !ok {
		return unknown()
	}
	dot := strings.IndexByte(after, '.')
	if dot <= 0 {
		return unknown()
	}
	layer, err := strconv.Atoi(after[:dot])
	if err != nil || layer < 0 || layer > maxNameIndex || strconv.Itoa(layer) != after[:dot] {
		return unknown()
	}
	c.Layer = layer
	s := after[dot+1:]
	block := name[:len(name)-len(s)] + "mlp."
	role, ok := layerRoles[s]
	if ok {
		c.Role = role
		if role.IsExpert() {
			c.Fused = true
			c.Block = block
		}
		return c, nil
	}
	// Per-expert routed experts: mlp.experts.{e}.{gate,up,down}_proj.weight
	if e, ok := strings.CutPrefix(s, "mlp.experts."); ok {
		dot := strings.IndexByte(e, '.')
		if dot > 0 {
			idx, err := strconv.Atoi(e[:dot])
			if err == nil && idx >= 0 && idx <= maxNameIndex && strconv.Itoa(idx) == e[:dot] {
				switch e[dot+1:] {
				case "gate_proj.weight":
					c.Role, c.Part = RoleExpertGateUp, "gate"
				case "up_proj.weight":
					c.Role, c.Part = RoleExpertGateUp, "up"
				case "down_proj.weight":
					c.Role, c.Part = RoleExpertDown, "down"
				default:
					return unknown()
				}
				c.Expert = idx
				c.Block = block
				return c, nil
			}
		}
	}
	return unknown()
}

// layerRoles maps the part of a name after "layers.N." to its role.
var layerRoles = map[string]Role{
	"input_layernorm.weight":          RoleNorm,
	"post_attention_layernorm.weight": RoleNorm,

	"self_attn.q_proj.weight": RoleAttnQ,
	"self_attn.k_proj.weight": RoleAttnK,
	"self_attn.v_proj.weight": RoleAttnV,
	"self_attn.o_proj.weight": RoleAttnO,
	"self_attn.q_norm.weight": RoleNorm,
	"self_attn.k_norm.weight": RoleNorm,

	"linear_attn.in_proj_qkv.weight":  RoleGDNInQKV,
	"linear_attn.in_proj_z.weight":    RoleGDNInZ,
	"linear_attn.in_proj_a.weight":    RoleGDNInA,
	"linear_attn.in_proj_b.weight":    RoleGDNInB,
	"linear_attn.in_proj_qkvz.weight": RoleGDNInQKVZ,
	"linear_attn.in_proj_ba.weight":   RoleGDNInBA,
	"linear_attn.out_proj.weight":     RoleGDNOut,
	"linear_attn.conv1d.weight":       RoleConv1D,
	"linear_attn.dt_bias":             RoleDTBias,
	"linear_attn.A_log":               RoleALog,
	"linear_attn.norm.weight":         RoleGDNNorm,

	"mlp.gate.weight":                    RoleRouter,
	"mlp.experts.gate_up_proj":           RoleExpertGateUp,
	"mlp.experts.down_proj":              RoleExpertDown,
	"mlp.shared_expert.gate_proj.weight": RoleSharedGate,
	"mlp.shared_expert.up_proj.weight":   RoleSharedUp,
	"mlp.shared_expert.down_proj.weight": RoleSharedDown,
	"mlp.shared_expert_gate.weight":      RoleSharedExpertGate,
	"mlp.gate_proj.weight":               RoleMLPGate,
	"mlp.up_proj.weight":                 RoleMLPUp,
	"mlp.down_proj.weight":               RoleMLPDown,
}
