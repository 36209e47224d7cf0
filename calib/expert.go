package calib

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model/ffn"
	"github.com/ttquant/ttquant/internal/quant"
)

// allTokenHessian is the Hessian of every calibration token of the layer,
// built once on first use and then shared read-only, with its GPTQ factor.
type allTokenHessian struct {
	once sync.Once
	h    []float64
	err  error
	f    cachedFactor
}

// cachedFactor is a GPTQ factor of a Hessian that several jobs share (the
// all-token or the identity Hessian), prepared once on first use. A
// gptq.Factor is immutable, so the jobs use it concurrently.
type cachedFactor struct {
	once sync.Once
	f    *gptq.Factor
	err  error
}

// get returns the factor of the cols×cols Hessian h, computing it on the
// first call.
func (c *cachedFactor) get(h []float64, cols int, opt gptq.Options) (*gptq.Factor, error) {
	c.once.Do(func() { c.f, c.err = gptq.NewFactor(h, cols, opt) })
	return c.f, c.err
}

// identityHessian is the identity matrix over the hidden features and its
// factor, shared by the starved experts under StarvedIdentity.
type identityHessian struct {
	once sync.Once
	h    []float64
	f    cachedFactor
}

func (d *driver) identityHidden() ([]float64, *gptq.Factor) {
	d.ident.once.Do(func() { d.ident.h = identity(d.cfg.Hidden) })
	f, err := d.ident.f.get(d.ident.h, d.cfg.Hidden, *d.opt.GPTQ)
	if err != nil {
		f = nil // quantizer.gateUpDown factors per matrix and reports the error
	}
	return d.ident.h, f
}

// allFactor returns the factor of the all-token Hessian h, or nil when it
// cannot be built (the per-matrix path then reports why).
func (d *driver) allFactor(h []float64) *gptq.Factor {
	f, err := d.all.f.get(h, d.cfg.Hidden, *d.opt.GPTQ)
	if err != nil {
		return nil
	}
	return f
}

func (d *driver) allHessian() ([]float64, error) {
	d.all.once.Do(func() {
		hs := gptq.NewHessian(d.cfg.Hidden)
		if err := hs.Add(d.calib.X, d.calib.Tokens); err != nil {
			d.all.err = fmt.Errorf("calib: all-token Hessian: %w", err)
			return
		}
		d.all.h = hs.Matrix()
	})
	return d.all.h, d.all.err
}

// downHessianAll accumulates the down_proj Hessian of all calibration
// tokens passed through the quantized gate q.Gate and up q.Up, in chunks so
// that only a chunk of intermediate activations is held.
func (d *driver) downHessianAll(q *ffn.ExpertWeights, inter int) ([]float64, int64, error) {
	// A multiple of the kernels' inner block (256), so the sums do not
	// depend on the chunk size.
	const chunk = 2048
	h := d.cfg.Hidden
	hs := gptq.NewHessian(inter)
	ws := d.getScratch()
	defer d.putScratch(ws)
	// Gate and up are applied to every chunk: pack them once.
	pg := kernels.PackB32(true, h, inter, q.Gate, h)
	pu := kernels.PackB32(true, h, inter, q.Up, h)
	for t := 0; t < d.calib.Tokens; t += chunk {
		n := min(chunk, d.calib.Tokens-t)
		a := ws.IntermediatePacked(pg, pu, d.calib.X[t*h:(t+n)*h], n, h, inter)
		if err := hs.Add(a, n); err != nil {
			return nil, 0, err
		}
	}
	return hs.Finish(), hs.Tokens(), nil
}

func identity(n int) []float64 {
	h := make([]float64, n*n)
	for i := 0; i < n; i++ {
		h[i*n+i] = 1
	}
	return h
}

var matrixNames = [3]string{"gate_proj", "up_proj", "down_proj"}

// quantizer quantizes the matrices of one expert and records what it did.
type quantizer struct {
	d      *driver
	expert int    // index or SharedExpert
	what   string // "expert 12", "shared expert"
}

// rtn rounds one matrix to nearest and fills its stats.
func (qz quantizer) rtn(i int, w []float32, rows, cols int, fallback *FallbackError) ([]float32, MatrixStats, error) {
	g, err := qz.d.gridFor(qz.expert, i)
	if err != nil {
		return nil, MatrixStats{}, err
	}
	ms := MatrixStats{Name: matrixNames[i], Grid: g.String(), Method: quant.RTN, Hessian: HessianNone, Fallback: fallback}
	// The layer's exponent rule, unweighted: a starved expert's few
	// tokens, or a failed solve, give no weights to trust.
	q, err := gptq.RTNWith(w, rows, cols, g, gptq.RTNOptions{Exponent: qz.d.opt.GPTQ.Exponent, Name: qz.what + " " + matrixNames[i]})
	if err != nil {
		return nil, ms, fmt.Errorf("calib: %s %s [%d, %d]: %w", qz.what, matrixNames[i], rows, cols, err)
	}
	return q, ms, nil
}

// gptq quantizes one matrix with Hessian h (source src, tokens n); when the
// solver fails or yields a non-finite value the matrix is rounded to nearest
// and the reason recorded. f, when not nil, is h already factored with the
// layer's options (gptq.Factor.Quantize gives exactly gptq.Quantize's
// result); with f nil the factorization is done here.
//
// target, when not nil, is what GPTQ quantizes instead of w (the
// asymmetric target, see AsymmetricTarget); a fallback still rounds w.
func (qz quantizer) gptq(i int, w, target []float32, rows, cols int, h []float64, f *gptq.Factor, src string, n int64) ([]float32, MatrixStats, error) {
	g, err := qz.d.gridFor(qz.expert, i)
	if err != nil {
		return nil, MatrixStats{}, err
	}
	opt := *qz.d.opt.GPTQ
	opt.Name = qz.what + " " + matrixNames[i]
	fit := w
	if target != nil {
		fit = target
	}
	var res *gptq.Result
	if f != nil {
		res, err = f.Quantize(fit, rows, g, opt)
	} else {
		res, err = gptq.Quantize(fit, rows, cols, h, g, opt)
	}
	if errors.Is(err, gptq.ErrOptions) {
		return nil, MatrixStats{}, err // an invalid option is never a fallback
	}
	if err != nil {
		return qz.rtn(i, w, rows, cols, Fallback(ErrGPTQFailed, "", err))
	}
	if !kernels.AllFinite32(res.Q) {
		return qz.rtn(i, w, rows, cols, Fallback(ErrNonFiniteResult, "", nil))
	}
	ms := MatrixStats{Name: matrixNames[i], Grid: g.String(), Method: quant.GPTQ, Hessian: src, HessianTokens: n,
		Damp: res.Damp, PercDamp: res.PercDamp, ProxyLoss: res.ProxyLoss, RTNProxyLoss: res.RTNProxyLoss}
	if res.NoFeedback {
		ms.Fallback = Fallback(ErrNoFeedback, "", nil)
	}
	if !finite(ms.ProxyLoss) || !finite(ms.RTNProxyLoss) || !finite(ms.Damp) {
		return qz.rtn(i, w, rows, cols, Fallback(ErrNonFiniteLoss, "", nil))
	}
	return res.Q, ms, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// gateUpDown quantizes an expert in the in-block sequential order: gate and
// up with hGU, then down with the Hessian produced by downH from the
// quantized gate and up. Gate and up share one factorization of hGU: fGU
// when the caller has it, else one made here. When hGU cannot be factored
// each matrix goes through gptq.Quantize, which reports the reason in its
// own name.
//
// tgt, when not nil, makes the fit asymmetric: tgt.x are the rows hGU was
// built from and tgt.t the original model's inputs at the same tokens;
// gate and up are fitted to the original weights' outputs on tgt.t, and
// down to the original expert's intermediate on tgt.t through the
// quantized gate and up on tgt.x (AsymmetricTarget). A matrix whose
// Hessian cannot be factored keeps its symmetric path and reason.
func (qz quantizer) gateUpDown(w *ffn.ExpertWeights, inter int, hGU []float64, fGU *gptq.Factor, srcGU string, nGU int64,
	downH func(q *ffn.ExpertWeights) ([]float64, string, int64, error), tgt *asymRows) (*ffn.ExpertWeights, [3]MatrixStats, error) {
	var st [3]MatrixStats
	h := qz.d.cfg.Hidden
	q := &ffn.ExpertWeights{}
	var err error
	opt := *qz.d.opt.GPTQ
	if fGU == nil {
		opt.Name = qz.what + " gate_proj/up_proj"
		if f, ferr := gptq.NewFactor(hGU, h, opt); ferr == nil {
			fGU = f
			defer f.Release() // made here, used only here
		}
	}
	var tg, tu, td []float32
	if tgt != nil && !tgt.same && fGU != nil && AsymmetricFits(int64(tgt.n), h) {
		rows := RowsOf(tgt.x, tgt.t, h)
		if tg, err = AsymmetricTarget(w.Gate, inter, h, tgt.n, fGU, rows); err != nil {
			return nil, st, fmt.Errorf("calib: %s gate_proj: %w", qz.what, err)
		}
		if tu, err = AsymmetricTarget(w.Up, inter, h, tgt.n, fGU, rows); err != nil {
			return nil, st, fmt.Errorf("calib: %s up_proj: %w", qz.what, err)
		}
	}
	if q.Gate, st[0], err = qz.gptq(0, w.Gate, tg, inter, h, hGU, fGU, srcGU, nGU); err != nil {
		return nil, st, err
	}
	if q.Up, st[1], err = qz.gptq(1, w.Up, tu, inter, h, hGU, fGU, srcGU, nGU); err != nil {
		return nil, st, err
	}
	st[0].Asymmetric = tg != nil && st[0].Method == quant.GPTQ
	st[1].Asymmetric = tu != nil && st[1].Method == quant.GPTQ
	hd, srcD, nD, err := downH(q)
	if err != nil {
		return nil, st, fmt.Errorf("calib: %s down_proj Hessian: %w", qz.what, err)
	}
	var fD *gptq.Factor
	if tgt != nil && AsymmetricFits(int64(tgt.n), inter) {
		opt.Name = qz.what + " down_proj"
		if f, ferr := gptq.NewFactor(hd, inter, opt); ferr == nil {
			fD = f
			defer f.Release()
			rows := SwiGLURowsOf(tgt.x, tgt.t, h, q.Gate, q.Up, w.Gate, w.Up, inter)
			if td, err = AsymmetricTarget(w.Down, h, inter, tgt.n, fD, rows); err != nil {
				return nil, st, fmt.Errorf("calib: %s down_proj: %w", qz.what, err)
			}
		}
	}
	if q.Down, st[2], err = qz.gptq(2, w.Down, td, h, inter, hd, fD, srcD, nD); err != nil {
		return nil, st, err
	}
	st[2].Asymmetric = td != nil && st[2].Method == quant.GPTQ
	return q, st, nil
}

// asymRows are the rows of an asymmetric fit: x, the inputs the Hessian
// is built from, and t, the original model's inputs at the same tokens
// (n rows each). same says t is x (a store's rows are the original
// model's inputs): gate and up are then their own fits.
type asymRows struct {
	x, t []float32
	n    int
	same bool
}

// aliases reports whether two non-empty slices start at the same element.
func aliases(a, b []float32) bool { return len(a) > 0 && len(b) > 0 && &a[0] == &b[0] }

// allRTN rounds the three matrices to nearest.
func (qz quantizer) allRTN(w *ffn.ExpertWeights, inter int, fallback *FallbackError) (*ffn.ExpertWeights, [3]MatrixStats, error) {
	var st [3]MatrixStats
	h := qz.d.cfg.Hidden
	q := &ffn.ExpertWeights{}
	var err error
	if q.Gate, st[0], err = qz.rtn(0, w.Gate, inter, h, fallback); err != nil {
		return nil, st, err
	}
	if q.Up, st[1], err = qz.rtn(1, w.Up, inter, h, fallback); err != nil {
		return nil, st, err
	}
	if q.Down, st[2], err = qz.rtn(2, w.Down, h, inter, fallback); err != nil {
		return nil, st, err
	}
	return q, st, nil
}

// expertJob quantizes routed expert e.
func (d *driver) expertJob(e int) (*jobResult, error) {
	h, inter := d.cfg.Hidden, d.cfg.ExpertInter
	what := fmt.Sprintf("expert %d", e)
	w, err := d.layer.Experts.Expert(e)
	if err != nil {
		return nil, fmt.Errorf("calib: %s: %w", what, err)
	}
	if err := w.Check(what, h, inter); err != nil {
		return nil, err
	}
	toks, _ := d.route.ExpertTokens(e)
	n := len(toks)
	st := ExpertStats{Expert: e, Tokens: n}
	qz := quantizer{d: d, expert: e, what: what}
	var q *ffn.ExpertWeights
	starved := n == 0 || n < d.opt.MinTokens
	switch {
	case d.opt.Method == quant.RTN:
		q, st.Matrices, err = qz.allRTN(w, inter, nil)
	case starved:
		st.Starved, st.Policy = true, d.opt.Starved
		st.Reason = fmt.Sprintf("%d routed calibration tokens, minimum %d", n, d.opt.MinTokens)
		if n == 0 {
			st.Reason = "no routed calibration tokens"
		}
		switch d.opt.Starved {
		case StarvedRTN:
			q, st.Matrices, err = qz.allRTN(w, inter, Fallback(ErrStarved, "starved expert: "+st.Reason, nil))
		case StarvedIdentity:
			hi, fi := d.identityHidden()
			q, st.Matrices, err = qz.gateUpDown(w, inter, hi, fi, HessianIdentity, 0,
				func(*ffn.ExpertWeights) ([]float64, string, int64, error) {
					return identity(inter), HessianIdentity, 0, nil
				}, nil)
		case StarvedAllTokens:
			hAll, herr := d.allHessian()
			if herr != nil {
				return nil, herr
			}
			q, st.Matrices, err = qz.gateUpDown(w, inter, hAll, d.allFactor(hAll), HessianAllTokens, int64(d.calib.Tokens),
				func(q *ffn.ExpertWeights) ([]float64, string, int64, error) {
					hd, nd, err := d.downHessianAll(q, inter)
					return hd, HessianAllTokens, nd, err
				}, d.allRows())
		}
	default:
		// All routed tokens in one gathered matrix and one Hessian update
		// each for gate/up and for down.
		ws := d.getScratch()
		defer d.putScratch(ws)
		ws.X = ffn.GatherRows(ws.X, d.calib.X, h, toks)
		xe := ws.X
		var tgt *asymRows
		if d.calib.Target != nil {
			if aliases(d.calib.Target, d.calib.X) {
				tgt = &asymRows{x: xe, t: xe, n: n, same: true}
			} else {
				tgt = &asymRows{x: xe, t: ffn.GatherRows(nil, d.calib.Target, h, toks), n: n}
			}
		}
		hs := gptq.NewHessian(h)
		if err := hs.Add(xe, n); err != nil {
			return nil, fmt.Errorf("calib: %s gate/up Hessian: %w", what, err)
		}
		hGU := hs.Finish() // built in place; recycled once gate and up are done
		hs = nil
		defer gptq.RecycleMatrix(hGU)
		q, st.Matrices, err = qz.gateUpDown(w, inter, hGU, nil, HessianRouted, int64(n),
			func(q *ffn.ExpertWeights) ([]float64, string, int64, error) {
				a := ws.Intermediate(q, xe, n, h, inter)
				hd := gptq.NewHessian(inter)
				if err := hd.Add(a, n); err != nil {
					return nil, "", 0, err
				}
				return hd.Finish(), HessianRouted, int64(n), nil
			}, tgt)
	}
	if err != nil {
		return nil, err
	}
	r := &jobResult{res: &ExpertResult{Expert: e, Quantized: q}}
	if d.hroute != nil {
		htoks, hw := d.hroute.ExpertTokens(e)
		st.HeldOutTokens = len(htoks)
		if len(htoks) > 0 {
			part, err := d.heldOutPart(w, q, inter, htoks, hw, qz, &st)
			if err != nil {
				return nil, err
			}
			r.heldOut = part
		}
	}
	r.res.Stats = st
	return r, nil
}

// heldOutPart evaluates expert w, its quantized version q and its
// round-to-nearest version on the held-out tokens routed to it.
func (d *driver) heldOutPart(w, q *ffn.ExpertWeights, inter int, toks []int32, wts []float32, qz quantizer, st *ExpertStats) (*heldOutPart, error) {
	h := d.cfg.Hidden
	rtn, _, err := qz.allRTN(w, inter, nil)
	if err != nil {
		return nil, err
	}
	ws := d.getScratch()
	defer d.putScratch(ws)
	var x []float32
	n := len(toks)
	if toks == nil {
		x = d.held.X
		n = d.held.Tokens
	} else {
		ws.X = ffn.GatherRows(ws.X, d.held.X, h, toks)
		x = ws.X
	}
	p := &heldOutPart{tokens: toks, weights: wts, shared: toks == nil}
	p.ref = append([]float32(nil), ws.Forward(w, x, n, h, inter)...)
	p.q = append([]float32(nil), ws.Forward(q, x, n, h, inter)...)
	p.rtn = append([]float32(nil), ws.Forward(rtn, x, n, h, inter)...)
	// Contribution errors, scaled as the block-level MSE.
	denom := float64(d.held.Tokens) * float64(h)
	var sq, sr float64
	for i := 0; i < n; i++ {
		wi := wts[i]
		for j := 0; j < h; j++ {
			k := i*h + j
			ref := wi * p.ref[k]
			a := float64(wi*p.q[k] - ref)
			b := float64(wi*p.rtn[k] - ref)
			sq += a * a
			sr += b * b
		}
	}
	st.HeldOutMSE, st.HeldOutRTNMSE = sq/denom, sr/denom
	return p, nil
}

// allRows is the asymmetric fit over every calibration token (the shared
// expert and the all-tokens starved policy), nil without a target.
func (d *driver) allRows() *asymRows {
	if d.calib.Target == nil {
		return nil
	}
	return &asymRows{x: d.calib.X, t: d.calib.Target, n: d.calib.Tokens, same: aliases(d.calib.Target, d.calib.X)}
}

// sharedJob quantizes the shared expert as a dense MLP over all calibration
// tokens.
func (d *driver) sharedJob() (*jobResult, error) {
	inter := d.cfg.SharedInter
	w := d.layer.Shared
	qz := quantizer{d: d, expert: SharedExpert, what: "shared expert"}
	st := ExpertStats{Expert: SharedExpert, Tokens: d.calib.Tokens}
	var q *ffn.ExpertWeights
	var err error
	if d.opt.Method == quant.RTN {
		q, st.Matrices, err = qz.allRTN(w, inter, nil)
	} else {
		hAll, herr := d.allHessian()
		if herr != nil {
			return nil, herr
		}
		q, st.Matrices, err = qz.gateUpDown(w, inter, hAll, d.allFactor(hAll), HessianAllTokens, int64(d.calib.Tokens),
			func(q *ffn.ExpertWeights) ([]float64, string, int64, error) {
				hd, nd, err := d.downHessianAll(q, inter)
				return hd, HessianAllTokens, nd, err
			}, d.allRows())
	}
	if err != nil {
		return nil, err
	}
	r := &jobResult{res: &ExpertResult{Expert: SharedExpert, Quantized: q}}
	if d.held.Tokens > 0 {
		// The gates ffn.MoE.AddShared applies.
		g := d.layer.SharedGates(d.held.X, d.held.Tokens)
		st.HeldOutTokens = d.held.Tokens
		part, err := d.heldOutPart(w, q, inter, nil, g, qz, &st)
		if err != nil {
			return nil, err
		}
		r.heldOut = part
	}
	r.res.Stats = st
	return r, nil
}

// accumulate adds a job's held-out contribution to the three block outputs,
// with exactly the operations ffn.MoE.Forward uses.
func (d *driver) accumulate(r *jobResult) {
	p := r.heldOut
	h := d.cfg.Hidden
	if p.shared {
		for t := 0; t < d.held.Tokens; t++ {
			g := p.weights[t]
			for _, pair := range [3][2][]float32{{d.outRef, p.ref}, {d.outQ, p.q}, {d.outRTN, p.rtn}} {
				o := pair[0][t*h : (t+1)*h]
				for i, v := range pair[1][t*h : (t+1)*h] {
					o[i] += g * v
				}
			}
		}
		return
	}
	ffn.ScatterAdd(d.outRef, p.ref, h, p.tokens, p.weights)
	ffn.ScatterAdd(d.outQ, p.q, h, p.tokens, p.weights)
	ffn.ScatterAdd(d.outRTN, p.rtn, h, p.tokens, p.weights)
}
