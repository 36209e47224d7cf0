package ffn

import (
	"fmt"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
)

// ExpertSource hands out the routed experts of one MoE block one at a time,
// so that a caller never needs all of them in memory. Expert may be called
// concurrently from several goroutines and must return the same values for
// the same index every time. The returned matrices are only read.
type ExpertSource interface {
	Expert(e int) (*ExpertWeights, error)
}

// ExpertReader is an ExpertSource that can also read expert e into the
// caller's matrices, growing them as needed, so that a block evaluation
// reuses the same memory for expert after expert instead of allocating
// three matrices for each. ReadExpert may be called concurrently with
// different destinations.
type ExpertReader interface {
	ExpertSource
	ReadExpert(e int, dst *ExpertWeights) error
}

// ExpertList is an ExpertSource over experts already in memory.
type ExpertList []*ExpertWeights

// Expert implements ExpertSource.
func (l ExpertList) Expert(e int) (*ExpertWeights, error) {
	if e < 0 || e >= len(l) {
		return nil, fmt.Errorf("expert %d out of range 0..%d", e, len(l)-1)
	}
	return l[e], nil
}

// MoE is one Qwen3 MoE block: router, routed experts, and optionally a
// shared expert whose output is scaled by sigmoid(SharedGate·x) (Qwen3-Next,
// Qwen3.5/3.6). The router and the shared-expert gate are always used in
// full precision.
type MoE struct {
	Config     model.MoEConfig
	Router     []float32 // [experts, hidden]
	Experts    ExpertSource
	Shared     *ExpertWeights // nil when Config.SharedInter == 0
	SharedGate []float32      // [1, hidden]; nil means the shared expert is not gated
}

// Check validates the block's fixed parts (router, shared expert).
func (l *MoE) Check() error {
	c := l.Config
	if err := c.Validate(); err != nil {
		return err
	}
	if len(l.Router) != c.Experts*c.Hidden {
		return fmt.Errorf("router (mlp.gate) holds %d values, want [%d, %d]", len(l.Router), c.Experts, c.Hidden)
	}
	if l.Experts == nil {
		return fmt.Errorf("MoE block has no expert source")
	}
	if c.SharedInter > 0 {
		if err := l.Shared.Check("shared_expert", c.Hidden, c.SharedInter); err != nil {
			return err
		}
	} else if l.Shared != nil {
		return fmt.Errorf("MoE block has a shared expert but the config gives it width 0")
	}
	if l.SharedGate != nil && len(l.SharedGate) != c.Hidden {
		return fmt.Errorf("shared_expert_gate holds %d values, want [1, %d]", len(l.SharedGate), c.Hidden)
	}
	return nil
}

// Options are how Run computes a block. The zero value is float32 on
// kernels.Workers() goroutines.
type Options struct {
	// Workers is how many experts are evaluated at once (0: kernels.Workers()).
	// The result does not depend on it.
	Workers int
	// Products, when not nil, gives the products of routed expert e (e ≥ 0,
	// weights w) or of the shared expert (e = -1); a nil result is float32.
	// It may be called concurrently.
	Products func(e int, w *ExpertWeights) (*SwiGLUProducts, error)
}

// Forward runs the block on tokens×hidden activations x in float32 and
// returns the tokens×hidden output; it is Route followed by Run.
func (l *MoE) Forward(x []float32, tokens int) ([]float32, error) {
	if err := l.Check(); err != nil {
		return nil, err
	}
	r, err := Route(x, tokens, l.Router, l.Config)
	if err != nil {
		return nil, err
	}
	return l.Run(x, tokens, r, Options{})
}

// Run computes the block's output for the routing r of x:
//
//	out[t] = Σ_{e ∈ topk(t)} w_{t,e} · expert_e(x_t)   (summed in ascending
//	                                                      expert order)
//	       + sigmoid(SharedGate·x_t) · shared(x_t)
//
// Arithmetic is float32 throughout (unless opt.Products says otherwise)
// except the dot products of the router and shared gate, which follow Route.
// The expert sum runs over experts in index order, as the reference
// implementation's per-expert loop does, the additions staying in expert
// order whatever the schedule.
//
// In float32 (opt.Products nil) the experts are taken opt.Workers at a
// time: their weights are read and their rows gathered at once, one
// expert per goroutine, then each expert's products run in turn on all of
// the kernels' workers (each product one call over all of the expert's
// rows, its weights packed once). With other products, whose cost and
// parallelism the caller decides, up to opt.Workers experts are evaluated
// at once, each on one goroutine.
func (l *MoE) Run(x []float32, tokens int, r *Routing, opt Options) ([]float32, error) {
	if err := l.Check(); err != nil {
		return nil, err
	}
	cfg := l.Config
	H := cfg.Hidden
	out := make([]float32, tokens*H)
	W := opt.Workers
	if W <= 0 {
		W = max(1, kernels.Workers())
	}
	scr := make([]Scratch, W) // one per task of a wave
	var err error
	if opt.Products == nil {
		err = l.routed32(out, x, r, scr)
	} else {
		err = l.routedProducts(out, x, r, scr, opt)
	}
	if err != nil {
		return nil, err
	}
	if cfg.SharedInter == 0 {
		return out, nil
	}
	var p *SwiGLUProducts
	if opt.Products != nil {
		if p, err = opt.Products(-1, l.Shared); err != nil {
			return nil, err
		}
	}
	y, err := scr[0].Run(l.Shared, x, tokens, H, cfg.SharedInter, nil, p, nil)
	if err != nil {
		return nil, err
	}
	l.AddShared(out, y, x, tokens)
	return out, nil
}

// routed32 adds the routed experts' float32 outputs to out: waves of
// len(scr) experts read and gathered at once, then evaluated one by one
// with the kernels' workers.
func (l *MoE) routed32(out, x []float32, r *Routing, scr []Scratch) error {
	cfg := l.Config
	H, W := cfg.Hidden, len(scr)
	ws := make([]ExpertWeights, W) // reused wave after wave by an ExpertReader
	use := make([]*ExpertWeights, W)
	errs := make([]error, W)
	for e0 := 0; e0 < cfg.Experts; e0 += W {
		e1 := min(cfg.Experts, e0+W)
		kernels.ParallelFor(e1-e0, W, func(t, _ int) {
			use[t], errs[t] = l.load(e0+t, x, r, &scr[t], &ws[t])
		})
		for t := 0; t < e1-e0; t++ {
			if errs[t] != nil {
				return errs[t]
			}
			if use[t] == nil {
				continue
			}
			toks, wts := r.ExpertTokens(e0 + t)
			y, _ := scr[t].Run(use[t], scr[t].X, len(toks), H, cfg.ExpertInter, nil, nil, nil) // float32 products cannot fail
			ScatterAdd(out, y, H, toks, wts)
		}
	}
	return nil
}

// load reads routed expert e (into buf when buf is not nil and the source
// is an ExpertReader) and gathers its rows of x into sc.X; nil when the
// expert has no tokens.
func (l *MoE) load(e int, x []float32, r *Routing, sc *Scratch, buf *ExpertWeights) (*ExpertWeights, error) {
	cfg := l.Config
	toks, _ := r.ExpertTokens(e)
	if len(toks) == 0 {
		return nil, nil
	}
	w := buf
	var err error
	if rd, ok := l.Experts.(ExpertReader); ok && buf != nil {
		err = rd.ReadExpert(e, buf)
	} else {
		w, err = l.Experts.Expert(e)
	}
	if err != nil {
		return nil, err
	}
	if !w.fits(cfg.Hidden, cfg.ExpertInter) {
		return nil, w.Check(fmt.Sprintf("expert %d", e), cfg.Hidden, cfg.ExpertInter)
	}
	sc.X = GatherRows(sc.X, x, cfg.Hidden, toks)
	return w, nil
}

// routedProducts adds the routed experts' outputs with opt.Products to
// out, len(scr) experts evaluated at once.
func (l *MoE) routedProducts(out, x []float32, r *Routing, scr []Scratch, opt Options) error {
	cfg := l.Config
	H, W := cfg.Hidden, len(scr)
	ys := make([][]float32, W)
	errs := make([]error, W)
	for e0 := 0; e0 < cfg.Experts; e0 += W {
		e1 := min(cfg.Experts, e0+W)
		kernels.ParallelFor(e1-e0, W, func(t, _ int) {
			ys[t], errs[t] = l.expert(e0+t, x, r, &scr[t], opt) // per task: a worker may run two tasks of a wave
		})
		for t := 0; t < e1-e0; t++ {
			if errs[t] != nil {
				return errs[t]
			}
			if ys[t] != nil {
				toks, wts := r.ExpertTokens(e0 + t)
				ScatterAdd(out, ys[t], H, toks, wts)
			}
		}
	}
	return nil
}

// expert evaluates routed expert e on its tokens of x with opt.Products
// (nil when it has none). Its weights are read fresh (ExpertSource.Expert):
// products may keep what they are given.
func (l *MoE) expert(e int, x []float32, r *Routing, sc *Scratch, opt Options) ([]float32, error) {
	w, err := l.load(e, x, r, sc, nil)
	if w == nil || err != nil {
		return nil, err
	}
	p, err := opt.Products(e, w)
	if err != nil {
		return nil, err
	}
	cfg := l.Config
	return sc.Run(w, sc.X, len(sc.X)/cfg.Hidden, cfg.Hidden, cfg.ExpertInter, nil, p, nil)
}

// AddShared adds the gated shared expert's output y (tokens×hidden, the
// shared expert or a quantized copy of it evaluated on x) to out.
func (l *MoE) AddShared(out, y, x []float32, tokens int) {
	h := l.Config.Hidden
	for t, g := range l.SharedGates(x, tokens) {
		o := out[t*h : (t+1)*h]
		for i, v := range y[t*h : (t+1)*h] {
			o[i] += g * v
		}
	}
}

// SharedGates returns the shared expert's gate for each of the tokens rows
// of x: sigmoid(x·SharedGate), or 1 when the block has no shared gate.
func (l *MoE) SharedGates(x []float32, tokens int) []float32 {
	h := l.Config.Hidden
	g := make([]float32, tokens)
	for t := range g {
		g[t] = 1
		if l.SharedGate != nil {
			g[t] = Sigmoid(Dot64(x[t*h:(t+1)*h], l.SharedGate))
		}
	}
	return g
}
