package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

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

// calibWorkerDoc is the --json document of one worker of a split calib
// build.
type calibWorkerDoc struct {
	SchemaVersion int    `json:"schema_version"`
	Store         string `json:"store"`
	Worker        int    `json:"worker"`
	Workers       int    `json:"workers"`
	Units         int    `json:"units"`
	WorkerUnits   int    `json:"worker_units"`
	Sequences     int    `json:"sequences"`
	Tokens        int64  `json:"tokens"`
	ResumedAt     int    `json:"resumed_at_layer"`
}

func runCalibBuild(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "calib build", "--model DIR --data SPEC --out STORE [--sequences 128 --seq-len 2048] [--shard i/N|auto] [flags]")
	modelDir := fs.String("model", "", "BF16 model directory (config.json, weights, tokenizer)")
	out := fs.String("out", "", "store directory to create, or to resume when it holds an unfinished build")
	dtype := fs.String("dtype", "BF16", "stored dtype: BF16 or F32")
	allowShort := addAllowShortFlag(fs)
	workers := addWorkersFlag(fs, "goroutines")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	asJSON := fs.Bool("json", false, "print the resulting store statistics as JSON")
	d := addDataFlags(fs, calibrationSet, 128)
	sf := addShardFlags(fs, "ttquant assemble STORE")
	dryRun := fs.Bool("dry-run", false, "print the work and the memory of the build (of each worker with --shard) without reading weights or writing anything")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *modelDir == "" || (*out == "" && !*dryRun) {
		return usageErrorf("--model and --out are required")
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	sp, err := sf.spec()
	if err != nil {
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
	tool := toolVersion()
	opt := textcalib.Options{Model: *modelDir, Out: *out, Data: spec, DataOptions: dopt, AllowShort: *allowShort, Shard: sp,
		Store: calib.StoreOptions{DType: dt, Faults: testFaults, Tool: strings.TrimSpace(strings.Join([]string{tool.Name, tool.Version, tool.Revision}, " "))}}
	if !*quiet {
		pr := newProgress(e.stderr)
		defer pr.close()
		opt.Progress = func(msg string) { pr.println("calib build: " + msg) }
		opt.DataOptions.Progress = func(msg string) { pr.println("data: " + msg) }
		opt.Advance = pr.storeEvent
		pr.begin()
	}
	if *dryRun {
		return printStoreDryRun(e, opt, *asJSON)
	}
	res, err := textcalib.Build(ctx, opt)
	if err != nil {
		return err
	}
	if res.Split != nil {
		sw := res.Split
		if *asJSON {
			return writeJSON(e.stdout, calibWorkerDoc{SchemaVersion: schemaVersion, Store: *out, Worker: sp.Index, Workers: sp.Count,
				Units: sw.Units, WorkerUnits: sw.WorkerUnits, Sequences: sw.Sequences, Tokens: sw.Tokens, ResumedAt: res.ResumedAt})
		}
		fmt.Fprintf(e.stdout, "worker      %s: %d of %d units, %d sequences, %d tokens\n", sp, sw.WorkerUnits, sw.Units, sw.Sequences, sw.Tokens)
		fmt.Fprintf(e.stdout, "output      %s (unfinished until ttquant assemble %s)\n", *out, *out)
		return nil
	}
	if res.AlreadyAssembled && !*asJSON {
		fmt.Fprintf(e.stdout, "store       %s already assembled; nothing to do\n", *out)
		return nil
	}
	return printStore(e, *out, res, *asJSON)
}

// printStore reports a finished store: built by calib build, or assembled
// from the workers of a split build.
func printStore(e *env, out string, res *textcalib.Result, asJSON bool) error {
	stats, err := calib.ComputeStoreStats(res.Store, nil, nil, 0)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, calibBuildDoc{SchemaVersion: schemaVersion, Store: out, Layers: res.Layers,
			MTPLayers: res.MTPLayers, MTPSkipped: res.MTPSkipped, ResumedAt: res.ResumedAt, AskedTokens: res.AskedTokens, StoreStats: stats})
	}
	p := res.Store.Provenance()
	fmt.Fprintf(e.stdout, "wrote %s: %d sites of %d layers (%d trunk, %d MTP), %d sequences, %d tokens; token ids sha256 %s\n",
		out, len(stats.Sites), res.Layers+res.MTPLayers, res.Layers, res.MTPLayers, p.Sequences, p.Tokens, p.TokenIDsSHA256)
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

// storeText is calib build's one progress line: the share of the rows
// through layers done, the layer and its share, elapsed time, one ETA.
func storeText(a textcalib.Advance) string {
	what := "layer"
	if a.MTP {
		what = "MTP layer"
	}
	written := a.Layer // layers written
	if a.Kind == "layer" {
		written++
	}
	return fmt.Sprintf("%3d%%  %s %d %d%%  %d/%d layers  %s elapsed  ETA %s", pct(a.Rows, a.RowsTotal), what, a.Layer, pct(a.LayerRows, a.LayerRowsTotal),
		written, a.Layers, a.Elapsed.Round(time.Second), etaText(a.ETA()))
}

func (p *progress) storeEvent(a textcalib.Advance) {
	line := storeText(a)
	switch {
	case a.Kind == "layer" && a.Layer == a.Layers-1:
		p.end(line)
	case a.Kind == "layer":
		p.draw(line, fmt.Sprintf("layer %d done  ", a.Layer), true, false)
	default:
		p.draw(line, "", false, true)
	}
}

// calibDryRunDoc is the --json document of calib build --dry-run.
type calibDryRunDoc struct {
	SchemaVersion int             `json:"schema_version"`
	DryRun        bool            `json:"dry_run"`
	Work          *textcalib.Work `json:"work"`
}

// printStoreDryRun prints what a store build (each worker of a split one)
// would do and hold.
func printStoreDryRun(e *env, opt textcalib.Options, asJSON bool) error {
	w, err := textcalib.DryRun(opt)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, calibDryRunDoc{SchemaVersion: schemaVersion, DryRun: true, Work: w})
	}
	fmt.Fprintf(e.stdout, "work (dry run: no weight read, nothing written)\n")
	fmt.Fprintf(e.stdout, "  calibration      %d sequences, %d tokens (%d asked for)\n", w.Sequences, w.Tokens, w.AskedTokens)
	fmt.Fprintf(e.stdout, "  layers           %d trunk, %d MTP; %d sites\n", w.Layers, w.MTPLayers, w.Sites)
	fmt.Fprintf(e.stdout, "  store            %s of %s activations\n", humanBytes(w.StoreBytes), w.DType)
	fmt.Fprintf(e.stdout, "  memory           about %s for one process (estimated from the forward's measured figures at %d tokens)\n", gib(w.MemoryBytes), w.Tokens)
	if sw := w.Shards; sw != nil {
		me := sw.Shares[sw.Worker]
		fmt.Fprintf(e.stdout, "  split            %d units over %d workers; largest worker %d tokens, mean %.0f; worker %d has %d units, %d sequences, %d tokens\n",
			sw.Units, sw.Workers, sw.MaxTokens, float64(w.Tokens)/float64(sw.Workers), sw.Worker, me.WorkerUnits, me.Sequences, me.Tokens)
		fmt.Fprintf(e.stdout, "  memory per node  worker %d about %s; every node at most %s (estimated)\n", sw.Worker, gib(me.MemoryBytes), gib(sw.MaxMemoryBytes))
	}
	return nil
}
