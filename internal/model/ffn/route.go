package ffn

import (
	"fmt"
	"math"
	"runtime"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
)

// Routing is the router's decision for a batch of tokens: for every token
// its top-k experts (best first) with their mixing weights, and for every
// expert the tokens it received, in ascending token order.
type Routing struct {
	Tokens, Experts, TopK int
	// Choice[t*TopK+j] is token t's j-th expert (j = 0 is the most
	// probable) and Weight[t*TopK+j] its mixing weight.
	Choice []int32
	Weight []float32

	start []int32 // expert e's tokens are tok[start[e]:start[e+1]]
	tok   []int32
	tokW  []float32
}

// Route computes the Qwen3 MoE routing of tokens×hidden activations x with
// the router matrix router ([experts, hidden], row-major):
//
//	logits = x·routerᵀ    (each dot product accumulated in float64, in
//	                       feature order, then rounded to float32)
//	p      = softmax(logits) in float32: exp(l−max) summed in expert order
//	top-k  by probability, ties going to the lower expert index
//	weight = p, or p / Σ_topk p (summed best first, float32) when
//	         cfg.NormTopK is set
//
// The router matrix is used as given (never quantized).
func Route(x []float32, tokens int, router []float32, cfg model.MoEConfig) (*Routing, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h, ne, k := cfg.Hidden, cfg.Experts, cfg.TopK
	if tokens < 0 || len(x) != tokens*h {
		return nil, fmt.Errorf("ffn: route: activations hold %d values, want %d tokens × %d", len(x), tokens, h)
	}
	if len(router) != ne*h {
		return nil, fmt.Errorf("ffn: route: router holds %d values, want [%d, %d]", len(router), ne, h)
	}
	r := &Routing{Tokens: tokens, Experts: ne, TopK: k,
		Choice: make([]int32, tokens*k), Weight: make([]float32, tokens*k)}
	// Tokens are independent: route blocks of them concurrently. Every
	// token's arithmetic is the same whichever goroutine does it.
	const block = 256
	nblocks := (tokens + block - 1) / block
	workers := min(runtime.GOMAXPROCS(0), nblocks)
	r64 := make([]float64, len(router))
	for i, v := range router {
		r64[i] = float64(v)
	}
	type scratch struct {
		logits, probs []float32
		x64           []float64
	}
	ws := make([]scratch, workers)
	for i := range ws {
		ws[i] = scratch{make([]float32, ne), make([]float32, ne), make([]float64, h)}
	}
	kernels.ParallelFor(nblocks, workers, func(b, w int) {
		s := &ws[w]
		for t := b * block; t < min(tokens, (b+1)*block); t++ {
			for i, v := range x[t*h : (t+1)*h] {
				s.x64[i] = float64(v)
			}
			routeToken(r, t, s.x64, r64, cfg, s.logits, s.probs)
		}
	})
	r.index()
	return r, nil
}

// routeToken routes token t with activations xt (router and xt widened to
// float64, which is exact).
func routeToken(r *Routing, t int, xt, router []float64, cfg model.MoEConfig, logits, probs []float32) {
	h, ne, k := cfg.Hidden, cfg.Experts, cfg.TopK
	e := 0
	for ; e+4 <= ne; e += 4 {
		logits[e], logits[e+1], logits[e+2], logits[e+3] = dot64x4(xt,
			router[e*h:(e+1)*h], router[(e+1)*h:(e+2)*h], router[(e+2)*h:(e+3)*h], router[(e+3)*h:(e+4)*h])
	}
	for ; e < ne; e++ {
		var s float64
		for i, v := range xt {
			s += v * router[e*h+i]
		}
		logits[e] = float32(s)
	}
	softmax32(probs, logits)
	ch := r.Choice[t*k : (t+1)*k]
	wt := r.Weight[t*k : (t+1)*k]
	topK(ch, probs)
	var sum float32
	for j, e := range ch {
		wt[j] = probs[e]
		sum += probs[e]
	}
	if cfg.NormTopK {
		for j := range wt {
			wt[j] /= sum
		}
	}
}

// dot64x4 is Dot64 of x with four vectors at once: four independent
// sequential sums (each exactly as dot64 computes it), interleaved so
// that their additions overlap.
//
// Each product of two float32 values is exact in float64, so the result is
// the same whether or not the compiler fuses multiply and add.
func dot64x4(x, a, b, c, d []float64) (float32, float32, float32, float32) {
	a, b, c, d = a[:len(x)], b[:len(x)], c[:len(x)], d[:len(x)]
	var sa, sb, sc, sd float64
	for i, xv := range x {
		sa += xv * a[i]
		sb += xv * b[i]
		sc += xv * c[i]
		sd += xv * d[i]
	}
	return float32(sa), float32(sb), float32(sc), float32(sd)
}

// softmax32 writes the float32 softmax of l into p: subtract the maximum,
// exponentiate (rounded to float32), sum in index order, divide.
func softmax32(p, l []float32) {
	m := float32(math.Inf(-1))
	for _, v := range l {
		if v > m {
			m = v
		}
	}
	var sum float32
	for i, v := range l {
		p[i] = float32(math.Exp(float64(v - m)))
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
}

// topK fills ch (len k) with the indices of the k largest probabilities,
// best first; among equal values the lower index wins. NaN never wins over
// a number.
func topK(ch []int32, p []float32) {
	k := len(ch)
	n := 0
	for e, v := range p {
		// Insert e into the sorted prefix ch[:n] when it beats the worst.
		if n == k && !better(v, int32(e), p[ch[k-1]], ch[k-1]) {
			continue
		}
		pos := n
		if n == k {
			pos = k - 1
		} else {
			n++
		}
		for pos > 0 && better(v, int32(e), p[ch[pos-1]], ch[pos-1]) {
			ch[pos] = ch[pos-1]
			pos--
		}
		ch[pos] = int32(e)
	}
}

// better reports whether (v, i) ranks before (w, j).
func better(v float32, i int32, w float32, j int32) bool {
	if v != v {
		return false
	}
	if w != w {
		return true
	}
	return v > w || (v == w && i < j)
}

// index builds the per-expert token lists.
func (r *Routing) index() {
	r.start = make([]int32, r.Experts+1)
	for _, e := range r.Choice {
		r.start[e+1]++
	}
	for e := 0; e < r.Experts; e++ {
		r.start[e+1] += r.start[e]
	}
	fill := make([]int32, r.Experts)
	copy(fill, r.start[:r.Experts])
	r.tok = make([]int32, len(r.Choice))
	r.tokW = make([]float32, len(r.Choice))
	for i, e := range r.Choice { // token-major, so each list ascends
		p := fill[e]
		fill[e]++
		r.tok[p] = int32(i / r.TopK)
		r.tokW[p] = r.Weight[i]
	}
}

// ExpertTokens returns the tokens routed to expert e in ascending order and
// their mixing weights. The slices alias the Routing; do not modify them.
func (r *Routing) ExpertTokens(e int) (tokens []int32, weights []float32) {
	a, b := r.start[e], r.start[e+1]
	return r.tok[a:b:b], r.tokW[a:b:b]
}

// Counts returns the number of tokens routed to each expert.
func (r *Routing) Counts() []int {
	c := make([]int, r.Experts)
	for e := range c {
		c[e] = int(r.start[e+1] - r.start[e])
	}
	return c
}
