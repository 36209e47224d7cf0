package calib

import (
	"context"
	"errors"
	"iter"

	"github.com/ttquant/ttquant/internal/model/ffn"
)

// LayerRun is QuantizeMoELayer seen from the caller's side: the inputs go
// down once (NewLayerRun), the expert results come back as a sequence
// (Results) and the layer's report once at the end (Report). Nothing of
// the caller is called from inside the driver.
type LayerRun struct {
	ctx         context.Context
	layer       *ffn.MoE
	calib, held Activations
	opt         LayerOptions
	rep         *LayerReport
	err         error
	started     bool
}

// NewLayerRun prepares the quantization of one MoE layer (see
// QuantizeMoELayer); it starts when Results is ranged over.
func NewLayerRun(ctx context.Context, layer *ffn.MoE, calib, heldOut Activations, opt LayerOptions) *LayerRun {
	return &LayerRun{ctx: ctx, layer: layer, calib: calib, held: heldOut, opt: opt}
}

// errStopped ends a run whose caller left the loop early.
var errStopped = errors.New("calib: the caller stopped reading the results")

// Results runs the layer and yields every routed expert's result in
// ascending order, then the shared expert's; a run can be ranged over once.
// Leaving the loop early stops the run (Report then returns an error).
func (r *LayerRun) Results() iter.Seq[*ExpertResult] {
	return func(yield func(*ExpertResult) bool) {
		if r.started {
			r.err = errors.New("calib: a layer run's results were ranged over twice")
			return
		}
		r.started = true
		r.rep, r.err = QuantizeMoELayer(r.ctx, r.layer, r.calib, r.held, r.opt, func(res *ExpertResult) error {
			if !yield(res) {
				return errStopped
			}
			return nil
		})
	}
}

// Report returns the layer's report and the error that ended the run, once
// Results has been ranged over.
func (r *LayerRun) Report() (*LayerReport, error) {
	if !r.started {
		return nil, errors.New("calib: the layer run has not been ranged over")
	}
	return r.rep, r.err
}
