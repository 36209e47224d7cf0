package calib

import (
	"fmt"
	"github.com/ttquant/ttquant/internal/model"
	"math"
)

// ExpertWeights holds one SwiGLU expert, every matrix row-major [out, in]:
// Gate and Up are [inter, hidden], Down is [hidden, inter]. The expert
// computes down(silu(gate·x) ⊙ up·x).
type ExpertWeights struct {
	Gate, Up, Down []float32
}

// check verifies the three shapes; what names the expert in errors.
func (w *ExpertWeights) check(what string, hidden, inter int) error {
	if w == nil {
		return fmt.Errorf("calib: %s: no weights", what)
	}
	if len(w.Gate) != inter*hidden {
		return fmt.Errorf("calib: %s: gate_proj holds %d values, want [%d, %d]", what, len(w.Gate), inter, hidden)
	}
	if len(w.Up) != inter*hidden {
		return fmt.Errorf("calib: %s: up_proj holds %d values, want [%d, %d]", what, len(w.Up), inter, hidden)
	}
	if len(w.Down) != hidden*inter {
		return fmt.Errorf("calib: %s: down_proj holds %d values, want [%d, %d]", what, len(w.Down), hidden, inter)
	}
	return nil
}

// ExpertSource hands out the routed experts of one MoE block one at a time,
// so that a caller never needs all of them in memory. Expert may be called
// concurrently from several goroutines and must return the same values for
// the same index every time. The returned matrices are only read.
type ExpertSource interface {
	Expert(e int) (*ExpertWeights, error)
}

// ExpertList is an ExpertSource over experts already in memory.
type ExpertList []*ExpertWeights

// Expert implements ExpertSource.
func (l ExpertList) Expert(e int) (*ExpertWeights, error) {
	if e < 0 || e >= len(l) {
		return nil, fmt.Errorf("calib: expert %d out of range 0..%d", e, len(l)-1)
	}
	return l[e], nil
}

// MoELayer is one Qwen3 MoE block: router, routed experts, and optionally a
// shared expert whose output is scaled by sigmoid(SharedGate·x) (Qwen3-Next,
// Qwen3.5/3.6). The router and the shared-expert gate are always used in
// full precision.
type MoELayer struct {
	Config     model.MoEConfig
	Router     []float32 // [experts, hidden]
	Experts    ExpertSource
	Shared     *ExpertWeights // nil when Config.SharedInter == 0
	SharedGate []float32      // [1, hidden]; nil means the shared expert is not gated
}

// Check validates the layer's fixed parts (router, shared expert).
func (l *MoELayer) Check() error {
	c := l.Config
	if err := c.Validate(); err != nil {
		return err
	}
	if len(l.Router) != c.Experts*c.Hidden {
		return fmt.Errorf("calib: router (mlp.gate) holds %d values, want [%d, %d]", len(l.Router), c.Experts, c.Hidden)
	}
	if l.Experts == nil {
		return fmt.Errorf("calib: MoE layer has no expert source")
	}
	if c.SharedInter > 0 {
		if err := l.Shared.check("shared_expert", c.Hidden, c.SharedInter); err != nil {
			return err
		}
	} else if l.Shared != nil {
		return fmt.Errorf("calib: MoE layer has a shared expert but the config gives it width 0")
	}
	if l.SharedGate != nil && len(l.SharedGate) != c.Hidden {
		return fmt.Errorf("calib: shared_expert_gate holds %d values, want [1, %d]", len(l.SharedGate), c.Hidden)
	}
	return nil
}

// Forward runs the block on tokens×hidden activations x and returns the
// tokens×hidden output:
//
//	out[t] = Σ_{e ∈ topk(t)} w_{t,e} · expert_e(x_t)   (summed in ascending
//	                                                      expert order)
//	       + sigmoid(SharedGate·x_t) · shared(x_t)
//
// Arithmetic is float32 throughout except the dot products of the router and
// shared gate, which follow Route. The expert sum runs over experts in index
// order, as the reference implementation's per-expert loop does.
func (l *MoELayer) Forward(x []float32, tokens int) ([]float32, error) {
	if err := l.Check(); err != nil {
		return nil, err
	}
	r, err := Route(x, tokens, l.Router, l.Config)
	if err != nil {
		return nil, err
	}
	out := make([]float32, tokens*l.Config.Hidden)
	var ws expertScratch
	for e := 0; e < l.Config.Experts; e++ {
		toks, wts := r.ExpertTokens(e)
		if len(toks) == 0 {
			continue
		}
		w, err := l.Experts.Expert(e)
		if err != nil {
			return nil, err
		}
		if err := w.check(fmt.Sprintf("expert %d", e), l.Config.Hidden, l.Config.ExpertInter); err != nil {
			return nil, err
		}
		xe := gatherRows(nil, x, l.Config.Hidden, toks)
		y := ws.forward(w, xe, len(toks), l.Config.Hidden, l.Config.ExpertInter)
		scatterAdd(out, y, l.Config.Hidden, toks, wts)
	}
	if err := l.addShared(out, x, tokens, l.Shared, &ws); err != nil {
		return nil, err
	}
	return out, nil
}

// addShared adds the gated shared expert s (which may be a quantized copy
// of l.Shared) to out.
func (l *MoELayer) addShared(out, x []float32, tokens int, s *ExpertWeights, ws *expertScratch) error {
	if l.Config.SharedInter == 0 {
		return nil
	}
	h := l.Config.Hidden
	y := ws.forward(s, x, tokens, h, l.Config.SharedInter)
	for t, g := range l.sharedGates(x, tokens) {
		o := out[t*h : (t+1)*h]
		for i, v := range y[t*h : (t+1)*h] {
			o[i] += g * v
		}
	}
	return nil
}

// sharedGates returns the shared expert's gate for each of the tokens rows
// of x: sigmoid(x·SharedGate), or 1 when the block has no shared gate.
func (l *MoELayer) sharedGates(x []float32, tokens int) []float32 {
	h := l.Config.Hidden
	g := make([]float32, tokens)
	for t := range g {
		g[t] = 1
		if l.SharedGate != nil {
			g[t] = sigmoid32(dot64(x[t*h:(t+1)*h], l.SharedGate))
		}
	}
	return g
}

// expertScratch keeps buffers between expert evaluations: x for gathered
// token rows, g and u for the gate and up activations, y for the output.
type expertScratch struct {
	x, g, u, y []float32
}

// forward computes rows×hidden outputs of the SwiGLU expert w on rows×hidden
// inputs x. The result aliases the scratch buffer.
func (s *expertScratch) forward(w *ExpertWeights, x []float32, rows, hidden, inter int) []float32 {
	a := s.intermediate(w, x, rows, hidden, inter)
	s.y = grow(s.y, rows*hidden)
	matmulT(s.y, a, rows, inter, w.Down, hidden)
	return s.y
}

// swiglu sets dst[i] = silu(g[i])·u[i].
func swiglu(dst, g, u []float32) {
	for i, v := range g {
		dst[i] = silu32(v) * u[i]
	}
}

func silu32(v float32) float32 {
	return float32(float64(v) / (1 + math.Exp(-float64(v))))
}

func sigmoid32(v float32) float32 {
	return float32(1 / (1 + math.Exp(-float64(v))))
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// gatherRows copies rows idx of the cols-wide matrix x into dst (grown as
// needed) and returns it.
func gatherRows(dst, x []float32, cols int, idx []int32) []float32 {
	dst = grow(dst, len(idx)*cols)
	for i, t := range idx {
		copy(dst[i*cols:(i+1)*cols], x[int(t)*cols:(int(t)+1)*cols])
	}
	return dst
}

// scatterAdd adds w[i]·y[i] to row idx[i] of out.
func scatterAdd(out, y []float32, cols int, idx []int32, w []float32) {
	for i, t := range idx {
		o := out[int(t)*cols : (int(t)+1)*cols]
		wi := w[i]
		for j, v := range y[i*cols : (i+1)*cols] {
			o[j] += wi * v
		}
	}
}
