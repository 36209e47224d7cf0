package calib

import (
	"context"
	"fmt"

	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// SiteHessian accumulates the Hessian of the activations recorded at
// (layer, site) over the store's first tokens tokens: the Hessian of every
// matrix that site feeds (q, k and v; gate and up; see model.Site). For a
// site that is not token-aligned (an MTP layer's) the rows of those tokens
// are used (Store.RowsBefore).
func (s *Store) SiteHessian(ctx context.Context, layer int, site string, tokens int64) (*gptq.Hessian, error) {
	si, ok := s.Site(layer, site)
	if !ok {
		return nil, fmt.Errorf("calib: store %s has no %q inputs for layer %d", s.dir, site, layer)
	}
	h := gptq.NewHessian(si.Cols)
	err := s.Stream(layer, site, 0, s.RowsBefore(si, tokens), 4096, func(_ int64, rows []float32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return h.Add(rows, len(rows)/si.Cols)
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// SwiGLUHessian accumulates, over the first tokens tokens of (layer, site)
// (their rows, as for SiteHessian),
// the Hessian of silu(x·Gᵀ) ⊙ (x·Uᵀ): the input of the down projection of
// a SwiGLU block (the shared expert or a dense MLP) whose gate and up
// weights are gate and up, row-major [inter, hidden].
func (s *Store) SwiGLUHessian(ctx context.Context, layer int, site string, tokens int64, gate, up []float32, inter int) (*gptq.Hessian, error) {
	si, ok := s.Site(layer, site)
	if !ok {
		return nil, fmt.Errorf("calib: store %s has no %q inputs for layer %d", s.dir, site, layer)
	}
	hidden := si.Cols
	if inter <= 0 || len(gate) != inter*hidden || len(up) != inter*hidden {
		return nil, fmt.Errorf("calib: SwiGLU Hessian of layer %d: gate and up have %d and %d values, want %d×%d (the site's width)", layer, len(gate), len(up), inter, hidden)
	}
	h := gptq.NewHessian(inter)
	w := &ffn.ExpertWeights{Gate: gate, Up: up}
	var ws ffn.Scratch
	err := s.Stream(layer, site, 0, s.RowsBefore(si, tokens), 1024, func(_ int64, rows []float32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := len(rows) / hidden
		return h.Add(ws.Intermediate(w, rows, n, hidden, inter), n)
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// RowsHessian accumulates the Hessian of rows activations held in memory,
// x = [rows, cols] row-major, in chunks of 4096 rows as SiteHessian reads a
// store: the Hessian of every matrix those rows feed.
func RowsHessian(ctx context.Context, x []float32, cols int) (*gptq.Hessian, error) {
	if cols <= 0 || len(x)%cols != 0 {
		return nil, fmt.Errorf("calib: %d activation values are not whole rows of %d", len(x), cols)
	}
	h := gptq.NewHessian(cols)
	const chunk = 4096
	for r0 := 0; r0 < len(x)/cols; r0 += chunk {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r1 := min(r0+chunk, len(x)/cols)
		if err := h.Add(x[r0*cols:r1*cols], r1-r0); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// SwiGLURowsHessian is SwiGLUHessian over rows held in memory: the Hessian
// of silu(x·Gᵀ) ⊙ (x·Uᵀ) for x = [rows, hidden], gate and up [inter,
// hidden], in chunks of 1024 rows.
func SwiGLURowsHessian(ctx context.Context, x []float32, hidden int, gate, up []float32, inter int) (*gptq.Hessian, error) {
	if hidden <= 0 || len(x)%hidden != 0 {
		return nil, fmt.Errorf("calib: %d activation values are not whole rows of %d", len(x), hidden)
	}
	if inter <= 0 || len(gate) != inter*hidden || len(up) != inter*hidden {
		return nil, fmt.Errorf("calib: SwiGLU Hessian: gate and up have %d and %d values, want %d×%d", len(gate), len(up), inter, hidden)
	}
	h := gptq.NewHessian(inter)
	w := &ffn.ExpertWeights{Gate: gate, Up: up}
	var ws ffn.Scratch
	const chunk = 1024
	rows := len(x) / hidden
	for r0 := 0; r0 < rows; r0 += chunk {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r1 := min(r0+chunk, rows)
		n := r1 - r0
		if err := h.Add(ws.Intermediate(w, x[r0*hidden:r1*hidden], n, hidden, inter), n); err != nil {
			return nil, err
		}
	}
	return h, nil
}
