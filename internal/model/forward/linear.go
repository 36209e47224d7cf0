package forward

import (
	"fmt"
	"strconv"

	"github.com/ttquant/ttquant/internal/model/ffn"
)

// The forward pass multiplies activations by its weight matrices in
// float32 (kernels.Sgemm) unless the Model is given other numerics: a
// Linears strategy supplies, per weight matrix, a Linear that computes the
// product instead (for example as an accelerator's matrix unit computes
// it), and a KVStore rounds the keys and values of full-attention layers as
// a cache of another format would hold them. Both are optional; without
// them the forward pass is bit for bit the float32 one.

// LinearRole says which projection of the model a weight matrix is.
type LinearRole int

// Linear roles. The zero value is invalid.
const (
	// RoleAttnIn is a full-attention layer's q_proj, k_proj and v_proj
	// stacked (AttentionWeights.In).
	RoleAttnIn LinearRole = iota + 1
	// RoleAttnOut is o_proj.
	RoleAttnOut
	// RoleGDNIn is a Gated DeltaNet layer's input projections stacked
	// (DeltaNetWeights.In).
	RoleGDNIn
	// RoleGDNOut is out_proj.
	RoleGDNOut
	// RoleMLPGate, RoleMLPUp and RoleMLPDown are a dense MLP's
	// projections.
	RoleMLPGate
	RoleMLPUp
	RoleMLPDown
	// RoleSharedGate, RoleSharedUp and RoleSharedDown are the shared
	// expert's projections.
	RoleSharedGate
	RoleSharedUp
	RoleSharedDown
	// RoleExpertGate, RoleExpertUp and RoleExpertDown are a routed
	// expert's projections (LinearWeight.Expert says which).
	RoleExpertGate
	RoleExpertUp
	RoleExpertDown
	// RoleLMHead is the LM head (LinearWeight.Layer is -1).
	RoleLMHead
)

var roleNames = [...]string{"", "attn_in", "attn_out", "gdn_in", "gdn_out", "mlp_gate", "mlp_up", "mlp_down",
	"shared_gate", "shared_up", "shared_down", "expert_gate", "expert_up", "expert_down", "lm_head"}

func (r LinearRole) String() string {
	if r > 0 && int(r) < len(roleNames) {
		return roleNames[r]
	}
	return "LinearRole(" + strconv.Itoa(int(r)) + ")"
}

// RowRange is a run of a weight matrix's rows as the WeightSource holds
// them: rows Row0 … Row0+Rows-1 of tensor Tensor viewed as a matrix of
// LinearWeight.In columns (a fused expert tensor [E, R, In] as [E·R, In]).
type RowRange struct {
	Tensor     string
	Row0, Rows int
}

// LinearWeight describes one weight matrix W [Out, In] of the forward
// pass: what it is, where each of its rows comes from (in the forward
// pass's row order, which may stack or reorder the source tensors), and
// the float32 values the default product uses.
type LinearWeight struct {
	Layer  int // the layer (Config.NumLayers indexing), -1 for the LM head
	Role   LinearRole
	Expert int // routed expert, -1 otherwise
	Out    int
	In     int
	Rows   []RowRange // cover Out rows in order
	W      []float32  // [Out, In] as read from the WeightSource
}

// Name is a short description for messages, e.g. "layer 3 expert_up 7".
func (w *LinearWeight) Name() string {
	if w.Layer < 0 {
		return w.Role.String()
	}
	s := "layer " + strconv.Itoa(w.Layer) + " " + w.Role.String()
	if w.Expert >= 0 {
		s += " " + strconv.Itoa(w.Expert)
	}
	return s
}

// Linear computes products with one weight matrix W [Out, In].
// Implementations must be safe for concurrent use, and a row of the result
// must depend only on the same row of x (the forward pass batches
// sequences and chunks positions freely).
//
// MatMulT sets dst (rows × Out, leading dimension ldd) to x·Wᵀ for x
// [rows, In]. It is the product the feed-forward blocks take, ffn.Product.
type Linear = ffn.Product

// Linears chooses the product of each weight matrix of a Model.
type Linears interface {
	// Linear returns the product for w, or nil for the float32 one. It is
	// called whenever a layer runs (and for the LM head on each Logits
	// call): implementations cache what they prepare. w and w.W must not
	// be kept past the call unless copied.
	Linear(w *LinearWeight) (Linear, error)
}

// KVStore rounds the keys (after k_norm and RoPE) and values of a
// full-attention layer as the key-value cache holds them, before any query
// reads them. x is [positions, KVHeads·HeadDim], rounded in place; a row's
// result must depend only on that row.
type KVStore interface {
	RoundKV(x []float32, headDim int) error
}

// linearRows builds the row ranges of a matrix that is one whole tensor.
func linearRows(tensor string, rows int) []RowRange {
	return []RowRange{{Tensor: tensor, Rows: rows}}
}

// product returns the Model's product for one of this layer's matrices, or
// nil for float32.
func (l *Layer) product(role LinearRole, expert int, w []float32, out, in int, rows []RowRange) (Linear, error) {
	if l.lin == nil {
		return nil, nil
	}
	lw := &LinearWeight{Layer: l.Index, Role: role, Expert: expert, Out: out, In: in, Rows: rows, W: w}
	p, err := l.lin.Linear(lw)
	if err != nil {
		return nil, fmt.Errorf("forward: %s: %w", lw.Name(), err)
	}
	return p, nil
}

// attnInRows are the sources of AttentionWeights.In's rows.
func (l *Layer) attnInRows() []RowRange {
	c := l.cfg
	a := c.LayerPrefix(l.Index) + "self_attn."
	return []RowRange{{Tensor: a + "q_proj.weight", Rows: 2 * c.Heads * c.HeadDim},
		{Tensor: a + "k_proj.weight", Rows: c.KVHeads * c.HeadDim},
		{Tensor: a + "v_proj.weight", Rows: c.KVHeads * c.HeadDim}}
}

// gdnInRows are the sources of DeltaNetWeights.In's rows: the split
// projections in order, or Qwen3-Next's fused ones in the order
// unfuseQKVZ reorders them.
func (l *Layer) gdnInRows() []RowRange {
	c := l.cfg
	a := c.LayerPrefix(l.Index) + "linear_attn."
	kd, vd, nv := c.KeyDim(), c.ValueDim(), c.LinValueHeads
	if !l.gdnFused {
		return []RowRange{{Tensor: a + "in_proj_qkv.weight", Rows: 2*kd + vd},
			{Tensor: a + "in_proj_z.weight", Rows: vd},
			{Tensor: a + "in_proj_b.weight", Rows: nv},
			{Tensor: a + "in_proj_a.weight", Rows: nv}}
	}
	qkvz, ba := a+"in_proj_qkvz.weight", a+"in_proj_ba.weight"
	nk, dk, dv := c.LinKeyHeads, c.LinKeyDim, c.LinValueDim
	r := nv / nk
	group := 2*dk + 2*r*dv
	var q, k, v, z, b, av []RowRange
	for g := 0; g < nk; g++ {
		base := g * group
		q = append(q, RowRange{qkvz, base, dk})
		k = append(k, RowRange{qkvz, base + dk, dk})
		v = append(v, RowRange{qkvz, base + 2*dk, r * dv})
		z = append(z, RowRange{qkvz, base + 2*dk + r*dv, r * dv})
		b = append(b, RowRange{ba, g * 2 * r, r})
		av = append(av, RowRange{ba, g*2*r + r, r})
	}
	return append(append(append(append(append(q, k...), v...), z...), b...), av...)
}

// expertRows are the sources of routed expert e's gate, up and down rows,
// as expertSource reads them.
func (s *expertSource) expertRows(e int) (gate, up, down []RowRange) {
	if _, ok := s.src.Shape(s.name(e, "gate_proj")); ok || !s.fused {
		return linearRows(s.name(e, "gate_proj"), s.in), linearRows(s.name(e, "up_proj"), s.in), linearRows(s.name(e, "down_proj"), s.h)
	}
	gu, dn := s.prefix+"experts.gate_up_proj", s.prefix+"experts.down_proj"
	return []RowRange{{gu, e * 2 * s.in, s.in}}, []RowRange{{gu, e*2*s.in + s.in, s.in}}, []RowRange{{dn, e * s.h, s.h}}
}

// products returns the products of a SwiGLU block's matrices.
func (l *Layer) swigluProducts(roles [3]LinearRole, expert int, gate, up, down []float32, inter, hidden int, rows [3][]RowRange) (*ffn.SwiGLUProducts, error) {
	if l.lin == nil {
		return nil, nil
	}
	var p ffn.SwiGLUProducts
	var err error
	if p.Gate, err = l.product(roles[0], expert, gate, inter, hidden, rows[0]); err != nil {
		return nil, err
	}
	if p.Up, err = l.product(roles[1], expert, up, inter, hidden, rows[1]); err != nil {
		return nil, err
	}
	if p.Down, err = l.product(roles[2], expert, down, hidden, inter, rows[2]); err != nil {
		return nil, err
	}
	return &p, nil
}

// project returns the n×P projection h·wᵀ of the normed rows h (n×Hidden)
// with the layer's product for role (float32 without Linears).
func (l *Layer) project(role LinearRole, w []float32, P int, h []float32, n int, rows []RowRange) ([]float32, error) {
	H := l.cfg.Hidden
	p, err := l.product(role, -1, w, P, H, rows)
	if err != nil {
		return nil, err
	}
	out := make([]float32, n*P)
	if err := ffn.Mul(p, out, P, h, n, H, w, P); err != nil {
		return nil, err
	}
	return out, nil
}
