package ffn

import (
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/rng"
)

func randMatrix(r *rng.SplitMix64, n int, scale float32) []float32 {
	m := make([]float32, n)
	for i := range m {
		m[i] = r.Signed() * scale
	}
	return m
}

// randBlock is a MoE block of random weights with a gated shared expert.
func randBlock(seed uint64) *MoE {
	c := model.MoEConfig{Hidden: 64, Experts: 10, TopK: 3, ExpertInter: 32, SharedInter: 48, NormTopK: true}
	r := rng.SplitMix64{State: seed}
	ex := make(ExpertList, c.Experts)
	for e := range ex {
		ex[e] = &ExpertWeights{Gate: randMatrix(&r, 32*64, 0.2), Up: randMatrix(&r, 32*64, 0.2), Down: randMatrix(&r, 64*32, 0.2)}
	}
	return &MoE{Config: c, Router: randMatrix(&r, 10*64, 0.3), Experts: ex,
		Shared:     &ExpertWeights{Gate: randMatrix(&r, 48*64, 0.2), Up: randMatrix(&r, 48*64, 0.2), Down: randMatrix(&r, 64*48, 0.2)},
		SharedGate: randMatrix(&r, 64, 0.3)}
}

// plainMoE is the block token by token: each routed expert's SwiGLU on the
// token's row alone (kernels.Sgemm's result for a row does not depend on
// the other rows), the weighted outputs added in ascending expert order,
// then the gated shared expert.
func plainMoE(t *testing.T, l *MoE, x []float32, tokens int) []float32 {
	c := l.Config
	h := c.Hidden
	r, err := Route(x, tokens, l.Router, c)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, tokens*h)
	var sc Scratch
	for tok := 0; tok < tokens; tok++ {
		xt := x[tok*h : (tok+1)*h]
		ch := r.Choice[tok*c.TopK : (tok+1)*c.TopK]
		wt := r.Weight[tok*c.TopK : (tok+1)*c.TopK]
		o := out[tok*h : (tok+1)*h]
		for e := 0; e < c.Experts; e++ {
			for j, ce := range ch {
				if int(ce) != e {
					continue
				}
				w, _ := l.Experts.Expert(e)
				y := sc.Forward(w, xt, 1, h, c.ExpertInter)
				for i, v := range y {
					o[i] += wt[j] * v
				}
			}
		}
		y := sc.Forward(l.Shared, xt, 1, h, c.SharedInter)
		var s float64
		for i, v := range xt {
			s += float64(v) * float64(l.SharedGate[i])
		}
		g := Sigmoid(float32(s))
		for i, v := range y {
			o[i] += g * v
		}
	}
	return out
}

// plainTokens is the batch of plainCase.
const plainTokens = 41

// plainCase is randBlock(3) on plainTokens random rows: the block, the
// rows, their routing and the plain per-token block's output.
func plainCase(t *testing.T) (*MoE, []float32, *Routing, []float32) {
	l := randBlock(3)
	x := randMatrix(&rng.SplitMix64{State: 9}, plainTokens*l.Config.Hidden, 1)
	want := plainMoE(t, l, x, plainTokens)
	r, err := Route(x, plainTokens, l.Router, l.Config)
	if err != nil {
		t.Fatal(err)
	}
	return l, x, r, want
}

// TestRunAnyWorkersEqualsPlain: Run gives the plain per-token block's bits
// for every number of experts evaluated at once.
func TestRunAnyWorkersEqualsPlain(t *testing.T) {
	l, x, r, want := plainCase(t)
	const tokens = plainTokens
	for _, w := range []int{1, 2, 3, 4, 10, 16} {
		got, err := l.Run(x, tokens, r, Options{Workers: w})
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%d workers: element %d: %g, plain %g", w, i, got[i], want[i])
			}
		}
	}
	if got, err := l.Forward(x, tokens); err != nil || math.Float32bits(got[5]) != math.Float32bits(want[5]) {
		t.Fatalf("Forward: %v", err)
	}
}

// TestCheckRefusesBadShapes: a wrong router, shared expert or expert shape
// is an error naming the matrix, not a panic.
func TestCheckRefusesBadShapes(t *testing.T) {
	x := make([]float32, 2*64)
	for name, mut := range map[string]func(*MoE){
		"router":             func(l *MoE) { l.Router = l.Router[:10] },
		"shared_expert":      func(l *MoE) { l.Shared.Down = l.Shared.Down[:5] },
		"shared_expert_gate": func(l *MoE) { l.SharedGate = l.SharedGate[:3] },
		"expert 7":           func(l *MoE) { l.Experts.(ExpertList)[7].Up = nil },
	} {
		l := randBlock(5)
		mut(l)
		r, _ := Route(x, 2, randBlock(5).Router, l.Config)
		if name == "expert 7" {
			// route every token to expert 7
			for i := range r.Choice {
				r.Choice[i] = int32(7 - i%3)
			}
			r.index()
		}
		_, err := l.Run(x, 2, r, Options{})
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %q does not name it", name, err)
		}
	}
}

// unstacked returns a copy of w whose gate and up are separate buffers.
func unstacked(w *ExpertWeights) *ExpertWeights {
	return &ExpertWeights{Gate: append([]float32(nil), w.Gate...), Up: append([]float32(nil), w.Up...), Down: w.Down}
}

// TestStackedGateUpSameBits: the one product over stacked gate and up rows
// gives the bits of the two products, for row counts around the kernels'
// 6-row tiles, widths off their 16-column slivers, depths over several
// 256-value blocks, one and two workers, and a product large enough for
// the column split.
func TestStackedGateUpSameBits(t *testing.T) {
	defer kernels.SetWorkers(kernels.SetWorkers(0))
	r := rng.SplitMix64{State: 21}
	for _, sh := range []struct{ rows, hidden, inter int }{
		{1, 64, 32}, {5, 300, 17}, {7, 513, 48}, {13, 256, 40}, {64, 2048, 512}, {145, 600, 33},
	} {
		w := &ExpertWeights{Gate: randMatrix(&r, sh.inter*sh.hidden, 0.1), Up: randMatrix(&r, sh.inter*sh.hidden, 0.1),
			Down: randMatrix(&r, sh.hidden*sh.inter, 0.1)}
		sep := unstacked(w)
		w.StackGateUp()
		if w.StackedGateUp() == nil || sep.StackedGateUp() != nil {
			t.Fatal("StackGateUp did not stack, or separate buffers were taken as stacked")
		}
		x := randMatrix(&r, sh.rows*sh.hidden, 1)
		for _, workers := range []int{1, 2} {
			kernels.SetWorkers(workers)
			var a, b Scratch
			ya, _ := a.Run(w, x, sh.rows, sh.hidden, sh.inter, nil, nil, nil)
			yb, _ := b.Run(sep, x, sh.rows, sh.hidden, sh.inter, nil, nil, nil)
			for i := range ya {
				if math.Float32bits(ya[i]) != math.Float32bits(yb[i]) {
					t.Fatalf("%+v, %d workers: element %d: stacked %g, separate %g", sh, workers, i, ya[i], yb[i])
				}
			}
		}
	}
}

// readerList is an ExpertReader over experts in memory, reading into the
// caller's buffers with gate and up stacked, as the forward pass's reader
// does.
type readerList struct{ ExpertList }

func (l readerList) ReadExpert(e int, dst *ExpertWeights) error {
	w, err := l.Expert(e)
	if err != nil {
		return err
	}
	gu := Grow(dst.StackedGateUp(), 2*len(w.Gate))
	copy(gu, w.Gate)
	copy(gu[len(w.Gate):], w.Up)
	dst.Gate, dst.Up = gu[:len(w.Gate)], gu[len(w.Gate):]
	dst.Down = append(Grow(dst.Down, 0), w.Down...)
	return nil
}

// TestRunScratchReusedSameBits: with a RunScratch kept between calls, an
// ExpertReader source and products that keep float32 (through the
// evaluation inside the wave's tasks), Run gives the plain block's bits,
// and a call in the steady state allocates no expert buffers.
func TestRunScratchReusedSameBits(t *testing.T) {
	l, x, r, want := plainCase(t)
	const tokens = plainTokens
	l.Experts = readerList{l.Experts.(ExpertList)}
	f32 := func(int, *ExpertWeights) (*SwiGLUProducts, error) { return nil, nil }
	var rs RunScratch
	for _, opt := range []Options{{Workers: 3, Scratch: &rs}, {Workers: 2, Scratch: &rs}, {Workers: 3, Scratch: &rs, Products: f32}} {
		for range 2 {
			got, err := l.Run(x, tokens, r, opt)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("workers %d, products %v: element %d: %g, plain %g", opt.Workers, opt.Products != nil, i, got[i], want[i])
				}
			}
		}
	}
	// In the steady state the routed loop allocates nothing: a call
	// with the scratch allocates at least the wave's expert buffers (24
	// KiB each) less than one without.
	alloc := func(opt Options) uint64 {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		if _, err := l.Run(x, tokens, r, opt); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&m1)
		return m1.TotalAlloc - m0.TotalAlloc
	}
	kept, fresh := alloc(Options{Workers: 2, Scratch: &rs}), alloc(Options{Workers: 2})
	if kept+2*24<<10 > fresh {
		t.Errorf("a steady-state Run allocated %d bytes, one without a kept scratch %d", kept, fresh)
	}
}
