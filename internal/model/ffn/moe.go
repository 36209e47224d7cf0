package ffn

import (
	"fmt"
	"sync"

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
	// Scratch, when not nil, keeps the buffers of the routed experts'
	// loop from one Run to the next (nil: the call's own).
	Scratch *RunScratch
}

// RunScratch holds the buffers of MoE.Run's routed-expert loop between
// calls: per task of a wave the gathered rows, the intermediate products
// and, in float32, the expert's weights as an ExpertReader reads them. It
// serves one Run at a time; a Run that finds it in use works with buffers
// of its own. The zero value is ready to use.
type RunScratch struct {
	mu    sync.Mutex
	tasks []routedTask
}

// routedTask is one task of a wave of the routed loop: expert e's weights
// (w, read into buf when the source is an ExpertReader), its rows and
// products (sc), its output y, or the error that stopped it.
type routedTask struct {
	sc  Scratch
	buf ExpertWeights
	w   *ExpertWeights
	y   []float32
	err error
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
	rs := opt.Scratch
	if rs == nil || !rs.mu.TryLock() {
		rs = &RunScratch{}
	} else {
		defer rs.mu.Unlock()
	}
	if len(rs.tasks) < W {
		rs.tasks = append(rs.tasks, make([]routedTask, W-len(rs.tasks))...)
	}
	tasks := rs.tasks[:W]
	if err := l.routed(out, x, r, tasks, opt.Products); err != nil {
		return nil, err
	}
	if cfg.SharedInter == 0 {
		return out, nil
	}
	var p *SwiGLUProducts
	if opt.Products != nil {
		var err error
		if p, err = opt.Products(-1, l.Shared); err != nil {
			return nil, err
		}
	}
	y, err := tasks[0].sc.Run(l.Shared, x, tokens, H, cfg.SharedInter, nil, p, nil)
	if err != nil {
		return nil, err
	}
	l.AddShared(out, y, x, tokens)
	return out, nil
}

// routed adds the routed experts' outputs to out in expert order, waves of
// len(ts) experts: each task of a wave reads its expert and gathers its
// rows of x, and with products (not nil) evaluates the expert there too,
// one goroutine per expert. In float32 the wave's experts are evaluated
// after it, one by one, each product on all of the kernels' workers.
func (l *MoE) routed(out, x []float32, r *Routing, ts []routedTask, products func(int, *ExpertWeights) (*SwiGLUProducts, error)) error {
	cfg := l.Config
	H, W := cfg.Hidden, len(ts)
	for e0 := 0; e0 < cfg.Experts; e0 += W {
		n := min(cfg.Experts-e0, W)
		kernels.ParallelFor(n, W, func(t, _ int) { // per task: a worker may run two tasks of a wave
			ts[t].start(l, e0+t, x, r, products)
		})
		for t := range ts[:n] {
			tk := &ts[t]
			if tk.err != nil {
				return tk.err
			}
			if tk.w == nil {
				continue
			}
			toks, wts := r.ExpertTokens(e0 + t)
			if products == nil {
				var err error
				if tk.y, err = tk.sc.Run(tk.w, tk.sc.X, len(toks), H, cfg.ExpertInter, nil, nil, nil); err != nil {
					return err
				}
			}
			ScatterAdd(out, tk.y, H, toks, wts)
			tk.w, tk.y = nil, nil
		}
	}
	return nil
}

// start is a wave's part of expert e: its weights read and its rows of x
// gathered (nothing when it has no tokens), and with products the expert
// evaluated. Products may keep the weights they are given, so those are
// read fresh (ExpertSource.Expert); in float32 they go into the task's
// buffer when the source is an ExpertReader.
func (tk *routedTask) start(l *MoE, e int, x []float32, r *Routing, products func(int, *ExpertWeights) (*SwiGLUProducts, error)) {
	tk.w, tk.y, tk.err = nil, nil, nil
	buf := &tk.buf
	if products != nil {
		buf = nil
	}
	w, err := l.load(e, x, r, &tk.sc, buf)
	if w == nil || err != nil {
		tk.err = err
		return
	}
	tk.w = w
	if products == nil {
		return
	}
	p, err := products(e, w)
	if err != nil {
		tk.err = err
		return
	}
	cfg := l.Config
	tk.y, tk.err = tk.sc.Run(w, tk.sc.X, len(tk.sc.X)/cfg.Hidden, cfg.Hidden, cfg.ExpertInter, nil, p, nil)
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
	if l.SharedGate == nil {
		for t := range g {
			g[t] = 1
		}
		return g
	}
	kernels.Dot64T(tokens, 1, h, x, h, l.SharedGate, h, g, 1)
	for t, v := range g {
		g[t] = Sigmoid(v)
	}
	return g
}
