package ffn_test

import (
	"fmt"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
)

// Route four tokens through a block of two experts (top-1) and run it:
// token 0 is (3, 0), so expert 0 takes it with weight softmax(3, 0)₀ =
// 0.953 and returns silu(3)·3 = 8.573 in its first feature.
func ExampleMoE_Forward() {
	const h, inter = 2, 2
	identity := []float32{1, 0, 0, 1}
	double := []float32{2, 0, 0, 2}
	blk := &ffn.MoE{
		Config: model.MoEConfig{Hidden: h, Experts: 2, TopK: 1, ExpertInter: inter},
		// Expert 0 scores the first feature, expert 1 the second.
		Router: []float32{1, 0, 0, 1},
		Experts: ffn.ExpertList{
			{Gate: identity, Up: identity, Down: identity},
			{Gate: identity, Up: identity, Down: double},
		},
	}
	x := []float32{3, 0, 0, 3, 1, 0, 0, 1}
	r, err := ffn.Route(x, 4, blk.Router, blk.Config)
	if err != nil {
		panic(err)
	}
	tok0, _ := r.ExpertTokens(0)
	tok1, _ := r.ExpertTokens(1)
	fmt.Println("expert 0 gets tokens", tok0, "expert 1 gets", tok1)
	y, err := blk.Forward(x, 4)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%.3f\n", y)
	// Output:
	// expert 0 gets tokens [0 2] expert 1 gets [1 3]
	// [8.167 0.000 0.000 16.333 0.534 0.000 0.000 1.069]
}
