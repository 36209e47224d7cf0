package plan_test

import (
	"fmt"
	"os"

	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

// Resolve a preset against a model from its headers alone: every stored
// tensor with its format and method, the totals per format and the files
// the checkpoint will have.
func ExamplePlan_Resolve() {
	dir, err := os.MkdirTemp("", "plan-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	if err := testmodel.Write(dir, testmodel.Micro(), testmodel.Default); err != nil {
		panic(err)
	}
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	p, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		panic(err)
	}
	r, err := p.Resolve(m)
	if err != nil {
		panic(err)
	}
	fmt.Println("source tensors", r.SourceTensors, "→ stored tensors", len(r.Tensors))
	for _, t := range r.Totals {
		fmt.Println(t.Format, t.Tensors)
	}
	fmt.Println("files:", r.ExpertFiles, "expert +", r.DenseFiles, "dense")
	// Output:
	// source tensors 91 → stored tensors 161
	// BFP4_b 95
	// BFP8_b 25
	// AS_IS 41
	// files: 10 expert + 1 dense
}
