package textcalib_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/calib/textcalib"
	"github.com/ttquant/ttquant/internal/model/builtin"
	"github.com/ttquant/ttquant/internal/text/dataset"
)

// Build a calibration store from the built-in model's calibration text:
// eight packed sequences of 128 tokens run layer by layer through the BF16
// model, every layer's calibration sites written to the store.
func ExampleBuild() {
	dir, err := os.MkdirTemp("", "textcalib-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	m, err := builtin.Write(filepath.Join(dir, "model"))
	if err != nil {
		panic(err)
	}
	spec, err := dataset.ParseSpec("calib=" + filepath.Join(m, builtin.CalibText))
	if err != nil {
		panic(err)
	}
	res, err := textcalib.Build(context.Background(), textcalib.Options{
		Model: m, Out: filepath.Join(dir, "store"), Data: spec,
		DataOptions: dataset.Options{Seed: 1, EvalFraction: dataset.DefaultEvalFraction,
			Calibration: dataset.SetOptions{Sequences: 8, SeqLen: 128}},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("trunk layers:", res.Layers, "MTP layers:", res.MTPLayers, "tokens asked:", res.AskedTokens)
	// Output:
	// trunk layers: 4 MTP layers: 1 tokens asked: 1024
}
