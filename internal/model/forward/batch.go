package forward

import (
	"fmt"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// Batch is the residual stream of several independent sequences entering a
// layer: sequence s has Lens[s] rows of X, the sequences one after
// another. Layer.Forward replaces X by the stream leaving the layer.
type Batch struct {
	Lens []int
	X    []float32 // [ΣLens, Hidden]
	// Caches, when not nil, holds one decoding cache per sequence: the
	// rows of X then continue the sequence the cache has seen (positions
	// start after it, the convolution and delta-rule state carry on, keys
	// and values are appended). When nil, every sequence starts from empty
	// state at position 0.
	Caches []*Cache
}

// Rows is the number of token rows in the batch.
func (b *Batch) Rows() int {
	n := 0
	for _, l := range b.Lens {
		n += l
	}
	return n
}

// offsets returns the first row of every sequence, and the row count last:
// sequence s is rows offsets()[s] to offsets()[s+1].
func (b *Batch) offsets() []int {
	offs := make([]int, len(b.Lens)+1)
	for s, ln := range b.Lens {
		offs[s+1] = offs[s] + ln
	}
	return offs
}

func (b *Batch) check(h int) error {
	for s, l := range b.Lens {
		if l < 0 {
			return fmt.Errorf("forward: sequence %d has negative length %d", s, l)
		}
	}
	if n := b.Rows(); len(b.X) != n*h {
		return fmt.Errorf("forward: batch holds %d values, want %d rows × hidden %d", len(b.X), n, h)
	}
	if b.Caches != nil && len(b.Caches) != len(b.Lens) {
		return fmt.Errorf("forward: %d caches for %d sequences", len(b.Caches), len(b.Lens))
	}
	return nil
}

// Cache is the decoding state of one sequence: for every layer (trunk and
// MTP, indexed as Config.NumLayers) the convolution tail and delta-rule
// state of a Gated DeltaNet layer, or the keys and values of an attention
// layer.
type Cache struct {
	layers []layerCache
}

type layerCache struct {
	conv []float32 // [ConvKernel-1, ConvDim]: the last pre-activation rows
	S    []float32 // [LinValueHeads, LinKeyDim, LinValueDim]
	K, V []float32 // [positions, KVHeads·HeadDim]; K after k_norm and RoPE
	n    int       // positions held in K, V
}

// NewCache returns an empty cache for a model with configuration cfg.
func NewCache(cfg *model.Config) *Cache {
	return &Cache{layers: make([]layerCache, cfg.NumLayers())}
}

// Site names an activation a layer exposes to a Hook: the inputs of its
// modules, where calibration collects statistics.
type Site int

// Sites, in the order a layer visits them.
const (
	// SiteAttnIn is the input_layernorm output: the input of q/k/v_proj
	// or of the Gated DeltaNet input projections.
	SiteAttnIn Site = iota + 1
	// SiteAttnOut is the input of o_proj (after the output gate) or of
	// out_proj (after the gated norm).
	SiteAttnOut
	// SiteMLPIn is the post_attention_layernorm output: the input of the
	// router, the shared expert and a dense MLP's gate/up.
	SiteMLPIn
	// SiteExpertIn is the rows routed to one expert (Activations.Expert,
	// Tokens and Weights say which and with what mixing weight).
	SiteExpertIn
	// SiteMLPDownIn is a dense MLP's down_proj input.
	SiteMLPDownIn
)

func (s Site) String() string {
	switch s {
	case SiteAttnIn:
		return "attn_in"
	case SiteAttnOut:
		return "attn_out"
	case SiteMLPIn:
		return "mlp_in"
	case SiteExpertIn:
		return "expert_in"
	case SiteMLPDownIn:
		return "mlp_down_in"
	}
	return fmt.Sprintf("Site(%d)", int(s))
}

// Activations is what a Hook receives: Rows rows of Cols values. X aliases
// the layer's buffers and is valid only during the call.
type Activations struct {
	Layer  int
	Site   Site
	Expert int // routed expert for SiteExpertIn, else -1
	Row0   int // the batch row of X's first row (mixer sites come per group)
	Rows   int
	Cols   int
	X      []float32
	// Tokens, for SiteExpertIn, lists the batch rows (ascending) that X's
	// rows come from, and Weights their router weights. Nil otherwise:
	// X's rows are then the batch rows Row0, Row0+1, … in order.
	Tokens  []int32
	Weights []float32
}

// Hook receives a layer's module inputs while it runs; an error stops the
// layer.
type Hook func(a *Activations) error

// MixerRows bounds the token rows whose attention or Gated DeltaNet
// intermediates (projections, convolution outputs, keys and values) exist
// at once: Layer.Forward runs the token mixer over groups of whole
// sequences of at most MixerRows rows (a longer sequence forms its own
// group). The feed-forward part runs over the whole batch, so that every
// expert sees all its routed tokens in one product.
const MixerRows = 4096

// mixerRows is MixerRows; tests lower it.
var mixerRows = MixerRows

// Forward runs the layer on the batch: the residual stream in b.X is
// replaced by the stream leaving the layer. hook, when not nil, sees every
// calibration site; the mixer's sites arrive per group of sequences
// (Activations.Row0 says where the group starts).
func (l *Layer) Forward(b *Batch, hook Hook) error {
	if err := l.ForwardMixer(b, hook); err != nil {
		return err
	}
	return l.ForwardMLP(b, hook)
}

// ForwardMixer runs the first half of the layer: the residual stream in
// b.X gains the attention or Gated DeltaNet block's output. ForwardMLP
// then completes the layer; the two give exactly what Forward gives.
func (l *Layer) ForwardMixer(b *Batch, hook Hook) error {
	cfg := l.cfg
	H := cfg.Hidden
	if err := b.check(H); err != nil {
		return err
	}
	n := b.Rows()
	h := make([]float32, n*H)
	rmsNormZC(h, b.X, H, l.InputNorm, cfg.Eps)
	for s0, r0 := 0, 0; s0 < len(b.Lens); {
		s1, rows := s0, 0
		for s1 < len(b.Lens) && (s1 == s0 || rows+b.Lens[s1] <= mixerRows) {
			rows += b.Lens[s1]
			s1++
		}
		g := &Batch{Lens: b.Lens[s0:s1], X: b.X[r0*H : (r0+rows)*H]}
		if b.Caches != nil {
			g.Caches = b.Caches[s0:s1]
		}
		emit := func(site Site, x []float32, cols int) error {
			if hook == nil {
				return nil
			}
			return hook(&Activations{Layer: l.Index, Site: site, Expert: -1, Row0: r0, Rows: rows, Cols: cols, X: x})
		}
		gh := h[r0*H : (r0+rows)*H]
		if err := emit(SiteAttnIn, gh, H); err != nil {
			return err
		}
		var y []float32
		var err error
		if l.Kind == model.FullAttention {
			y, err = l.attention(g, gh, emit)
		} else {
			y, err = l.deltaNet(g, gh, emit)
		}
		if err != nil {
			return err
		}
		for i, v := range y {
			g.X[i] += v
		}
		s0, r0 = s1, r0+rows
	}
	return nil
}

// ForwardMLP runs the second half of the layer on the stream ForwardMixer
// left: b.X gains the MoE block's or dense MLP's output. A hook error at
// SiteMLPIn leaves b.X as it was.
func (l *Layer) ForwardMLP(b *Batch, hook Hook) error {
	cfg := l.cfg
	H := cfg.Hidden
	if err := b.check(H); err != nil {
		return err
	}
	n := b.Rows()
	h := make([]float32, n*H)
	rmsNormZC(h, b.X, H, l.PostNorm, cfg.Eps)
	emit := func(site Site, x []float32, cols int) error {
		if hook == nil {
			return nil
		}
		return hook(&Activations{Layer: l.Index, Site: site, Expert: -1, Rows: n, Cols: cols, X: x})
	}
	if err := emit(SiteMLPIn, h, H); err != nil {
		return err
	}
	var y []float32
	var err error
	if l.MoE != nil {
		y, err = l.moe(h, n, hook)
	} else {
		y, err = l.mlp(h, n, emit)
	}
	if err != nil {
		return err
	}
	for i, v := range y {
		b.X[i] += v
	}
	return nil
}

// moe runs the sparse MoE block, ffn.MoE: calibration's routing and
// arithmetic, bit for bit, with the products of Linears where the model
// has them. Up to kernels.Workers() experts are evaluated at once (the
// additions stay in expert order). The hook, when set, sees each expert's
// routed rows first.
func (l *Layer) moe(h []float32, n int, hook Hook) ([]float32, error) {
	blk := l.MoE
	if err := blk.Check(); err != nil {
		return nil, fmt.Errorf("forward: layer %d MoE: %w", l.Index, err)
	}
	cfg := blk.Config
	H := cfg.Hidden
	r, err := ffn.Route(h, n, blk.Router, cfg)
	if err != nil {
		return nil, err
	}
	if hook != nil {
		var xe []float32
		for e := 0; e < cfg.Experts; e++ {
			toks, wts := r.ExpertTokens(e)
			xe = ffn.GatherRows(xe, h, H, toks)
			if err := hook(&Activations{Layer: l.Index, Site: SiteExpertIn, Expert: e, Rows: len(toks), Cols: H,
				X: xe, Tokens: toks, Weights: wts}); err != nil {
				return nil, err
			}
		}
	}
	opt := ffn.Options{Workers: kernels.Workers(), Scratch: l.moeRun}
	if l.lin != nil {
		opt.Products = l.moeProducts
	}
	out, err := blk.Run(h, n, r, opt)
	if err != nil {
		return nil, fmt.Errorf("forward: layer %d MoE: %w", l.Index, err)
	}
	return out, nil
}

// moeProducts are the Linears' products of routed expert e (e ≥ 0) or of
// the shared expert (e = -1) of the layer's MoE block.
func (l *Layer) moeProducts(e int, w *ffn.ExpertWeights) (*ffn.SwiGLUProducts, error) {
	cfg := l.MoE.Config
	H := cfg.Hidden
	if e < 0 {
		S := cfg.SharedInter
		p := l.cfg.LayerPrefix(l.Index) + "mlp.shared_expert."
		return l.swigluProducts([3]LinearRole{RoleSharedGate, RoleSharedUp, RoleSharedDown}, -1, w.Gate, w.Up, w.Down, S, H,
			[3][]RowRange{linearRows(p+"gate_proj.weight", S), linearRows(p+"up_proj.weight", S), linearRows(p+"down_proj.weight", H)})
	}
	es, _ := l.MoE.Experts.(*expertSource)
	if es == nil {
		return nil, fmt.Errorf("other numerics need the experts read from the model's weight source")
	}
	g, u, d := es.expertRows(e)
	return l.swigluProducts([3]LinearRole{RoleExpertGate, RoleExpertUp, RoleExpertDown}, e, w.Gate, w.Up, w.Down, cfg.ExpertInter, H, [3][]RowRange{g, u, d})
}

// mlp runs a dense SwiGLU MLP, emitting the input of down_proj.
func (l *Layer) mlp(h []float32, n int, emit func(Site, []float32, int) error) ([]float32, error) {
	H, I := l.cfg.Hidden, l.cfg.Intermediate
	p := l.cfg.LayerPrefix(l.Index) + "mlp."
	ps, err := l.swigluProducts([3]LinearRole{RoleMLPGate, RoleMLPUp, RoleMLPDown}, -1, l.MLP.Gate, l.MLP.Up, l.MLP.Down, I, H,
		[3][]RowRange{linearRows(p+"gate_proj.weight", I), linearRows(p+"up_proj.weight", I), linearRows(p+"down_proj.weight", H)})
	if err != nil {
		return nil, err
	}
	var sc ffn.Scratch
	return sc.Run(l.MLP, h, n, H, I, make([]float32, n*H), ps, func(a []float32) error { return emit(SiteMLPDownIn, a, I) })
}

// seqTasks runs f for every (sequence, head) pair on the kernels' workers.
func seqTasks(seqs, heads int, f func(s, head, worker int)) {
	kernels.ParallelFor(seqs*heads, kernels.Workers(), func(t, w int) {
		f(t/heads, t%heads, w)
	})
}
