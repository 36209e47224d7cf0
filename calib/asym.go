package calib

import (
	"fmt"

	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// AsymmetricMinRowsPerColumn is the number of calibration rows per input
// column a matrix needs before it is fitted asymmetrically: the fit
// estimates a cols×cols map from the rows, and with fewer rows its
// estimation noise outweighs what it corrects. Measured on the trained
// tiny model (docs/calibration.md): at 8 rows per column the asymmetric
// fit made the held-out error and the stream drift worse than the
// symmetric one, from 32 on it made both better. A matrix below the bound
// is fitted symmetrically.
const AsymmetricMinRowsPerColumn = 16

// AsymmetricFits reports whether n calibration rows suffice to fit a
// matrix over cols input columns asymmetrically.
func AsymmetricFits(n int64, cols int) bool {
	return n >= int64(AsymmetricMinRowsPerColumn)*int64(cols)
}

// AsymmetricRows yields rows [r0, r1) of an asymmetric fit's inputs x
// (the rows the Hessian is built from) and targets t (the original
// model's inputs at the same tokens), cols values per row each. The slices
// are read before the next call.
type AsymmetricRows func(r0, r1 int) (x, t []float32, err error)

// RowsOf is the AsymmetricRows of two matrices held whole (rows of cols
// values).
func RowsOf(x, t []float32, cols int) AsymmetricRows {
	return func(r0, r1 int) ([]float32, []float32, error) {
		return x[r0*cols : r1*cols], t[r0*cols : r1*cols], nil
	}
}

// SwiGLURowsOf is the AsymmetricRows of a down projection: its inputs are
// silu(x·gqᵀ) ⊙ (x·uqᵀ) with the quantized gate and up, its targets
// silu(t·gᵀ) ⊙ (t·uᵀ) with the original ones (x and t rows of hidden
// values; inter columns out). Rows are formed a chunk at a time.
func SwiGLURowsOf(x, t []float32, hidden int, gq, uq, g, u []float32, inter int) AsymmetricRows {
	wq := &ffn.ExpertWeights{Gate: gq, Up: uq}
	w := &ffn.ExpertWeights{Gate: g, Up: u}
	var sq, so ffn.Scratch
	return func(r0, r1 int) ([]float32, []float32, error) {
		n := r1 - r0
		a := sq.Intermediate(wq, x[r0*hidden:r1*hidden], n, hidden, inter)
		b := so.Intermediate(w, t[r0*hidden:r1*hidden], n, hidden, inter)
		return a, b, nil
	}
}

// AsymmetricTarget returns the weights GPTQ should quantize when a layer
// sees inputs x (n rows of cols values: the inputs the quantized model
// feeds it) but should reproduce what the original weights w (rows×cols,
// row-major) give on the original model's inputs t at the same tokens;
// src yields the rows of x and t.
//
// With H = (2/n)·xᵀx the Hessian f factors, damped to H′ = H + λI as the
// solver damps it, the output error ‖x·Qᵀ − t·wᵀ‖² splits, up to the
// damping, into ‖(Q − w′)·x‖² plus a constant, where
//
//	w′ = w + (2/n)·((t − x)·wᵀ)ᵀ·x·H′⁻¹
//
// is the damped least-squares fit of t·wᵀ on x. GPTQ of w′ with the same
// H therefore minimises the error against the original model's outputs
// instead of the original weights' outputs on the drifted inputs: the
// error the quantized layers before it left in x is partly undone here.
//
// The result is nil when w is its own fit: when t equals x (the
// correction is then exactly zero), and when f found no usable
// factorization (Factor.NoFeedback: without H′⁻¹ there is no fit). The
// products run in float32 over chunks of 1,024 rows, so only a chunk of
// rows exists at once; the inverse in float64 (gptq.Factor.MulInverse).
func AsymmetricTarget(w []float32, rows, cols, n int, f *gptq.Factor, src AsymmetricRows) ([]float32, error) {
	switch {
	case len(w) != rows*cols:
		return nil, fmt.Errorf("calib: asymmetric target: weights hold %d values, want %d × %d", len(w), rows, cols)
	case n <= 0:
		return nil, fmt.Errorf("calib: asymmetric target: %d rows", n)
	case f == nil || f.Cols() != cols:
		return nil, fmt.Errorf("calib: asymmetric target: no factor over %d columns", cols)
	}
	if f.NoFeedback() {
		return nil, nil
	}
	// A multiple of the kernels' inner block, so the sums do not depend on
	// how the rows are chunked beyond it.
	const chunk = 1024
	m := make([]float32, rows*cols)
	d := make([]float32, min(chunk, n)*cols)
	e := make([]float32, min(chunk, n)*rows)
	zero := true
	for r0 := 0; r0 < n; r0 += chunk {
		k := min(chunk, n-r0)
		xs, ts, err := src(r0, r0+k)
		if err != nil {
			return nil, err
		}
		if len(xs) != k*cols || len(ts) != k*cols {
			return nil, fmt.Errorf("calib: asymmetric target: rows %d-%d: %d input and %d target values, want %d × %d", r0, r0+k, len(xs), len(ts), k, cols)
		}
		dk := d[:k*cols]
		same := true
		for i := range dk {
			dk[i] = ts[i] - xs[i]
			if dk[i] != 0 {
				same = false
			}
		}
		if same {
			continue // the chunk contributes nothing
		}
		zero = false
		// e = d·wᵀ (k×rows), m += eᵀ·x (rows×cols).
		kernels.Sgemm(false, true, k, rows, cols, 1, dk, cols, w, cols, 0, e[:k*rows], rows)
		kernels.Sgemm(true, false, rows, cols, k, 1, e[:k*rows], rows, xs, cols, 1, m, cols)
	}
	if zero {
		return nil, nil
	}
	m64 := make([]float64, len(m))
	s := 2 / float64(n)
	for i, v := range m {
		m64[i] = s * float64(v)
	}
	if err := f.MulInverse(m64, rows); err != nil {
		return nil, err
	}
	out := append([]float32(nil), w...)
	for i, v := range m64 {
		out[i] += float32(v)
	}
	return out, nil
}
