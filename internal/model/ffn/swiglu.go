package ffn

import (
	"fmt"

	"github.com/ttquant/ttquant/internal/kernels"
)

// ExpertWeights holds one SwiGLU block (a routed expert, the shared expert
// or a dense MLP), every matrix row-major [out, in]: Gate and Up are
// [inter, hidden], Down is [hidden, inter]. It computes
// down(silu(gate·x) ⊙ up·x).
type ExpertWeights struct {
	Gate, Up, Down []float32
}

// Check verifies the three shapes; what names the block in errors.
func (w *ExpertWeights) Check(what string, hidden, inter int) error {
	if w == nil {
		return fmt.Errorf("%s: no weights", what)
	}
	if len(w.Gate) != inter*hidden {
		return fmt.Errorf("%s: gate_proj holds %d values, want [%d, %d]", what, len(w.Gate), inter, hidden)
	}
	if len(w.Up) != inter*hidden {
		return fmt.Errorf("%s: up_proj holds %d values, want [%d, %d]", what, len(w.Up), inter, hidden)
	}
	if len(w.Down) != hidden*inter {
		return fmt.Errorf("%s: down_proj holds %d values, want [%d, %d]", what, len(w.Down), hidden, inter)
	}
	return nil
}

// StackedGateUp returns Gate and Up as one [2·inter, hidden] matrix, the
// gate rows first, when Up directly follows Gate in memory (as
// StackGateUp and the forward pass's expert reader place them), else nil.
// The float32 SwiGLU then computes both in one product: a column of a
// product depends only on its row of x and its column of the weights, so
// the result is that of two products, bit for bit. Gate's capacity then
// reaches over Up: both are read-only.
func (w *ExpertWeights) StackedGateUp() []float32 {
	n := len(w.Gate)
	if n == 0 || len(w.Up) != n || cap(w.Gate) < 2*n {
		return nil
	}
	gu := w.Gate[:2*n]
	if &gu[n] != &w.Up[0] {
		return nil
	}
	return gu
}

// StackGateUp moves Gate and Up into one buffer (see StackedGateUp) unless
// they already share one.
func (w *ExpertWeights) StackGateUp() {
	if len(w.Gate) != len(w.Up) || w.StackedGateUp() != nil {
		return
	}
	n := len(w.Gate)
	gu := append(append(make([]float32, 0, 2*n), w.Gate...), w.Up...)
	w.Gate, w.Up = gu[:n], gu[n:]
}

// fits reports whether the three matrices have the shapes Check wants.
func (w *ExpertWeights) fits(hidden, inter int) bool {
	return w != nil && len(w.Gate) == inter*hidden && len(w.Up) == inter*hidden && len(w.Down) == hidden*inter
}

// Product is one weight matrix's product in numerics the caller chooses:
// MatMulT sets dst (rows × out, leading dimension ldd) to x·Wᵀ for x
// [rows, in].
type Product interface {
	MatMulT(dst []float32, ldd int, x []float32, rows int) error
}

// SwiGLUProducts are the products of one SwiGLU block's three matrices; a
// nil field (or a nil *SwiGLUProducts) is the float32 product, MatMulT.
type SwiGLUProducts struct {
	Gate, Up, Down Product
}

// Mul sets dst (rows×out, leading dimension ldd) = x·wᵀ with p, or with
// MatMulT when p is nil.
func Mul(p Product, dst []float32, ldd int, x []float32, rows, in int, w []float32, out int) error {
	if p == nil {
		MatMulT(dst, ldd, x, rows, in, w, out)
		return nil
	}
	if rows == 0 || out == 0 {
		return nil
	}
	return p.MatMulT(dst, ldd, x[:rows*in], rows)
}

// Scratch keeps one worker's buffers between SwiGLU evaluations. X is free
// for the caller (gathered token rows, typically); the others belong to the
// methods. The zero value is ready to use.
type Scratch struct {
	X []float32
	// g is the input of down_proj; u the up product, or gate and up side
	// by side (rows × 2·inter) from one product over stacked weights.
	g, u, y []float32
}

// Forward computes the rows×hidden outputs of the SwiGLU block w on the
// rows×hidden inputs x in float32. The result aliases the scratch.
func (s *Scratch) Forward(w *ExpertWeights, x []float32, rows, hidden, inter int) []float32 {
	y, _ := s.Run(w, x, rows, hidden, inter, nil, nil, nil) // float32 products cannot fail
	return y
}

// float32Products are the products of a nil *SwiGLUProducts: float32 on
// the CPU. Only read, so one value serves every call without allocating.
var float32Products SwiGLUProducts

// Run is Forward with the products p (nil: float32), writing into y when
// it is not nil (else into the scratch). downIn, when not nil, sees the
// rows×inter input of down_proj, silu(gate·x) ⊙ up·x, before it is used.
func (s *Scratch) Run(w *ExpertWeights, x []float32, rows, hidden, inter int, y []float32, p *SwiGLUProducts, downIn func([]float32) error) ([]float32, error) {
	if p == nil {
		p = &float32Products
	}
	if err := s.gateUp(p, w, x, rows, hidden, inter); err != nil {
		return nil, err
	}
	if y == nil {
		s.y = Grow(s.y, rows*hidden)
		y = s.y
	}
	if downIn != nil {
		if err := downIn(s.g); err != nil {
			return nil, err
		}
	}
	if err := Mul(p.Down, y, hidden, s.g, rows, inter, w.Down, hidden); err != nil {
		return nil, err
	}
	return y, nil
}

// Intermediate computes silu(x·Gateᵀ) ⊙ (x·Upᵀ), the input of down_proj, in
// float32 into the scratch and returns it.
func (s *Scratch) Intermediate(w *ExpertWeights, x []float32, rows, hidden, inter int) []float32 {
	_ = s.gateUp(&SwiGLUProducts{}, w, x, rows, hidden, inter) // float32 products cannot fail
	return s.g
}

// gateUp sets the scratch's g to silu(x·Gateᵀ) ⊙ (x·Upᵀ) with the products p:
// one float32 product over the stacked gate and up rows when w has them
// (StackedGateUp), else one product each. The SwiGLU runs on the kernels'
// workers when there is enough of it (each element is computed alone, so
// the split changes no bit): the exponentials of an expert's intermediate
// cost a tenth of its products.
func (s *Scratch) gateUp(p *SwiGLUProducts, w *ExpertWeights, x []float32, rows, hidden, inter int) error {
	s.g = Grow(s.g, rows*inter)
	if gu := w.StackedGateUp(); gu != nil && p.Gate == nil && p.Up == nil {
		s.u = Grow(s.u, rows*2*inter)
		MatMulT(s.u, 2*inter, x, rows, hidden, gu, 2*inter)
		kernels.ParallelRows(rows, inter, func(r0, r1 int) {
			for r := r0; r < r1; r++ {
				gr := s.u[r*2*inter : (r+1)*2*inter]
				SwiGLU(s.g[r*inter:(r+1)*inter], gr[:inter], gr[inter:])
			}
		})
		return nil
	}
	s.u = Grow(s.u, rows*inter)
	if err := Mul(p.Gate, s.g, inter, x, rows, hidden, w.Gate, inter); err != nil {
		return err
	}
	if err := Mul(p.Up, s.u, inter, x, rows, hidden, w.Up, inter); err != nil {
		return err
	}
	kernels.ParallelRows(rows, inter, func(r0, r1 int) {
		SwiGLU(s.g[r0*inter:r1*inter], s.g[r0*inter:r1*inter], s.u[r0*inter:r1*inter])
	})
	return nil
}

// IntermediatePacked is Intermediate with gate and up already packed by
// kernels.PackB32 (the same bits).
func (s *Scratch) IntermediatePacked(gate, up *kernels.PackedB32, x []float32, rows, hidden, inter int) []float32 {
	s.g = Grow(s.g, rows*inter)
	s.u = Grow(s.u, rows*inter)
	if rows > 0 {
		kernels.SgemmPacked(false, rows, 1, x, hidden, gate, 0, s.g, inter)
		kernels.SgemmPacked(false, rows, 1, x, hidden, up, 0, s.u, inter)
	}
	SwiGLU(s.g, s.g, s.u)
	return s.g
}
