package gptq_test

import (
	"fmt"
	"math"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/gptq"
)

// Quantize one 4×32 weight matrix to BFP4_b with GPTQ: accumulate the
// Hessian of its inputs (64 tokens whose features are correlated), then
// solve. GPTQ moves some weights to another grid point than
// round-to-nearest would, and its proxy loss (the mean squared output error
// per token) is lower.
func ExampleQuantize() {
	const rows, cols, tokens = 4, 32, 64
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(math.Sin(float64(i)*1.7) * 0.8)
	}
	x := make([]float32, tokens*cols)
	for t := 0; t < tokens; t++ {
		for j := 0; j < cols; j++ {
			v := math.Cos(float64(t*cols+j) * 0.37)
			if j > 0 {
				v += 0.8 * float64(x[t*cols+j-1])
			}
			x[t*cols+j] = float32(v)
		}
	}
	h := gptq.NewHessian(cols)
	if err := h.Add(x, tokens); err != nil {
		panic(err)
	}
	grid := gptq.NewBFPGrid(bfp.BFP4, bfp.AxisInput)
	res, err := gptq.Quantize(w, rows, cols, h.Matrix(), grid, gptq.DefaultOptions())
	if err != nil {
		panic(err)
	}
	rtn, err := gptq.RTN(w, rows, cols, grid)
	if err != nil {
		panic(err)
	}
	moved := 0
	for i := range rtn {
		if res.Q[i] != rtn[i] {
			moved++
		}
	}
	fmt.Printf("%d of %d weights differ from round-to-nearest\n", moved, len(w))
	fmt.Printf("proxy loss: GPTQ %.4f, RTN %.4f\n", res.ProxyLoss, res.RTNProxyLoss)
	// Output:
	// 7 of 128 weights differ from round-to-nearest
	// proxy loss: GPTQ 0.0188, RTN 0.2653
}
