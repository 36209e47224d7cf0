package calib

import (
	"context"
	"fmt"

	"github.com/ttquant/ttquant/gptq"
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
	w := &ExpertWeights{Gate: gate, Up: up}
	var ws expertScratch
	err := s.Stream(layer, site, 0, s.RowsBefore(si, tokens), 1024, func(_ int64, rows []float32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := len(rows) / hidden
		return h.Add(ws.intermediate(w, rows, n, hidden, inter), n)
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}
