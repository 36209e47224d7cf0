package forward

import (
	"fmt"
	"strconv"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// Layer is one decoder layer's weights in the canonical layout the forward
// code uses, whatever the checkpoint's layout (split or fused Gated
// DeltaNet projections, fused or per-expert experts). Only the routed
// experts stay in the WeightSource; they are read one at a time while the
// MoE block runs.
type Layer struct {
	cfg   *model.Config
	Index int // trunk layer, or Layers+k for MTP layer k
	Kind  model.LayerKind

	InputNorm, PostNorm []float32 // zero-centred RMSNorm offsets [H]

	Attn *AttentionWeights  // Kind == model.FullAttention
	GDN  *DeltaNetWeights   // Kind == model.LinearAttention
	MoE  *ffn.MoE           // sparse MoE block, or
	MLP  *ffn.ExpertWeights // dense SwiGLU MLP

	gdnFused bool    // GDN.In was unfused from in_proj_qkvz and in_proj_ba
	lin      Linears // the Model's products (nil: float32)
	kv       KVStore // the Model's key-value rounding (nil: none)
	// moeRun keeps the MoE block's routed-expert buffers from one batch
	// to the next (nil: each run its own).
	moeRun *ffn.RunScratch
}

// AttentionWeights are the weights of a gated full-attention block.
type AttentionWeights struct {
	// In is q_proj, k_proj and v_proj stacked: [Heads·2·HeadDim +
	// 2·KVHeads·HeadDim, H]. q_proj rows keep their per-head order
	// (256 query rows, then 256 gate rows, head by head).
	In           []float32
	O            []float32 // o_proj [H, Heads·HeadDim]
	QNorm, KNorm []float32 // zero-centred offsets [HeadDim]
}

// DeltaNetWeights are the weights of a Gated DeltaNet block.
type DeltaNetWeights struct {
	// In stacks the input projections in the order q | k | v | z | b | a:
	// [ConvDim + ValueDim + 2·LinValueHeads, H], whether the checkpoint
	// stores them split (Qwen3.5/3.6) or fused per key head (Qwen3-Next).
	In     []float32
	Conv   []float32 // conv1d.weight [ConvDim, ConvKernel]
	DTBias []float32 // [LinValueHeads]
	ALog   []float32 // [LinValueHeads]
	Norm   []float32 // gated RMSNorm scale (plain, not offset) [LinValueDim]
	Out    []float32 // out_proj [H, ValueDim]
}

// CheckLayer verifies that src has every tensor of layer i with the shape
// the config implies, reading headers only.
func CheckLayer(src WeightSource, cfg *model.Config, i int) error {
	_, err := loadLayer(src, cfg, i, false)
	return err
}

// LoadLayer reads layer i (trunk 0..Layers-1, MTP Layers..NumLayers-1) from
// src. Missing tensors, wrong shapes and non-finite values are errors
// naming the tensor.
func LoadLayer(src WeightSource, cfg *model.Config, i int) (*Layer, error) {
	return loadLayer(src, cfg, i, true)
}

// loadLayer is LoadLayer; with read false it checks the tensors' names
// and shapes without reading their values (CheckLayer).
//
// It is long by design: a flat table of every tensor a layer reads, in the
// checkpoint's order, one line each, so that a new tensor is one line
// beside its siblings.
func loadLayer(src WeightSource, cfg *model.Config, i int, read bool) (*Layer, error) {
	if i < 0 || i >= cfg.NumLayers() {
		return nil, fmt.Errorf("forward: layer %d outside 0..%d", i, cfg.NumLayers()-1)
	}
	p := cfg.LayerPrefix(i)
	l := &Layer{cfg: cfg, Index: i, Kind: cfg.Kind(i)}
	H := int64(cfg.Hidden)
	var firstErr error
	get := func(name string, shape ...int64) []float32 {
		if firstErr != nil {
			return nil
		}
		if !read {
			firstErr = checkShape(src, name, shape...)
			return nil
		}
		v, err := readTensor(src, name, shape...)
		if err != nil {
			firstErr = err
		}
		return v
	}
	l.InputNorm = get(p+"input_layernorm.weight", H)
	l.PostNorm = get(p+"post_attention_layernorm.weight", H)
	if l.Kind == model.FullAttention {
		a := p + "self_attn."
		nh, nkv, hd := int64(cfg.Heads), int64(cfg.KVHeads), int64(cfg.HeadDim)
		q := get(a+"q_proj.weight", 2*nh*hd, H)
		k := get(a+"k_proj.weight", nkv*hd, H)
		v := get(a+"v_proj.weight", nkv*hd, H)
		w := &AttentionWeights{
			O:     get(a+"o_proj.weight", H, nh*hd),
			QNorm: get(a+"q_norm.weight", hd),
			KNorm: get(a+"k_norm.weight", hd),
		}
		if read && firstErr == nil {
			w.In = append(append(append(make([]float32, 0, len(q)+len(k)+len(v)), q...), k...), v...)
		}
		l.Attn = w
	} else {
		a := p + "linear_attn."
		nk, nv := int64(cfg.LinKeyHeads), int64(cfg.LinValueHeads)
		dk, dv := int64(cfg.LinKeyDim), int64(cfg.LinValueDim)
		kd, vd := nk*dk, nv*dv
		w := &DeltaNetWeights{}
		if _, fused := src.Shape(a + "in_proj_qkvz.weight"); fused {
			qkvz := get(a+"in_proj_qkvz.weight", 2*kd+2*vd, H)
			ba := get(a+"in_proj_ba.weight", 2*nv, H)
			if read && firstErr == nil {
				w.In = unfuseQKVZ(qkvz, ba, cfg)
			}
			l.gdnFused = true
		} else {
			qkv := get(a+"in_proj_qkv.weight", 2*kd+vd, H)
			z := get(a+"in_proj_z.weight", vd, H)
			b := get(a+"in_proj_b.weight", nv, H)
			av := get(a+"in_proj_a.weight", nv, H)
			if read && firstErr == nil {
				w.In = make([]float32, 0, len(qkv)+len(z)+len(b)+len(av))
				w.In = append(append(append(append(w.In, qkv...), z...), b...), av...)
			}
		}
		w.Conv = get(a+"conv1d.weight", 2*kd+vd, 1, int64(cfg.ConvKernel))
		w.DTBias = get(a+"dt_bias", nv)
		w.ALog = get(a+"A_log", nv)
		w.Norm = get(a+"norm.weight", dv)
		w.Out = get(a+"out_proj.weight", H, vd)
		l.GDN = w
	}
	m := p + "mlp."
	if cfg.IsMoE(i) {
		E, S := int64(cfg.Experts), int64(cfg.SharedInter)
		moe := &ffn.MoE{Config: model.MoEConfig{Hidden: cfg.Hidden, Experts: cfg.Experts, TopK: cfg.TopK,
			ExpertInter: cfg.ExpertInter, SharedInter: cfg.SharedInter, NormTopK: cfg.NormTopK}}
		moe.Router = get(m+"gate.weight", E, H)
		if S > 0 {
			moe.Shared = &ffn.ExpertWeights{
				Gate: get(m+"shared_expert.gate_proj.weight", S, H),
				Up:   get(m+"shared_expert.up_proj.weight", S, H),
				Down: get(m+"shared_expert.down_proj.weight", H, S),
			}
			if read && firstErr == nil {
				moe.Shared.StackGateUp()
			}
			if _, ok := src.Shape(m + "shared_expert_gate.weight"); ok {
				moe.SharedGate = get(m+"shared_expert_gate.weight", 1, H)
			}
		}
		es, err := newExpertSource(src, m, cfg)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		moe.Experts = es
		l.MoE = moe
		l.moeRun = &ffn.RunScratch{}
	} else {
		I := int64(cfg.Intermediate)
		l.MLP = &ffn.ExpertWeights{
			Gate: get(m+"gate_proj.weight", I, H),
			Up:   get(m+"up_proj.weight", I, H),
			Down: get(m+"down_proj.weight", H, I),
		}
		if read && firstErr == nil {
			l.MLP.StackGateUp()
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return l, nil
}

// unfuseQKVZ converts Qwen3-Next's per-key-head grouped in_proj_qkvz
// (q_g, k_g, v of the group's value heads, z of them) and in_proj_ba (b,
// a of the group's value heads) into the stacked q | k | v | z | b | a rows.
func unfuseQKVZ(qkvz, ba []float32, cfg *model.Config) []float32 {
	H := cfg.Hidden
	nk, dk, dv := cfg.LinKeyHeads, cfg.LinKeyDim, cfg.LinValueDim
	r := cfg.LinValueHeads / nk
	kd, vd, nv := cfg.KeyDim(), cfg.ValueDim(), cfg.LinValueHeads
	out := make([]float32, (2*kd+2*vd+2*nv)*H)
	rows := func(dst int, src []float32, from, n int) {
		copy(out[dst*H:(dst+n)*H], src[from*H:(from+n)*H])
	}
	group := 2*dk + 2*r*dv
	for g := 0; g < nk; g++ {
		base := g * group
		rows(g*dk, qkvz, base, dk)                       // q
		rows(kd+g*dk, qkvz, base+dk, dk)                 // k
		rows(2*kd+g*r*dv, qkvz, base+2*dk, r*dv)         // v
		rows(2*kd+vd+g*r*dv, qkvz, base+2*dk+r*dv, r*dv) // z
		rows(2*kd+2*vd+g*r, ba, g*2*r, r)                // b
		rows(2*kd+2*vd+nv+g*r, ba, g*2*r+r, r)           // a
	}
	return out
}

// expertSource reads routed experts from a WeightSource on demand. Expert
// e comes from per-expert tensors when the source has them (so an Overlay
// can substitute single experts), else from the fused tensors.
type expertSource struct {
	src    WeightSource
	prefix string // "...mlp."
	h, in  int
	n      int
	fused  bool
}

func newExpertSource(src WeightSource, prefix string, cfg *model.Config) (*expertSource, error) {
	s := &expertSource{src: src, prefix: prefix, h: cfg.Hidden, in: cfg.ExpertInter, n: cfg.Experts}
	E, I, H := int64(cfg.Experts), int64(cfg.ExpertInter), int64(cfg.Hidden)
	if _, ok := src.Shape(prefix + "experts.gate_up_proj"); ok {
		s.fused = true
		if err := checkShape(src, prefix+"experts.gate_up_proj", E, 2*I, H); err != nil {
			return s, err
		}
		if err := checkShape(src, prefix+"experts.down_proj", E, H, I); err != nil {
			return s, err
		}
		// Per-expert substitutes, where present, must have the right shape.
		for e := 0; e < cfg.Experts; e++ {
			if _, ok := src.Shape(s.name(e, "gate_proj")); ok {
				if err := s.checkPerExpert(e); err != nil {
					return s, err
				}
			}
		}
		return s, nil
	}
	for e := 0; e < cfg.Experts; e++ {
		if err := s.checkPerExpert(e); err != nil {
			return s, err
		}
	}
	return s, nil
}

func (s *expertSource) name(e int, m string) string {
	return s.prefix + "experts." + strconv.Itoa(e) + "." + m + ".weight"
}

func (s *expertSource) checkPerExpert(e int) error {
	I, H := int64(s.in), int64(s.h)
	for _, x := range []struct {
		m     string
		shape []int64
	}{{"gate_proj", []int64{I, H}}, {"up_proj", []int64{I, H}}, {"down_proj", []int64{H, I}}} {
		if err := checkShape(s.src, s.name(e, x.m), x.shape...); err != nil {
			return err
		}
	}
	return nil
}

// Expert implements ffn.ExpertSource.
func (s *expertSource) Expert(e int) (*ffn.ExpertWeights, error) {
	w := &ffn.ExpertWeights{}
	if err := s.ReadExpert(e, w); err != nil {
		return nil, err
	}
	return w, nil
}

// ReadExpert implements ffn.ExpertReader.
func (s *expertSource) ReadExpert(e int, w *ffn.ExpertWeights) error {
	if e < 0 || e >= s.n {
		return fmt.Errorf("forward: expert %d outside 0..%d", e, s.n-1)
	}
	h, in := s.h, s.in
	// Gate and up in one buffer, for the one product of the two.
	gu := ffn.Grow(w.StackedGateUp(), 2*in*h)
	w.Gate, w.Up, w.Down = gu[:in*h], gu[in*h:], ffn.Grow(w.Down, h*in)
	read := func(name string, dst []float32, start int64) error {
		if err := s.src.Read(name, dst, start); err != nil {
			return err
		}
		return checkFinite(name, dst, start)
	}
	if _, ok := s.src.Shape(s.name(e, "gate_proj")); ok || !s.fused {
		for _, x := range []struct {
			m   string
			dst []float32
		}{{"gate_proj", w.Gate}, {"up_proj", w.Up}, {"down_proj", w.Down}} {
			if err := read(s.name(e, x.m), x.dst, 0); err != nil {
				return err
			}
		}
		return nil
	}
	gup, dn := s.prefix+"experts.gate_up_proj", s.prefix+"experts.down_proj"
	if err := read(gup, gu, int64(e)*int64(2*in*h)); err != nil { // gate rows, then up rows
		return err
	}
	if err := read(dn, w.Down, int64(e)*int64(h*in)); err != nil {
		return err
	}
	return nil
}
