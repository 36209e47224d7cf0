package plan

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/manifest"
)

// Built-in preset names.
const (
	PresetQwen36MoE = "qwen36-35b-a3b"  // Qwen3.6-35B-A3B (and other Qwen3.5/3.6 MoE)
	PresetDense27B  = "qwen3-27b-dense" // Qwen3.x 27B-style dense models
	PresetDense9B   = "qwen3-9b-dense"  // Qwen3.x 9B-style dense models
)

// losslessRules keep, in their source dtype, every tensor that a
// quantized Qwen3.x checkpoint keeps lossless: all RMSNorm weights, the
// Gated DeltaNet conv1d, A_log and dt_bias, the router and the shared
// expert's gate, and the token embedding.
var losslessRules = []Rule{
	{Pattern: "*norm*", Format: manifest.StoreAsIs, Note: "RMSNorm weights (layer, q/k, final, gated DeltaNet and MTP norms)"},
	{Pattern: "*.linear_attn.{conv1d.weight,A_log,dt_bias}", Format: manifest.StoreAsIs, Note: "Gated DeltaNet conv1d, decay and time-step parameters (A_log stays F32)"},
	{Pattern: "*.mlp.{gate,shared_expert_gate}.weight", Format: manifest.StoreAsIs, Note: "router and shared-expert gate"},
	{Pattern: "*.embed_tokens.weight", Format: manifest.StoreAsIs, Note: "token embedding (a lookup table, not a matmul)"},
}

// gdnABPattern names the Gated DeltaNet decay/beta input projections (one
// row per value head; fused as in_proj_ba in Qwen3-Next).
const gdnABPattern = "*.linear_attn.{in_proj_a,in_proj_b,in_proj_ba}.weight"

// gdnABLossless keeps them as stored (the dense presets); the 35B preset
// stores them in BFP8_b like the other in-projections, as the published
// precision table of Qwen3.6-35B-A3B does.
var (
	gdnABLossless = []Rule{{Pattern: gdnABPattern, Format: manifest.StoreAsIs, Note: "Gated DeltaNet decay/beta projections: one row per value head"}}
	gdnABBFP8     = []Rule{{Pattern: gdnABPattern, Format: manifest.StoreBFP8, Method: manifest.MethodRTN, Note: "Gated DeltaNet decay/beta projections, BFP8_b like qkv and z"}}
)

// tailRules store the remaining projections, the LM head and MTP's fc in
// BFP8 and pass vision tensors through.
var tailRules = []Rule{
	{Pattern: "*.linear_attn.{in_proj_qkv,in_proj_z,in_proj_qkvz,out_proj}.weight", Format: manifest.StoreBFP8, Method: manifest.MethodRTN, Note: "Gated DeltaNet input/output projections"},
	{Pattern: "*.self_attn.{q,k,v,o}_proj.weight", Format: manifest.StoreBFP8, Method: manifest.MethodRTN, Note: "attention q/k/v/o projections"},
	{Pattern: "mtp.fc.weight", Format: manifest.StoreBFP8, Method: manifest.MethodRTN, Note: "MTP input projection"},
	{Pattern: "lm_head.weight", Format: manifest.StoreBFP8, Method: manifest.MethodRTN, Note: "LM head"},
	{Pattern: "{model.visual,visual}.*", Format: manifest.StoreAsIs, Note: "vision tower: passed through unchanged"},
}

// PresetAxis is the BFP block axis of every preset's BFP rules: the output
// axis, so every BFP matrix is packed as the transposed [in, out] weight
// that tt-metal's linear reads (tt-metal's model code transposes each
// weight to [in, out] before ttnn.as_tensor, and a BFP tensor cannot be
// transposed without quantizing it again). The presets' rules name no
// axis: Preset validates them, which gives every BFP rule bfp.DefaultAxis.
// PresetRuntime says so in the presets' descriptions. Plan.WithAxis (the
// commands' --axis) selects the input axis instead.
const PresetAxis = bfp.DefaultAxis

// PresetRuntime is the runtime layout the presets build for, as their
// descriptions state it.
const PresetRuntime = "built for tt-metal's linear: every BFP matrix packed [in, out], exponent groups along the output axis"

// denseMLPRules store a dense model's MLP, and any routed or shared expert
// it may have, in format f with method m (the dense presets differ only
// there).
func denseMLPRules(f manifest.StoredFormat, m manifest.Method) []Rule {
	return []Rule{
		{Pattern: "*.mlp.{gate,up,down}_proj.weight", Format: f, Method: m, Note: "dense MLP"},
		{Pattern: "*.mlp.{experts,shared_expert}.*", Format: f, Method: m, Note: "MLP experts, should the model have them"},
	}
}

func concatRules(parts ...[]Rule) []Rule {
	var out []Rule
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var presets = map[string]Plan{
	PresetQwen36MoE: {
		Name: PresetQwen36MoE,
		Description: "Qwen3.6-35B-A3B: routed experts (every layer and the MTP layer) and the shared expert BFP4_b with GPTQ; " +
			"Gated DeltaNet (qkv, z, a, b, out) and attention projections, MTP fc and LM head BFP8_b (RTN); norms, conv1d, A_log, dt_bias, " +
			"router, shared-expert gate and embedding kept as stored; " + PresetRuntime,
		Rules: concatRules(losslessRules, gdnABBFP8, []Rule{
			{Pattern: "*.mlp.experts.*", Format: manifest.StoreBFP4, Method: manifest.MethodGPTQ, Note: "routed experts"},
			{Pattern: "*.mlp.shared_expert.*", Format: manifest.StoreBFP4, Method: manifest.MethodGPTQ, Note: "shared expert"},
		}, tailRules),
	},
	PresetDense27B: {
		Name: PresetDense27B,
		Description: "Qwen3.x 27B-style dense: MLP gate/up/down (and any routed or shared expert) BFP4_b with GPTQ; " +
			"other projections and the LM head BFP8_b (RTN); lossless tensors kept as stored; " + PresetRuntime,
		Rules: concatRules(losslessRules, gdnABLossless, denseMLPRules(manifest.StoreBFP4, manifest.MethodGPTQ), tailRules),
	},
	PresetDense9B: {
		Name:        PresetDense9B,
		Description: "Qwen3.x 9B-style dense: every matrix BFP8_b (RTN) except the lossless tensors, kept as stored; " + PresetRuntime,
		Rules:       concatRules(losslessRules, gdnABLossless, denseMLPRules(manifest.StoreBFP8, manifest.MethodRTN), tailRules),
	},
}

// PresetNames lists the built-in presets, sorted.
func PresetNames() []string {
	out := make([]string, 0, len(presets))
	for n := range presets {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ErrUnknownPreset is returned (wrapped, with the name and the known
// presets) by Preset for a name that is not a built-in preset; commands
// treat it as a usage error.
var ErrUnknownPreset = errors.New("unknown preset")

// Preset returns a fresh, validated copy of a built-in plan:
// "qwen36-35b-a3b", "qwen3-27b-dense" or "qwen3-9b-dense".
func Preset(name string) (*Plan, error) {
	p, ok := presets[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownPreset, name, strings.Join(PresetNames(), ", "))
	}
	cp := p
	cp.Rules = append([]Rule(nil), p.Rules...)
	v, err := cp.Validate()
	if err != nil {
		panic("manifest: built-in preset invalid: " + err.Error())
	}
	return v, nil
}
