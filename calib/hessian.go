package calib

import (
	"context"
	"fmt"
	"math"

	"github.com/ttquant/ttquant/gptq"
)

// SiteHessian accumulates the Hessian of the activations recorded at
// (layer, site) over the store's first tokens tokens: the Hessian of every
// matrix that site feeds (q, k and v; gate and up; see model.Site).
func (s *Store) SiteHessian(ctx context.Context, layer int, site string, tokens int64) (*gptq.Hessian, error) {
	si, ok := s.Site(layer, site)
	if !ok {
		return nil, fmt.Errorf("calib: store %s has no %q inputs for layer %d", s.dir, site, layer)
	}
	h := gptq.NewHessian(si.Cols)
	err := s.Stream(layer, site, 0, tokens, 4096, func(_ int64, rows []float32) error {
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

// SwiGLUHessian accumulates, over the first tokens tokens of (layer, site),
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
	var a []float32
	err := s.Stream(layer, site, 0, tokens, 1024, func(_ int64, rows []float32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := len(rows) / hidden
		a = swigluRows(a[:0], rows, n, hidden, gate, up, inter)
		return h.Add(a, n)
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// swigluRows appends silu(x·Gᵀ) ⊙ (x·Uᵀ) for n rows of x (n×hidden) with
// G, U of shape inter×hidden, in float32 with float64 dot products.
func swigluRows(dst, x []float32, n, hidden int, g, u []float32, inter int) []float32 {
	for t := 0; t < n; t++ {
		row := x[t*hidden : (t+1)*hidden]
		for j := 0; j < inter; j++ {
			var sg, su float64
			gr, ur := g[j*hidden:(j+1)*hidden], u[j*hidden:(j+1)*hidden]
			for k, v := range row {
				sg += float64(v) * float64(gr[k])
				su += float64(v) * float64(ur[k])
			}
			gv := float32(sg)
			silu := gv / (1 + float32(math.Exp(float64(-gv))))
			dst = append(dst, silu*float32(su))
		}
	}
	return dst
}
