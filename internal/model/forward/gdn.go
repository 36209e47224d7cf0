package forward

import (
	"math"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// gdnScratch is one worker's buffers for the per-head delta rule.
type gdnScratch struct {
	ch      chunkScratch[float32]
	q, k, v []float32
	beta, g []float32
	o       []float32
	s       []float32
}

// deltaNet runs a Gated DeltaNet block on the normed rows h and returns its
// output (before the residual add).
//
// It is long by design: one pass over the block (projections, causal
// convolution, the gated delta rule per head, gated RMSNorm, output
// projection) sharing one worker scratch; cut into functions, the stages
// would pass a dozen slices and sizes each.
func (l *Layer) deltaNet(b *Batch, h []float32, emit func(Site, []float32, int) error) ([]float32, error) {
	cfg, w := l.cfg, l.GDN
	H := cfg.Hidden
	n := b.Rows()
	nk, nv, dk, dv := cfg.LinKeyHeads, cfg.LinValueHeads, cfg.LinKeyDim, cfg.LinValueDim
	kd, vd, cd := cfg.KeyDim(), cfg.ValueDim(), cfg.ConvDim()
	K := cfg.ConvKernel
	r := nv / nk
	P := cd + vd + 2*nv
	proj, err := l.project(RoleGDNIn, w.In, P, h, n, l.gdnInRows())
	if err != nil {
		return nil, err
	}
	offs := b.offsets()
	// Convolution, SiLU, L2 norms and gates, one sequence per task.
	u := make([]float32, n*cd)
	beta := make([]float32, n*nv)
	gl := make([]float32, n*nv)
	qScale := float32(1 / math.Sqrt(float64(dk)))
	kernels.ParallelFor(len(b.Lens), kernels.Workers(), func(s, _ int) {
		o, T := offs[s], b.Lens[s]
		var lc *layerCache
		if b.Caches != nil {
			lc = &b.Caches[s].layers[l.Index]
			if lc.conv == nil {
				lc.conv = make([]float32, (K-1)*cd)
			}
			if lc.S == nil {
				lc.S = make([]float32, nv*dk*dv)
			}
		}
		// x(τ) is the pre-activation row at relative position τ (τ < 0:
		// the cached tail or zeros).
		row := func(tau int) []float32 {
			if tau >= 0 {
				return proj[(o+tau)*P : (o+tau)*P+cd]
			}
			if lc == nil {
				return nil
			}
			i := K - 1 + tau
			return lc.conv[i*cd : (i+1)*cd]
		}
		for t := 0; t < T; t++ {
			ut := u[(o+t)*cd : (o+t+1)*cd]
			clear(ut)
			for j := 0; j < K; j++ {
				x := row(t - K + 1 + j)
				if x == nil {
					continue
				}
				for c := range ut {
					ut[c] += w.Conv[c*K+j] * x[c]
				}
			}
			for c, v := range ut {
				ut[c] = ffn.Silu(v)
			}
			for g := 0; g < nk; g++ {
				l2Normalize(ut[g*dk:(g+1)*dk], qScale)
				l2Normalize(ut[kd+g*dk:kd+(g+1)*dk], 1)
			}
			pt := proj[(o+t)*P : (o+t+1)*P]
			bs, as := pt[cd+vd:cd+vd+nv], pt[cd+vd+nv:cd+vd+2*nv]
			for j := 0; j < nv; j++ {
				beta[(o+t)*nv+j] = ffn.Sigmoid(bs[j])
				gl[(o+t)*nv+j] = float32(-math.Exp(float64(w.ALog[j])) * softplus(float64(as[j]+w.DTBias[j])))
			}
		}
		if lc != nil {
			// New tail: the last K-1 rows of (old tail ++ this segment).
			tail := make([]float32, (K-1)*cd)
			for i := 0; i < K-1; i++ {
				if x := row(T - (K - 1) + i); x != nil {
					copy(tail[i*cd:(i+1)*cd], x)
				}
			}
			lc.conv = tail
		}
	})

	// The delta rule, one (sequence, value head) per task.
	out := make([]float32, n*vd)
	scr := make([]gdnScratch, kernels.Workers())
	seqTasks(len(b.Lens), nv, func(s, j, wk int) {
		o, T := offs[s], b.Lens[s]
		if T == 0 {
			return
		}
		sc := &scr[wk]
		gk := j / r
		sc.q, sc.k = ffn.Grow(sc.q, T*dk), ffn.Grow(sc.k, T*dk)
		sc.v, sc.o = ffn.Grow(sc.v, T*dv), ffn.Grow(sc.o, T*dv)
		sc.beta, sc.g = ffn.Grow(sc.beta, T), ffn.Grow(sc.g, T)
		for t := 0; t < T; t++ {
			ut := u[(o+t)*cd : (o+t+1)*cd]
			copy(sc.q[t*dk:(t+1)*dk], ut[gk*dk:(gk+1)*dk])
			copy(sc.k[t*dk:(t+1)*dk], ut[kd+gk*dk:kd+(gk+1)*dk])
			copy(sc.v[t*dv:(t+1)*dv], ut[2*kd+j*dv:2*kd+(j+1)*dv])
			sc.beta[t] = beta[(o+t)*nv+j]
			sc.g[t] = gl[(o+t)*nv+j]
		}
		var S []float32
		if b.Caches != nil {
			// Allocated above; each head owns a disjoint part.
			S = b.Caches[s].layers[l.Index].S[j*dk*dv : (j+1)*dk*dv]
		} else {
			sc.s = ffn.Grow(sc.s, dk*dv)
			clear(sc.s)
			S = sc.s
		}
		if T == 1 && b.Caches != nil {
			DeltaRuleRecurrent(sc.q, sc.k, sc.v, sc.beta, sc.g, T, dk, dv, S, sc.o)
		} else {
			sc.ch.run(sc.q, sc.k, sc.v, sc.beta, sc.g, T, dk, dv, S, sc.o)
		}
		// Gated RMSNorm: o · rms⁻¹ · w · silu(z), per head.
		for t := 0; t < T; t++ {
			ot := sc.o[t*dv : (t+1)*dv]
			z := proj[(o+t)*P+cd+j*dv : (o+t)*P+cd+(j+1)*dv]
			inv := rmsInv(ot, cfg.Eps)
			dst := out[(o+t)*vd+j*dv : (o+t)*vd+(j+1)*dv]
			for i, x := range ot {
				dst[i] = x * inv * w.Norm[i] * ffn.Silu(z[i])
			}
		}
	})
	if err := emit(SiteAttnOut, out, vd); err != nil {
		return nil, err
	}
	y := make([]float32, n*H)
	po, err := l.product(RoleGDNOut, -1, w.Out, H, vd, linearRows(cfg.LayerPrefix(l.Index)+"linear_attn.out_proj.weight", H))
	if err != nil {
		return nil, err
	}
	if err := ffn.Mul(po, y, H, out, n, vd, w.Out, H); err != nil {
		return nil, err
	}
	return y, nil
}
