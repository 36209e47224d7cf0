package forward

import (
	"math"

	"github.com/ttquant/ttquant/internal/kernels"
)

// real is the element type of the delta-rule kernels: float32 for the
// model, float64 for the reference the tests compare against.
type real interface{ float32 | float64 }

// gemm is kernels.Sgemm or kernels.Dgemm by element type.
func gemm[T real](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	switch a := any(a).(type) {
	case []float32:
		kernels.Sgemm(transA, transB, m, n, k, any(alpha).(float32), a, lda, any(b).([]float32), ldb, any(beta).(float32), any(c).([]float32), ldc)
	case []float64:
		kernels.Dgemm(transA, transB, m, n, k, any(alpha).(float64), a, lda, any(b).([]float64), ldb, any(beta).(float64), any(c).([]float64), ldc)
	}
}

// ChunkSize is the number of tokens the chunked delta rule handles with
// one set of matrix products.
const ChunkSize = 64

// DeltaRuleRecurrent runs the gated delta rule token by token for one value
// head: q, k are [T, dk] (q already L2-normalised and scaled, k
// L2-normalised), v is [T, dv], beta and g are [T] (g is the log-decay,
// ≤ 0). S is the [dk, dv] state, updated in place; out receives [T, dv].
//
//	S ← exp(g_t)·S;  d = β_t (v_t − k_tᵀS);  S ← S + k_t dᵀ;  o_t = q_tᵀS
func DeltaRuleRecurrent[T real](q, k, v, beta, g []T, n, dk, dv int, S, out []T) {
	pred := make([]T, dv)
	for t := 0; t < n; t++ {
		decay := T(math.Exp(float64(g[t])))
		for i := range S[:dk*dv] {
			S[i] *= decay
		}
		kt := k[t*dk : (t+1)*dk]
		clear(pred)
		for i, kv := range kt {
			row := S[i*dv : (i+1)*dv]
			for j, s := range row {
				pred[j] += kv * s
			}
		}
		vt := v[t*dv : (t+1)*dv]
		b := beta[t]
		for j := range pred {
			pred[j] = b * (vt[j] - pred[j]) // pred now holds d
		}
		for i, kv := range kt {
			row := S[i*dv : (i+1)*dv]
			for j, d := range pred {
				row[j] += kv * d
			}
		}
		ot := out[t*dv : (t+1)*dv]
		clear(ot)
		for i, qv := range q[t*dk : (t+1)*dk] {
			row := S[i*dv : (i+1)*dv]
			for j, s := range row {
				ot[j] += qv * s
			}
		}
	}
}

// chunkScratch holds the buffers of DeltaRuleChunked for one goroutine.
type chunkScratch[T real] struct {
	G, eG           []float64
	kk, tinv, qk    []T
	uw, rhs, qe, kd []T
}

func growT[T real](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// DeltaRuleChunked computes exactly what DeltaRuleRecurrent computes (up
// to rounding), ChunkSize tokens at a time with matrix products. Per chunk
// of n tokens with entry state S0, with G the inclusive cumulative sum of g
// inside the chunk:
//
//	A_ij = β_i exp(G_i−G_j) k_i·k_j  (j < i)      T = (I + A)⁻¹
//	[U | W] = T · [β⊙V | β exp(G)⊙K]              D = U − W S0
//	O = (exp(G)⊙Q) S0 + (QKᵀ ⊙ exp(G_i−G_j)[j≤i]) D
//	S = exp(G_n−1) S0 + (exp(G_n−1 − G)⊙K)ᵀ D
//
// Every exponent is ≤ 0. Rows of a chunk depend only on earlier rows, and
// the products' zero entries above the diagonal add exact zeros, so the
// outputs of a prefix of the sequence are bit-identical to those of the
// whole sequence.
func DeltaRuleChunked[T real](q, k, v, beta, g []T, n, dk, dv int, S, out []T) {
	var sc chunkScratch[T]
	sc.run(q, k, v, beta, g, n, dk, dv, S, out)
}

func (sc *chunkScratch[T]) run(q, k, v, beta, g []T, n, dk, dv int, S, out []T) {
	C := ChunkSize
	w := dv + dk
	sc.G = growT(sc.G, C)
	sc.eG = growT(sc.eG, C)
	sc.kk = growT(sc.kk, C*C)
	sc.tinv = growT(sc.tinv, C*C)
	sc.qk = growT(sc.qk, C*C)
	sc.uw = growT(sc.uw, C*w)
	sc.rhs = growT(sc.rhs, C*w)
	sc.qe = growT(sc.qe, C*dk)
	sc.kd = growT(sc.kd, C*dk)
	for c0 := 0; c0 < n; c0 += C {
		m := min(C, n-c0)
		qc, kc := q[c0*dk:(c0+m)*dk], k[c0*dk:(c0+m)*dk]
		vc, bc, gc := v[c0*dv:(c0+m)*dv], beta[c0:c0+m], g[c0:c0+m]
		G, eG := sc.G[:m], sc.eG[:m]
		var acc float64
		for i, x := range gc {
			acc += float64(x)
			G[i] = acc
			eG[i] = math.Exp(acc)
		}
		// A (strictly lower) from K Kᵀ, then T = (I + A)⁻¹ by forward
		// substitution, row by row: T_i = e_i − Σ_{j<i} A_ij T_j.
		kk := sc.kk[:m*m]
		gemm(false, true, m, m, dk, 1, kc, dk, kc, dk, 0, kk, m)
		for i := 0; i < m; i++ {
			for j := 0; j < i; j++ {
				kk[i*m+j] = bc[i] * T(math.Exp(G[i]-G[j])) * kk[i*m+j]
			}
		}
		tinv := sc.tinv[:m*m]
		clear(tinv)
		for i := 0; i < m; i++ {
			ti := tinv[i*m : (i+1)*m]
			ti[i] = 1
			for j := 0; j < i; j++ {
				a := kk[i*m+j]
				if a == 0 {
					continue
				}
				tj := tinv[j*m : j*m+j+1]
				for c, x := range tj {
					ti[c] -= a * x
				}
			}
		}
		// [β⊙V | β exp(G)⊙K], then [U | W] = T · that.
		uw := sc.uw[:m*w]
		rhs := sc.rhs[:m*w]
		for i := 0; i < m; i++ {
			b := bc[i]
			be := b * T(eG[i])
			r := rhs[i*w : (i+1)*w]
			for j, x := range vc[i*dv : (i+1)*dv] {
				r[j] = b * x
			}
			for j, x := range kc[i*dk : (i+1)*dk] {
				r[dv+j] = be * x
			}
		}
		gemm(false, false, m, w, m, 1, tinv, m, rhs, w, 0, uw, w)
		// D = U − W S0, in place of U.
		gemm(false, false, m, dv, dk, -1, uw[dv:], w, S, dv, 1, uw, w)
		// O = (exp(G)⊙Q) S0 + P D with P = QKᵀ ⊙ decay, lower triangle.
		qe := sc.qe[:m*dk]
		for i := 0; i < m; i++ {
			e := T(eG[i])
			for j, x := range qc[i*dk : (i+1)*dk] {
				qe[i*dk+j] = e * x
			}
		}
		oc := out[c0*dv : (c0+m)*dv]
		gemm(false, false, m, dv, dk, 1, qe, dk, S, dv, 0, oc, dv)
		qk := sc.qk[:m*m]
		gemm(false, true, m, m, dk, 1, qc, dk, kc, dk, 0, qk, m)
		for i := 0; i < m; i++ {
			for j := 0; j < m; j++ {
				if j <= i {
					qk[i*m+j] *= T(math.Exp(G[i] - G[j]))
				} else {
					qk[i*m+j] = 0
				}
			}
		}
		gemm(false, false, m, dv, m, 1, qk, m, uw, w, 1, oc, dv)
		// S = exp(G_last) S0 + Kdᵀ D.
		last := G[m-1]
		kd := sc.kd[:m*dk]
		for i := 0; i < m; i++ {
			e := T(math.Exp(last - G[i]))
			for j, x := range kc[i*dk : (i+1)*dk] {
				kd[i*dk+j] = e * x
			}
		}
		gemm(true, false, dk, dv, m, 1, kd, dk, uw, w, T(eG[m-1]), S, dv)
	}
}
