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
//	                       feature order, then rounded to float32:
//	                       kernels.Dot64T)
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
	logits := make([]float32, tokens*ne)
	kernels.Dot64T(tokens, ne, h, x, h, router, h, logits, ne)
	// Tokens are independent: route blocks of them concurrently. Every
	// token's arithmetic is the same whichever goroutine does it.
	const block = 256
	nblocks := (tokens + block - 1) / block
	workers := min(runtime.GOMAXPROCS(0), nblocks)
	probs := make([]float32, workers*ne)
	kernels.ParallelFor(nblocks, workers, func(b, w int) {
		for t := b * block; t < min(tokens, (b+1)*block); t++ {
			routeToken(r, t, logits[t*ne:(t+1)*ne], cfg, probs[w*ne:(w+1)*ne])
		}
	})
	r.index()
	return r, nil
}

// routeToken routes token t from its router logits.
func routeToken(r *Routing, t int, logits []float32, cfg model.MoEConfig, probs []float32) {
	k := cfg.TopK
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
