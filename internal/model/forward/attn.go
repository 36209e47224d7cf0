package forward

import (
	"fmt"
	"math"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// Attention block sizes: queries and keys are taken attnBlock at a time,
// so no T×T score matrix exists. Key blocks are aligned to absolute
// positions, which makes a query row's result independent of the other
// rows computed with it (full sequence, prefix or one decoded token).
const attnBlock = 64

// ropeTable returns cos and sin for positions p0..p0+n-1 and the
// RotaryDim/2 frequencies: inv_freq_i = 1/θ^(2i/R) and the angle p·inv_freq
// in float32, as the reference computes them.
func ropeTable(cfg *model.Config, p0, n int) (cos, sin []float32) {
	half := cfg.RotaryDim / 2
	inv := make([]float32, half)
	for i := range inv {
		e := float32(2*i) / float32(cfg.RotaryDim)
		inv[i] = 1 / float32(math.Pow(cfg.RopeTheta, float64(e)))
	}
	cos, sin = make([]float32, n*half), make([]float32, n*half)
	for t := 0; t < n; t++ {
		p := float32(p0 + t)
		for i, f := range inv {
			a := float64(p * f)
			cos[t*half+i] = float32(math.Cos(a))
			sin[t*half+i] = float32(math.Sin(a))
		}
	}
	return cos, sin
}

// rope rotates the first RotaryDim dims of one head vector with the NeoX
// half-split pairing (i, i+R/2).
func rope(x, cos, sin []float32) {
	half := len(cos)
	for i := 0; i < half; i++ {
		x1, x2 := x[i], x[i+half]
		x[i] = x1*cos[i] - x2*sin[i]
		x[i+half] = x2*cos[i] + x1*sin[i]
	}
}

// attnScratch is one worker's buffers for blockwise attention.
type attnScratch struct {
	s    []float32
	m, l []float32
}

// attention runs a gated full-attention block on the normed rows h.
//
// It is long by design: one pass over the block (projections, q/k norms,
// partial RoPE, blockwise causal softmax, output gate), each stage reading
// the last one's buffers; cut into functions, the stages would pass a dozen
// slices and sizes each.
func (l *Layer) attention(b *Batch, h []float32, emit func(Site, []float32, int) error) ([]float32, error) {
	cfg, w := l.cfg, l.Attn
	H := cfg.Hidden
	n := b.Rows()
	nh, nkv, hd := cfg.Heads, cfg.KVHeads, cfg.HeadDim
	qw, kw := nh*hd, nkv*hd
	P := 2*qw + 2*kw
	proj, err := l.project(RoleAttnIn, w.In, P, h, n, l.attnInRows())
	if err != nil {
		return nil, err
	}
	offs := b.offsets()
	q := make([]float32, n*qw)
	gate := make([]float32, n*qw)
	var kLocal, vLocal []float32
	if b.Caches == nil {
		kLocal, vLocal = make([]float32, n*kw), make([]float32, n*kw)
	}
	scale := float32(1 / math.Sqrt(float64(hd)))
	p0s := make([]int, len(b.Lens))
	// Projections split, normed and rotated; keys and values stored.
	kvErrs := make([]error, len(b.Lens))
	kernels.ParallelFor(len(b.Lens), kernels.Workers(), func(s, _ int) {
		o, T := offs[s], b.Lens[s]
		var kdst, vdst []float32
		if b.Caches != nil {
			lc := &b.Caches[s].layers[l.Index]
			p0s[s] = lc.n
			lc.K = append(lc.K, make([]float32, T*kw)...)
			lc.V = append(lc.V, make([]float32, T*kw)...)
			kdst, vdst = lc.K[lc.n*kw:], lc.V[lc.n*kw:]
			lc.n += T
		} else {
			kdst, vdst = kLocal[o*kw:(o+T)*kw], vLocal[o*kw:(o+T)*kw]
		}
		cos, sin := ropeTable(cfg, p0s[s], T)
		half := cfg.RotaryDim / 2
		for t := 0; t < T; t++ {
			pt := proj[(o+t)*P : (o+t+1)*P]
			c, sn := cos[t*half:(t+1)*half], sin[t*half:(t+1)*half]
			for j := 0; j < nh; j++ {
				qh := q[(o+t)*qw+j*hd : (o+t)*qw+(j+1)*hd]
				rmsNormZC(qh, pt[j*2*hd:j*2*hd+hd], hd, w.QNorm, cfg.Eps)
				rope(qh, c, sn)
				for i := range qh {
					qh[i] *= scale
				}
				copy(gate[(o+t)*qw+j*hd:(o+t)*qw+(j+1)*hd], pt[j*2*hd+hd:(j+1)*2*hd])
			}
			for g := 0; g < nkv; g++ {
				kh := kdst[t*kw+g*hd : t*kw+(g+1)*hd]
				rmsNormZC(kh, pt[2*qw+g*hd:2*qw+(g+1)*hd], hd, w.KNorm, cfg.Eps)
				rope(kh, c, sn)
			}
			copy(vdst[t*kw:(t+1)*kw], pt[2*qw+kw:2*qw+2*kw])
		}
		if l.kv != nil {
			if err := l.kv.RoundKV(kdst[:T*kw], hd); err != nil {
				kvErrs[s] = err
				return
			}
			kvErrs[s] = l.kv.RoundKV(vdst[:T*kw], hd)
		}
	})
	for _, err := range kvErrs {
		if err != nil {
			return nil, fmt.Errorf("forward: layer %d key-value cache: %w", l.Index, err)
		}
	}

	out := make([]float32, n*qw)
	scr := make([]attnScratch, kernels.Workers())
	group := nh / nkv
	seqTasks(len(b.Lens), nh, func(s, j, wk int) {
		o, T := offs[s], b.Lens[s]
		if T == 0 {
			return
		}
		var keys, vals []float32
		if b.Caches != nil {
			lc := &b.Caches[s].layers[l.Index]
			keys, vals = lc.K, lc.V
		} else {
			keys, vals = kLocal[o*kw:(o+T)*kw], vLocal[o*kw:(o+T)*kw]
		}
		g := j / group
		attendHead(&scr[wk], q[o*qw+j*hd:], qw, keys[g*hd:], vals[g*hd:], kw, out[o*qw+j*hd:], qw, T, p0s[s], hd)
		for t := 0; t < T; t++ {
			ot := out[(o+t)*qw+j*hd : (o+t)*qw+(j+1)*hd]
			gt := gate[(o+t)*qw+j*hd : (o+t)*qw+(j+1)*hd]
			for i := range ot {
				ot[i] *= ffn.Sigmoid(gt[i])
			}
		}
	})
	if err := emit(SiteAttnOut, out, qw); err != nil {
		return nil, err
	}
	y := make([]float32, n*H)
	po, err := l.product(RoleAttnOut, -1, w.O, H, qw, linearRows(cfg.LayerPrefix(l.Index)+"self_attn.o_proj.weight", H))
	if err != nil {
		return nil, err
	}
	if err := ffn.Mul(po, y, H, out, n, qw, w.O, H); err != nil {
		return nil, err
	}
	return y, nil
}

// attendHead computes causal softmax attention for T query rows (row t at
// absolute position p0+t; q scaled, leading dimension ldq) over keys and
// values at positions 0..p0+T-1 (leading dimension ldk), writing T rows of
// hd values to out (leading dimension ldo). It streams over key blocks with
// a running maximum and sum (online softmax).
func attendHead(sc *attnScratch, q []float32, ldq int, keys, vals []float32, ldk int, out []float32, ldo, T, p0, hd int) {
	B := attnBlock
	sc.s = ffn.Grow(sc.s, B*B)
	sc.m = ffn.Grow(sc.m, B)
	sc.l = ffn.Grow(sc.l, B)
	negInf := float32(math.Inf(-1))
	for q0 := 0; q0 < T; q0 += B {
		mq := min(B, T-q0)
		m, l := sc.m[:mq], sc.l[:mq]
		for i := range m {
			m[i], l[i] = negInf, 0
			clear(out[(q0+i)*ldo : (q0+i)*ldo+hd])
		}
		maxKey := p0 + q0 + mq - 1
		for k0 := 0; k0 <= maxKey; k0 += B {
			mk := min(B, maxKey+1-k0)
			s := sc.s[:mq*mk]
			kernels.Sgemm(false, true, mq, mk, hd, 1, q[q0*ldq:], ldq, keys[k0*ldk:], ldk, 0, s, mk)
			for i := 0; i < mq; i++ {
				row := s[i*mk : (i+1)*mk]
				lim := p0 + q0 + i - k0 // last visible key in this block
				mx := negInf
				for u := 0; u < mk && u <= lim; u++ {
					mx = max(mx, row[u])
				}
				mnew := max(m[i], mx)
				var sum float32
				for u := range row {
					if u > lim {
						row[u] = 0
						continue
					}
					p := float32(math.Exp(float64(row[u] - mnew)))
					row[u] = p
					sum += p
				}
				if mnew != m[i] {
					alpha := float32(math.Exp(float64(m[i] - mnew)))
					l[i] *= alpha
					o := out[(q0+i)*ldo : (q0+i)*ldo+hd]
					for c := range o {
						o[c] *= alpha
					}
					m[i] = mnew
				}
				l[i] += sum
			}
			kernels.Sgemm(false, false, mq, hd, mk, 1, s, mk, vals[k0*ldk:], ldk, 1, out[q0*ldo:], ldo)
		}
		for i := 0; i < mq; i++ {
			o := out[(q0+i)*ldo : (q0+i)*ldo+hd]
			for c := range o {
				o[c] /= l[i]
			}
		}
	}
}
