package calib_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/safetensors"
)

// Quantize one MoE block's experts with GPTQ onto BFP4_b from calibration
// activations, and compare the block's output on held-out tokens with
// round to nearest.
func ExampleQuantizeMoELayer() {
	dir, err := os.MkdirTemp("", "calib-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "model")
	if err := testmodel.Write(src, testmodel.Micro(), testmodel.Default); err != nil {
		panic(err)
	}
	cfg, err := model.ReadConfig(src)
	if err != nil {
		panic(err)
	}
	m, err := safetensors.OpenModel(src)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	layer, err := calib.LoadMoELayer(m, cfg, 0)
	if err != nil {
		panic(err)
	}
	// Activations: rows of a synthetic stream (a real run reads them from
	// a calibration store).
	gen, err := calib.NewSynth(calib.SynthConfig{Hidden: cfg.Hidden, Seed: 1})
	if err != nil {
		panic(err)
	}
	x := make([]float32, 640*cfg.Hidden)
	gen.Rows(x, 0, 640)
	cal := calib.Activations{X: x[:512*cfg.Hidden], Tokens: 512}
	held := calib.Activations{X: x[512*cfg.Hidden:], Tokens: 128}
	rep, err := calib.QuantizeMoELayer(context.Background(), layer, cal, held, calib.LayerOptions{}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("format:", rep.Format, "method:", rep.Method, "experts:", len(rep.Experts))
	fmt.Println("held-out block error below round to nearest:", rep.HeldOut.MSE < rep.HeldOut.RTNMSE)
	// Output:
	// format: BFP4_b method: gptq experts: 8
	// held-out block error below round to nearest: true
}
