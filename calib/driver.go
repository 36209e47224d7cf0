package calib

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
	"github.com/ttquant/ttquant/internal/quant"
)

// StarvedPolicy says what to do with an expert that received fewer routed
// calibration tokens than LayerOptions.MinTokens.
type StarvedPolicy string

// Starved-expert policies.
const (
	// StarvedRTN quantizes the expert's three matrices by round-to-nearest.
	StarvedRTN StarvedPolicy = "rtn"
	// StarvedIdentity runs GPTQ with an identity Hessian for every matrix.
	StarvedIdentity StarvedPolicy = "identity"
	// StarvedAllTokens runs GPTQ with the Hessian of all the layer's
	// calibration tokens (gate/up), and for down_proj with the activations
	// all tokens produce through the expert's quantized gate/up.
	StarvedAllTokens StarvedPolicy = "all-tokens"
)

// ParseStarvedPolicy parses "rtn", "identity" or "all-tokens".
func ParseStarvedPolicy(s string) (StarvedPolicy, error) {
	switch p := StarvedPolicy(strings.ToLower(strings.TrimSpace(s))); p {
	case StarvedRTN, StarvedIdentity, StarvedAllTokens:
		return p, nil
	}
	return "", fmt.Errorf("calib: unknown starved-expert policy %q (want rtn, identity or all-tokens)", s)
}

// DefaultMinTokensFraction is the default starvation threshold as a
// fraction of the layer's calibration tokens (0.5%, the threshold GPTQModel
// uses for its RTN fallback).
const DefaultMinTokensFraction = 0.005

// LayerOptions configures QuantizeMoELayer. The zero value selects the
// defaults given per field.
type LayerOptions struct {
	// Format of the expert matrices: bfp.BFP4 by default.
	Format bfp.Format
	// Axis along which 16 values share an exponent: bfp.DefaultAxis (the
	// output axis, as in plans and on the command line) when zero.
	Axis bfp.Axis
	// Method for the routed and shared experts, quant.GPTQ (the
	// default) or quant.RTN.
	Method quant.Method
	// GPTQ solver options; nil selects gptq.DefaultOptions(). Name is set
	// per matrix.
	GPTQ *gptq.Options
	// MinTokens is the routed-token count below which an expert is
	// starved. 0 selects ceil(MinTokensFraction × calibration tokens); a
	// negative value starves only experts that received no token.
	MinTokens int
	// MinTokensFraction: 0 selects DefaultMinTokensFraction.
	MinTokensFraction float64
	// Starved is the policy for starved experts: StarvedRTN by default.
	Starved StarvedPolicy
	// Workers is the number of experts processed concurrently (default 1).
	// Results are identical for every value.
	Workers int
	// SkipShared leaves the shared expert unquantized (no result for it).
	SkipShared bool
	// Grids, when non-nil, gives the grids of every routed expert's
	// matrices instead of Format and Axis: Grids[e] for expert e, one entry
	// per expert. SharedGrids does the same for the shared expert (nil:
	// Format and Axis). The caller computes them up front; the RTN
	// baseline uses the same grids.
	Grids       []ExpertGrids
	SharedGrids *ExpertGrids
	// Experts, when non-nil, restricts the run to these routed experts (in
	// ascending order, no repeats): the others get no result and are not in
	// the report. Every expert's result depends only on its own routed
	// tokens, so a subset's results are those of the whole run; the
	// held-out block error needs every expert and is refused with a subset.
	// The workers of a split build (package internal/shard) each run the
	// experts of their units.
	Experts []int
}

// ExpertGrids are the grids of one expert's gate_proj, up_proj and
// down_proj.
type ExpertGrids struct {
	Gate, Up, Down gptq.Grid
}

func (g ExpertGrids) of(matrix int) gptq.Grid {
	return [3]gptq.Grid{g.Gate, g.Up, g.Down}[matrix]
}

// validate checks that every grid is set and valid.
func (g ExpertGrids) validate(expert int) error {
	for m := range matrixNames {
		gr := g.of(m)
		if gr == nil {
			return fmt.Errorf("calib: grid of %s %s: no grid", expertName(expert), matrixNames[m])
		}
		if err := gr.Validate(); err != nil {
			return fmt.Errorf("calib: grid of %s %s: %w", expertName(expert), matrixNames[m], err)
		}
	}
	return nil
}

// Validate reports an option out of range: an unknown method or starved
// policy, a minimum token fraction outside [0, 1], negative workers, an
// invalid format and axis, or invalid GPTQ options. QuantizeMoELayer calls
// it before any work.
func (o LayerOptions) Validate() error {
	_, err := o.withDefaults(0)
	return err
}

func (o LayerOptions) withDefaults(tokens int) (LayerOptions, error) {
	if o.Format == 0 {
		o.Format = bfp.BFP4
	}
	if o.Axis == "" {
		o.Axis = bfp.DefaultAxis
	}
	if o.Method == "" {
		o.Method = quant.GPTQ
	}
	if o.Method != quant.GPTQ && o.Method != quant.RTN {
		return o, fmt.Errorf("calib: method %q for experts (want gptq or rtn)", string(o.Method))
	}
	if o.GPTQ == nil {
		d := gptq.DefaultOptions()
		o.GPTQ = &d
	}
	if o.Starved == "" {
		o.Starved = StarvedRTN
	}
	if _, err := ParseStarvedPolicy(string(o.Starved)); err != nil {
		return o, err
	}
	if o.MinTokensFraction == 0 {
		o.MinTokensFraction = DefaultMinTokensFraction
	}
	if o.MinTokensFraction < 0 || o.MinTokensFraction > 1 || math.IsNaN(o.MinTokensFraction) {
		return o, fmt.Errorf("calib: minimum token fraction %g outside [0, 1]", o.MinTokensFraction)
	}
	switch {
	case o.MinTokens == 0:
		o.MinTokens = int(math.Ceil(o.MinTokensFraction * float64(tokens)))
	case o.MinTokens < 0:
		o.MinTokens = 0
	}
	if o.Workers == 0 {
		o.Workers = 1
	}
	if o.Workers < 0 {
		return o, fmt.Errorf("calib: %d workers", o.Workers)
	}
	if err := gptq.NewBFPGrid(o.Format, o.Axis).Validate(); err != nil {
		return o, err
	}
	if err := o.GPTQ.Validate(); err != nil {
		return o, err
	}
	for e, g := range o.Grids {
		if err := g.validate(e); err != nil {
			return o, err
		}
	}
	if o.SharedGrids != nil {
		if err := o.SharedGrids.validate(SharedExpert); err != nil {
			return o, err
		}
	}
	return o, nil
}

// SharedExpert is the Expert index reported for the shared expert.
const SharedExpert = -1

// Hessian sources recorded in MatrixStats.Hessian.
const (
	HessianRouted    = "routed"     // the expert's routed tokens
	HessianAllTokens = "all-tokens" // every calibration token of the layer
	HessianIdentity  = "identity"
	HessianNone      = "none" // round-to-nearest, no Hessian
)

// MatrixStats describes how one matrix was quantized: one per solved
// matrix, as the solver saw it. A checkpoint records manifest.MatrixStats
// per stored tensor instead, made from these (a fused gate/up tensor from
// two of them) with the error of the stored bytes.
type MatrixStats struct {
	Name   string       `json:"name"`   // gate_proj, up_proj or down_proj
	Grid   string       `json:"grid"`   // e.g. "BFP4_b input-axis"
	Method quant.Method `json:"method"` // what was actually applied
	// Hessian is the source of the Hessian (HessianRouted, …) and
	// HessianTokens the number of tokens in it.
	Hessian       string `json:"hessian"`
	HessianTokens int64  `json:"hessian_tokens"`
	// Damp is the absolute damping added to the Hessian diagonal, PercDamp
	// the fraction of its mean that it represents.
	Damp     float64 `json:"damp"`
	PercDamp float64 `json:"perc_damp"`
	// ProxyLoss is ½·tr(ΔHΔᵀ) of the result with the Hessian used (the mean
	// squared output error per token for a token Hessian), RTNProxyLoss the
	// same for round-to-nearest; both 0 without a Hessian.
	ProxyLoss    float64 `json:"proxy_loss"`
	RTNProxyLoss float64 `json:"rtn_proxy_loss"`
	// Fallback is set when the requested method was replaced (or GPTQ
	// ran without error feedback), and says why; its kind is one of the
	// Err… fallback kinds.
	Fallback *FallbackError `json:"fallback,omitempty"`
	// Asymmetric is set when GPTQ quantized the matrix's fit to the
	// original model's outputs (Activations.Target) rather than the
	// matrix itself; ProxyLoss and RTNProxyLoss are then measured
	// against that fit.
	Asymmetric bool `json:"asymmetric,omitempty"`
}

// ExpertStats describes one expert's quantization.
type ExpertStats struct {
	Expert int `json:"expert"` // SharedExpert for the shared expert
	// Tokens is the number of calibration tokens routed to the expert (all
	// tokens for the shared expert).
	Tokens int `json:"tokens"`
	// Starved is set when Tokens < the layer's minimum; Policy is then the
	// starved policy applied and Reason says why.
	Starved  bool           `json:"starved"`
	Policy   StarvedPolicy  `json:"policy,omitempty"`
	Reason   string         `json:"reason,omitempty"`
	Matrices [3]MatrixStats `json:"matrices"`
	// HeldOutTokens is the number of held-out tokens routed to the expert;
	// HeldOutMSE and HeldOutRTNMSE are the mean squared error of its
	// weighted contribution to the block output (quantized vs original),
	// per held-out token and output feature of the layer, for the chosen
	// method and for round-to-nearest.
	HeldOutTokens int     `json:"held_out_tokens"`
	HeldOutMSE    float64 `json:"held_out_mse"`
	HeldOutRTNMSE float64 `json:"held_out_rtn_mse"`
}

// ExpertResult is one quantized expert, handed to the emit callback of
// QuantizeMoELayer.
type ExpertResult struct {
	Expert    int                // 0 … experts−1, or SharedExpert
	Quantized *ffn.ExpertWeights // the quantized matrices, [out, in] row-major, values on the grid
	Stats     ExpertStats
}

// BlockError compares the MoE block's output on held-out tokens.
type BlockError struct {
	Tokens int `json:"tokens"`
	// MSE is the mean squared difference between the block output with
	// quantized experts (the configured method) and with the original
	// weights, over tokens × hidden; RTNMSE the same with every expert
	// matrix rounded to nearest; Ratio = MSE / RTNMSE.
	MSE    float64 `json:"mse"`
	RTNMSE float64 `json:"rtn_mse"`
	Ratio  float64 `json:"ratio"`
	// RefMeanSquare is the mean square of the original output, for scale.
	RefMeanSquare float64 `json:"ref_mean_square"`
}

// LayerReport is the outcome of QuantizeMoELayer.
type LayerReport struct {
	Format    string        `json:"format"`
	Axis      string        `json:"axis"`
	Method    quant.Method  `json:"method"`
	Policy    StarvedPolicy `json:"starved_policy"`
	Tokens    int           `json:"tokens"`     // calibration tokens
	MinTokens int           `json:"min_tokens"` // starvation threshold used
	Experts   []ExpertStats `json:"experts"`
	Shared    *ExpertStats  `json:"shared,omitempty"`
	Starved   []int         `json:"starved"` // starved expert indices
	HeldOut   *BlockError   `json:"held_out,omitempty"`
}

// Activations is a tokens×Hidden row-major matrix of layer inputs.
type Activations struct {
	X      []float32
	Tokens int
	// Target, when not nil, holds the original model's inputs at the same
	// tokens (same shape as X) and makes the calibration asymmetric: the
	// Hessians and the routing still come from X, the inputs the quantized
	// model feeds the layer, but every GPTQ'd matrix is fitted to the
	// original weights' outputs on Target (AsymmetricTarget). Only the
	// calibration activations use it.
	Target []float32
}

// QuantizeMoELayer quantizes the routed experts (and the shared expert) of
// one MoE block from its calibration inputs calib, one expert at a time:
//
//  1. Route the calibration tokens (router in full precision).
//  2. For expert e with routed tokens X_e (gathered into one matrix, one
//     Hessian update): H = Hessian(X_e) for gate_proj and up_proj (shared,
//     and factored once for both), quantize both; then A = silu(X_e·Gqᵀ) ⊙
//     (X_e·Uqᵀ) with the already quantized Gq, Uq, H_down = Hessian(A),
//     quantize down_proj. Starved experts follow opt.Starved.
//  3. The shared expert is a dense MLP over all calibration tokens, in the
//     same gate/up-then-down order.
//  4. When heldOut has tokens, the block output on them is computed with
//     the original, the quantized and the round-to-nearest experts, through
//     the same computation as ffn.MoE.Forward, and compared (LayerReport.HeldOut).
//
// emit, when non-nil, receives every routed expert in ascending order and
// then the shared expert, on the calling goroutine; it must not keep the
// result's slices if it wants memory to stay bounded by a few experts. Peak
// memory is the activations, the routing, one all-token Hessian (shared
// expert or all-tokens policy) and per worker one expert's weights and
// Hessians, whatever the number of experts. With Workers > 1 experts are
// processed concurrently; the results and the report are identical for
// every worker count.
//
// A matrix whose GPTQ fails (non-finite data, an unusable Hessian) is
// rounded to nearest and the reason recorded; bad input shapes are errors.
func QuantizeMoELayer(ctx context.Context, layer *ffn.MoE, calib Activations, heldOut Activations, opt LayerOptions, emit func(*ExpertResult) error) (*LayerReport, error) {
	if err := layer.Check(); err != nil {
		return nil, err
	}
	cfg := layer.Config
	for _, a := range []struct {
		name string
		act  Activations
	}{{"calibration", calib}, {"held-out", heldOut}} {
		if a.act.Tokens < 0 || len(a.act.X) != a.act.Tokens*cfg.Hidden {
			return nil, fmt.Errorf("calib: %s activations hold %d values, want %d tokens × %d", a.name, len(a.act.X), a.act.Tokens, cfg.Hidden)
		}
		if err := checkFinite(a.act.X, cfg.Hidden); err != nil {
			return nil, fmt.Errorf("calib: %s activations: %w", a.name, err)
		}
	}
	if calib.Target != nil {
		if len(calib.Target) != len(calib.X) {
			return nil, fmt.Errorf("calib: asymmetric targets hold %d values, the calibration activations %d", len(calib.Target), len(calib.X))
		}
		if err := checkFinite(calib.Target, cfg.Hidden); err != nil {
			return nil, fmt.Errorf("calib: asymmetric targets: %w", err)
		}
	}
	if calib.Tokens == 0 {
		return nil, errors.New("calib: no calibration tokens")
	}
	opt, err := opt.withDefaults(calib.Tokens)
	if err != nil {
		return nil, err
	}
	d := &driver{layer: layer, cfg: cfg, opt: opt, calib: calib, held: heldOut,
		grid: gptq.NewBFPGrid(opt.Format, opt.Axis)}
	rep := &LayerReport{Method: opt.Method, Policy: opt.Starved, Tokens: calib.Tokens, MinTokens: opt.MinTokens, Starved: []int{}}
	if opt.Grids != nil && len(opt.Grids) != cfg.Experts {
		return nil, fmt.Errorf("calib: grids for %d experts, the layer has %d", len(opt.Grids), cfg.Experts)
	}
	if opt.Grids == nil && opt.SharedGrids == nil {
		rep.Format, rep.Axis = opt.Format.String(), opt.Axis.String()
	}
	if d.route, err = ffn.Route(calib.X, calib.Tokens, layer.Router, cfg); err != nil {
		return nil, err
	}
	if heldOut.Tokens > 0 {
		if d.hroute, err = ffn.Route(heldOut.X, heldOut.Tokens, layer.Router, cfg); err != nil {
			return nil, err
		}
		n := heldOut.Tokens * cfg.Hidden
		d.outRef, d.outQ, d.outRTN = make([]float32, n), make([]float32, n), make([]float32, n)
	}

	ids, err := jobIDs(cfg, opt, heldOut.Tokens)
	if err != nil {
		return nil, err
	}
	d.ids = ids
	err = d.runJobs(ctx, len(ids), func(r *jobResult) error {
		if r.heldOut != nil {
			d.accumulate(r)
		}
		res := r.res
		if res.Expert == SharedExpert {
			rep.Shared = &res.Stats
		} else {
			rep.Experts = append(rep.Experts, res.Stats)
			if res.Stats.Starved {
				rep.Starved = append(rep.Starved, res.Expert)
			}
		}
		if emit != nil {
			return emit(res)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if cfg.SharedInter > 0 && opt.SkipShared && heldOut.Tokens > 0 {
		// The shared expert stays in full precision in every variant; it is
		// added after the routed experts, as in ffn.MoE.Forward.
		var ws ffn.Scratch
		y := ws.Forward(layer.Shared, heldOut.X, heldOut.Tokens, cfg.Hidden, cfg.SharedInter)
		for _, out := range [][]float32{d.outRef, d.outQ, d.outRTN} {
			layer.AddShared(out, y, heldOut.X, heldOut.Tokens)
		}
	}
	if heldOut.Tokens > 0 {
		be := &BlockError{Tokens: heldOut.Tokens}
		be.MSE = meanSqDiff(d.outQ, d.outRef)
		be.RTNMSE = meanSqDiff(d.outRTN, d.outRef)
		be.RefMeanSquare = meanSqDiff(d.outRef, nil)
		if be.RTNMSE > 0 {
			be.Ratio = be.MSE / be.RTNMSE
		}
		rep.HeldOut = be
	}
	return rep, nil
}

// jobIDs lists the driver's jobs: the routed experts opt.Experts names (all
// when nil), then the shared expert's index cfg.Experts unless skipped.
func jobIDs(cfg model.MoEConfig, opt LayerOptions, heldOut int) ([]int, error) {
	var ids []int
	if opt.Experts == nil {
		for e := 0; e < cfg.Experts; e++ {
			ids = append(ids, e)
		}
	} else {
		if heldOut > 0 {
			return nil, errors.New("calib: the held-out block error needs every routed expert; a run over a subset of experts has none")
		}
		for i, e := range opt.Experts {
			if e < 0 || e >= cfg.Experts || (i > 0 && e <= opt.Experts[i-1]) {
				return nil, fmt.Errorf("calib: expert subset %v: want ascending experts of 0..%d without repeats", opt.Experts, cfg.Experts-1)
			}
		}
		ids = append(ids, opt.Experts...)
	}
	if cfg.SharedInter > 0 && !opt.SkipShared {
		ids = append(ids, cfg.Experts)
	}
	return ids, nil
}

// checkFinite reports the first NaN or infinity of the cols-wide rows x
// by token and feature.
func checkFinite(x []float32, cols int) error {
	if i := kernels.FirstNonFinite32(x); i >= 0 {
		return fmt.Errorf("token %d feature %d is %v", i/cols, i%cols, x[i])
	}
	return nil
}

func meanSqDiff(a, b []float32) float64 {
	if len(a) == 0 {
		return 0
	}
	var s float64
	for i, v := range a {
		d := float64(v)
		if b != nil {
			d -= float64(b[i])
		}
		s += d * d
	}
	return s / float64(len(a))
}

// gridFor returns the grid of one matrix.
func (d *driver) gridFor(expert, matrix int) (gptq.Grid, error) {
	switch {
	case expert == SharedExpert && d.opt.SharedGrids != nil:
		return d.opt.SharedGrids.of(matrix), nil
	case expert >= 0 && d.opt.Grids != nil:
		return d.opt.Grids[expert].of(matrix), nil
	}
	return d.grid, nil
}

func expertName(e int) string {
	if e == SharedExpert {
		return "shared expert"
	}
	return fmt.Sprintf("expert %d", e)
}

// driver holds the state shared by the jobs of one layer. Everything in it
// is read-only while jobs run, except the lazily built all-token Hessian
// (built under its sync.Once) and the output accumulators (touched only by
// the emitting goroutine).
type driver struct {
	layer  *ffn.MoE
	cfg    model.MoEConfig
	opt    LayerOptions
	grid   gptq.Grid
	calib  Activations
	held   Activations
	route  *ffn.Routing
	hroute *ffn.Routing

	all   allTokenHessian
	ident identityHessian

	// scratch holds *ffn.Scratch buffers for reuse between jobs, so that
	// a worker does not allocate its gathered tokens and intermediate
	// activations anew for every expert.
	scratch sync.Pool

	outRef, outQ, outRTN []float32

	// ids maps job numbers to experts (cfg.Experts: the shared expert).
	ids []int
}

func (d *driver) getScratch() *ffn.Scratch {
	if s, ok := d.scratch.Get().(*ffn.Scratch); ok {
		return s
	}
	return new(ffn.Scratch)
}

func (d *driver) putScratch(s *ffn.Scratch) { d.scratch.Put(s) }

// jobResult is what a job hands to the emitter.
type jobResult struct {
	res     *ExpertResult
	heldOut *heldOutPart
}

// heldOutPart is one expert's weighted contribution to the held-out block
// output in the three variants (rows in hroute order), or, for the shared
// expert, its gated output for every held-out token.
type heldOutPart struct {
	tokens      []int32
	weights     []float32
	ref, q, rtn []float32
	shared      bool
}

// runJobs runs jobs 0 … n−1 (expert e is job e; the shared expert is job
// Experts) on opt.Workers goroutines and calls emit for each result in job
// order. At most 2·Workers results exist at once.
func (d *driver) runJobs(ctx context.Context, n int, emit func(*jobResult) error) error {
	workers := d.opt.Workers
	g, gctx := errgroup.WithContext(ctx)
	done := make([]chan *jobResult, n)
	for i := range done {
		done[i] = make(chan *jobResult, 1)
	}
	window := make(chan struct{}, 2*workers)
	sem := make(chan struct{}, workers)
	g.Go(func() error {
		for i := 0; i < n; i++ {
			select {
			case window <- struct{}{}:
			case <-gctx.Done():
				return gctx.Err()
			}
			select {
			case sem <- struct{}{}:
			case <-gctx.Done():
				return gctx.Err()
			}
			g.Go(func() error {
				defer func() { <-sem }()
				r, err := d.job(gctx, d.ids[i])
				if err != nil {
					return err
				}
				done[i] <- r
				return nil
			})
		}
		return nil
	})
	var emitErr error
	for i := 0; i < n && emitErr == nil; i++ {
		select {
		case r := <-done[i]:
			emitErr = emit(r)
			<-window
		case <-gctx.Done():
			emitErr = gctx.Err()
		}
	}
	if emitErr != nil {
		// Stop the dispatcher and workers; report the first real error.
		g.Go(func() error { return emitErr })
	}
	werr := g.Wait()
	if werr != nil {
		return werr
	}
	return emitErr
}

// job quantizes expert i (or the shared expert when i == Experts).
func (d *driver) job(ctx context.Context, i int) (*jobResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if i == d.cfg.Experts {
		return d.sharedJob()
	}
	return d.expertJob(i)
}
