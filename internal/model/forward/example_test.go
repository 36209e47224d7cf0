package forward_test

import (
	"fmt"
	"os"

	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/testmodel"
)

// Run a model over one sequence and read the next-token prediction at its
// last position.
func ExampleModel_Trunk() {
	dir, err := os.MkdirTemp("", "forward-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	if err := testmodel.Write(dir, testmodel.Micro(), testmodel.Default); err != nil {
		panic(err)
	}
	m, err := forward.Open(dir)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	ids := []int32{3, 14, 15, 92, 65, 35}
	x, err := m.Embed(ids)
	if err != nil {
		panic(err)
	}
	b := &forward.Batch{Lens: []int{len(ids)}, X: x}
	if err := m.Trunk(b, nil, nil); err != nil {
		panic(err)
	}
	hf, err := m.FinalNorm(b.X)
	if err != nil {
		panic(err)
	}
	vocab := m.Config.Vocab
	var last []float32
	err = m.Logits(hf, func(row0, rows int, logits []float32) error {
		if row0+rows == len(ids) {
			last = append([]float32(nil), logits[(rows-1)*vocab:rows*vocab]...)
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	top := forward.TopK(last, 1)
	fmt.Println("layers:", m.Config.NumLayers(), "vocabulary:", vocab, "logits:", len(last))
	fmt.Printf("most probable next token: %d (p = %.3f)\n", top[0].ID, top[0].Prob)
	// Output:
	// layers: 5 vocabulary: 128 logits: 128
	// most probable next token: 48 (p = 0.020)
}
