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

// calibBuildDoc is the --json document of calib build.
type calibBuildDoc struct {
	SchemaVersion int    `json:"schema_version"`
	Store         string `json:"store"`
	Layers        int    `json:"layers"`
	MTPLayers     int    `json:"mtp_layers"`
	MTPSkipped    int    `json:"mtp_layers_without_sites"`
	ResumedAt     int    `json:"resumed_at_layer"`
	AskedTokens   int64  `json:"asked_tokens"`
	*calib.StoreStats
}

func runCalibBuild(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "calib build", "--model DIR --data SPEC --out STORE [--sequences 128 --seq-len 2048] [flags]")
	modelDir := fs.String("model", "", "BF16 model directory (config.json, weights, tokenizer)")
	out := fs.String("out", "", "store directory to create, or to resume when it holds an unfinished build")
	dtype := fs.String("dtype", "BF16", "stored dtype: BF16 or F32")
	allowShort := addAllowShortFlag(fs)
	workers := addWorkersFlag(fs, "goroutines")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	asJSON := fs.Bool("json", false, "print the resulting store statistics as JSON")
	d := addDataFlags(fs, calibrationSet, 128)
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
	opt := textcalib.Options{Model: *modelDir, Out: *out, Data: spec, DataOptions: dopt, AllowShort: *allowShort,
		Store: calib.StoreOptions{DType: dt}}
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
		return writeJSON(e.stdout, calibBuildDoc{SchemaVersion: schemaVersion, Store: *out, Layers: res.Layers,
			MTPLayers: res.MTPLayers, MTPSkipped: res.MTPSkipped, ResumedAt: res.ResumedAt, AskedTokens: res.AskedTokens, StoreStats: stats})
	}
	p := res.Store.Provenance()
	fmt.Fprintf(e.stdout, "wrote %s: %d sites of %d layers (%d trunk, %d MTP), %d sequences, %d tokens; token ids sha256 %s\n",
		*out, len(stats.Sites), res.Layers+res.MTPLayers, res.Layers, res.MTPLayers, p.Sequences, p.Tokens, p.TokenIDsSHA256)
	if res.ResumedAt > 0 {
		fmt.Fprintf(e.stdout, "resumed at layer %d: layers 0..%d were finished by an earlier run\n", res.ResumedAt, res.ResumedAt-1)
	}
	if p.Tokens < res.AskedTokens {
		fmt.Fprintf(e.stdout, "--allow-short: %d of the %d tokens asked for\n", p.Tokens, res.AskedTokens)
	}
	if res.MTPSkipped > 0 {
		fmt.Fprintf(e.stdout, "%d MTP layer(s) beyond the first have no sites (the forward pass runs the first only); gptq rounds their experts to nearest\n", res.MTPSkipped)
	}
	return nil
}
