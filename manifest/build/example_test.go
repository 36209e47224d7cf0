package build_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
)

// Convert a model with a preset (round-to-nearest for every quantized
// tensor) and verify the checkpoint against its source.
func ExampleConvert() {
	dir, err := os.MkdirTemp("", "build-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "model")
	if err := testmodel.Write(src, testmodel.Micro(), testmodel.Default); err != nil {
		panic(err)
	}
	p, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		panic(err)
	}
	out := filepath.Join(dir, "native")
	res, err := build.Convert(context.Background(), build.BuildOptions{Source: src, Out: out, Plan: p})
	if err != nil {
		panic(err)
	}
	rep, err := build.Verify(context.Background(), out, build.VerifyOptions{Source: src})
	if err != nil {
		panic(err)
	}
	fmt.Println("files:", res.Files, "tensors:", res.Tensors)
	fmt.Println("verified against the source:", rep.OK, rep.SourceChecked)
	// Output:
	// files: 14 tensors: 161
	// verified against the source: true true
}
