package manifest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
)

// Verify a checkpoint and open it to read a tensor. A program doing only
// this imports package manifest alone; the build here just makes a
// checkpoint to look at.
func ExampleOpenCheckpoint() {
	dir, err := os.MkdirTemp("", "manifest-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	src, out := filepath.Join(dir, "model"), filepath.Join(dir, "native")
	if err := testmodel.Write(src, testmodel.Micro(), testmodel.Default); err != nil {
		panic(err)
	}
	p, _ := plan.Preset(plan.PresetQwen36MoE)
	if _, err := build.Convert(context.Background(), build.BuildOptions{Source: src, Out: out, Plan: p}); err != nil {
		panic(err)
	}

	rep, err := manifest.Verify(context.Background(), out, manifest.VerifyOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println("verified:", rep.OK, "files:", rep.Files, "tensors:", rep.Tensors)

	c, err := manifest.OpenCheckpoint(out)
	if err != nil {
		panic(err)
	}
	name := "lm_head.weight"
	te, err := c.TensorInfo(name)
	if err != nil {
		panic(err)
	}
	vals, err := c.Float32s(name)
	if err != nil {
		panic(err)
	}
	fmt.Println(name, te.Format, te.Shape, len(vals), "values")
	// Output:
	// verified: true files: 14 tensors: 161
	// lm_head.weight BFP8_b [128 64] 8192 values
}
