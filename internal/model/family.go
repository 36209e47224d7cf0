// Package model holds what ttquant knows about the model families it
// reads: how config.json describes the geometry (ReadConfig), what each
// tensor name is (ClassifyTensor and the Role values), how routed experts
// are laid out in a source checkpoint (ExpertLayout), and which calibration
// site feeds which matrix (Site). The rest of the module asks this package
// instead of parsing names or configs itself, so a new family is added here.
//
// Family is the small interface a model family implements; Qwen3 is the
// implementation for Qwen3-Next and Qwen3.5/3.6 (dense and MoE,
// with or without MTP layers).
package model

// Family is one family of models.
type Family interface {
	// Name names the family in messages.
	Name() string
	// ReadConfig reads a config.json (or the one in a directory).
	ReadConfig(path string) (*Config, error)
	// ClassifyTensor returns the role of a source tensor name, or an error
	// naming it when the name is not a tensor of this family.
	ClassifyTensor(name string) (SourceClass, error)
	// Site returns the calibration site whose activations are the input of
	// matrices of role r, or "" when no site feeds it.
	Site(r Role) string
}

// Calibration sites: the input of a module of one decoder layer, named by
// the module's path below "layers.N.". A calibration store records
// activations per (layer, site).
const (
	// SiteMoE is the input of the sparse MoE block ("mlp"): the normalised
	// hidden state fed to the router, the routed experts and the shared
	// expert (or the dense MLP).
	SiteMoE = "mlp"
	// SiteAttn is the normalised input of the attention block, fed to
	// q/k/v_proj (full attention) or in_proj_* (linear attention).
	SiteAttn = "attn"
	// SiteOProj is the input of self_attn.o_proj (full-attention layers).
	SiteOProj = "self_attn.o_proj"
	// SiteOutProj is the input of linear_attn.out_proj (linear-attention
	// layers).
	SiteOutProj = "linear_attn.out_proj"
)

// ExpertLayout is how a source checkpoint stores a layer's routed experts.
type ExpertLayout int

const (
	// LayoutUnknown is the invalid zero value.
	LayoutUnknown ExpertLayout = iota
	// LayoutFused stores all experts of a layer in two 3-D tensors,
	// mlp.experts.gate_up_proj [E, 2I, H] (per expert the gate rows first)
	// and mlp.experts.down_proj [E, H, I] (Qwen3.5/3.6).
	LayoutFused
	// LayoutPerExpert stores mlp.experts.{e}.{gate,up,down}_proj.weight
	// per expert (Qwen3-MoE, Qwen3-Next).
	LayoutPerExpert
)

func (l ExpertLayout) String() string {
	switch l {
	case LayoutFused:
		return "fused"
	case LayoutPerExpert:
		return "per-expert"
	}
	return "unknown"
}

// LayoutOf returns the expert layout a classified source tensor belongs to,
// LayoutUnknown when it is not a routed expert tensor.
func LayoutOf(c SourceClass) ExpertLayout {
	switch {
	case !c.Role.IsExpert():
		return LayoutUnknown
	case c.Fused:
		return LayoutFused
	case c.Expert >= 0:
		return LayoutPerExpert
	}
	return LayoutUnknown
}

// Qwen3 is the Qwen3-MoE / Qwen3-Next / Qwen3.5 / Qwen3.6 family.
var Qwen3 Family = qwen3{}

type qwen3 struct{}

func (qwen3) Name() string                                    { return "Qwen3/Qwen3-Next/Qwen3.5/Qwen3.6" }
func (qwen3) ReadConfig(path string) (*Config, error)         { return ReadConfig(path) }
func (qwen3) ClassifyTensor(name string) (SourceClass, error) { return ClassifyTensor(name) }
func (qwen3) Site(r Role) string                              { return Site(r) }

// Site returns the calibration site feeding matrices of role r in the
// Qwen3 family, or "" (embeddings, norms, the router, the down projections
// whose inputs are computed from the site's gate and up outputs, and every
// lossless role).
func Site(r Role) string {
	switch r {
	case RoleSharedGate, RoleSharedUp, RoleMLPGate, RoleMLPUp, RoleExpertGateUp, RoleExpertDown:
		return SiteMoE
	case RoleAttnQ, RoleAttnK, RoleAttnV, RoleGDNInQKV, RoleGDNInZ, RoleGDNInQKVZ:
		return SiteAttn
	case RoleAttnO:
		return SiteOProj
	case RoleGDNOut:
		return SiteOutProj
	}
	return ""
}
