package main

import (
	"context"
	"fmt"
	"math"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/calib/textcalib"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/safetensors"
)

func runCalibBuild(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "calib build", "--model DIR --data SPEC --out STORE [--sequences 128 --seq-len 2048] [flags]")
	modelDir := fs.String("model", "", "BF16 model directory (config.json, weights, tokenizer)")
	out := fs.String("out", "", "store directory to create")
	dtype := fs.String("dtype", "BF16", "stored dtype: BF16 or F32")
	workers := addWorkersFlag(fs, "goroutines")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	asJSON := fs.Bool("json", false, "print the resulting store statistics as JSON")
	d := addDataFlags(fs, 128, 0)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErrorf("unexpected argument %q", pos[0])
	}
	if *modelDir == "" || *out == "" {
		return usageErrorf("--model and --out are required")
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	dt, err := safetensors.ParseDType(*dtype)
	if err != nil || (dt != safetensors.BF16 && dt != safetensors.F32) {
		return usageErrorf("--dtype %q: want BF16 or F32", *dtype)
	}
	spec, dopt, err := d.resolve(*workers)
	if err != nil {
		return err
	}
	if err := inRange("sequences", int64(dopt.Calibration.Sequences), 1, math.MaxInt32); err != nil {
		return err
	}
	prev := kernels.SetWorkers(*workers)
	defer kernels.SetWorkers(prev)
	opt := textcalib.Options{Model: *modelDir, Out: *out, Data: spec, DataOptions: dopt, Store: calib.StoreOptions{DType: dt}}
	if !*quiet {
		opt.Progress = func(msg string) { fmt.Fprintln(e.stderr, "calib build:", msg) }
		opt.DataOptions.Progress = func(msg string) { fmt.Fprintln(e.stderr, "data:", msg) }
	}
	res, err := textcalib.Build(ctx, opt)
	if err != nil {
		return err
	}
	stats, err := calib.ComputeStoreStats(res.Store, nil, nil, 0)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, calibStatsDoc{SchemaVersion: schemaVersion, Store: *out, StoreStats: stats})
	}
	p := res.Store.Provenance()
	fmt.Fprintf(e.stdout, "wrote %s: %d sites of %d layers, %d sequences, %d tokens; token ids sha256 %s\n", *out, len(stats.Sites), res.Layers, p.Sequences, p.Tokens, p.TokenIDsSHA256)
	if res.MTPLayers > 0 {
		fmt.Fprintf(e.stdout, "the %d MTP layer(s) have no sites in the store (docs/calibration.md); gptq rounds their experts to nearest\n", res.MTPLayers)
	}
	return nil
}
