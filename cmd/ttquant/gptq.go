package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
)

func init() {
	register(&command{name: "gptq", summary: "build a native checkpoint with GPTQ for the selected matrices", run: runGPTQ})
}

// dryRunReport is the --json document of gptq --dry-run.
type dryRunReport struct {
	SchemaVersion int                  `json:"schema_version"`
	DryRun        bool                 `json:"dry_run"`
	Plan          *plan.Plan           `json:"plan"`
	Work          *build.WorkSummary   `json:"work"`
	Estimate      *kernels.MoEEstimate `json:"estimate,omitempty"`
}

func estSeconds(s float64) string {
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return "unknown"
	}
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}

func runGPTQ(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "gptq", "--model SRC (--data SPEC | --calib STORE) --layers experts|dense|all|PATTERN --out DST [flags]")
	bf := addBuildFlags(fs)
	calibPath := fs.String("calib", "", "calibration store: every layer's inputs from the source model (instead of --data)")
	d := addDataFlags(fs, calibrationSet, 128)
	allowShort := addAllowShortFlag(fs)
	asymmetric := fs.Bool("asymmetric", false, "fit every GPTQ matrix to the source model's outputs on the source model's inputs (with --data the source model runs alongside; with --calib only down projections change; matrices with fewer than 16 calibration rows per input column stay as they are; docs/calibration.md)")
	allowSynth := fs.Bool("allow-synthetic-calibration", false, "accept a calibration store of synthetic activations (calib synth); GPTQ on them can be worse than rounding")
	layers := fs.String("layers", "experts", "matrices to quantize with GPTQ: experts (the MLP blocks: routed and shared experts, or a dense layer's MLP), dense (every other matrix), all, plan (the matrices the plan gives method gptq; the others rounded), or a regular expression over stored tensor names")
	gf := addGPTQFlags(fs)
	heldOut := fs.Int("held-out", 0, "final calibration sequences kept out of the Hessians to measure each layer's held-out error against RTN (and, with --data, the stream's drift from the source model)")
	estimate := fs.Duration("estimate", 5*time.Second, "with --dry-run: time spent measuring the kernels to estimate the GPTQ kernel time (0: no estimate)")
	dryRun := fs.Bool("dry-run", false, "print the plan and the work without reading tensor data or writing anything")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	opt, err := bf.options(e, !*dryRun)
	if err != nil {
		return err
	}
	switch {
	case *calibPath != "" && d.data != "":
		return usageErrorf("give --data (sequential GPTQ from text) or --calib (a calibration store), not both")
	case *calibPath == "" && d.data == "" && !*dryRun:
		return usageErrorf("--data or --calib is required")
	case *allowShort && d.data == "":
		return usageErrorf("--allow-short applies to --data (calibration text) only")
	}
	if d.data != "" {
		spec, dopt, err := d.resolve(bf.workers)
		if err != nil {
			return err
		}
		if err := inRange("sequences", int64(dopt.Calibration.Sequences), 1, math.MaxInt32); err != nil {
			return err
		}
		if !bf.quiet {
			dopt.Progress = func(msg string) { fmt.Fprintln(e.stderr, "data:", msg) }
		}
		opt.Data, opt.DataOptions, opt.AllowShortData = spec, dopt, *allowShort
	}
	opt.Asymmetric = *asymmetric
	g, err := gf.options()
	if err != nil {
		return err
	}
	if err := inRange("held-out", int64(*heldOut), 0, math.MaxInt32); err != nil {
		return err
	}
	if *estimate < 0 {
		return usageErrorf("--estimate %v is out of range: want 0 or more", *estimate)
	}
	opt.GPTQOptions = &g
	opt.Calib = *calibPath
	opt.AllowSyntheticCalibration = *allowSynth
	opt.Layers = *layers
	opt.DryRun = *dryRun
	opt.HeldOutSequences = *heldOut
	if err := opt.Validate(); err != nil {
		return usageErrorf("%v", err)
	}
	res, err := build.GPTQ(ctx, opt)
	if err != nil {
		return buildError(opt, syntheticCalibrationError(err))
	}
	if *dryRun {
		return printGPTQDryRun(ctx, e, opt, res, g.BlockSize, *estimate, bf.asJSON)
	}
	return printBuild(e, res, bf.asJSON)
}

func printWork(e *env, p *plan.Plan, w *build.WorkSummary) {
	fmt.Fprintf(e.stdout, "plan %s (%d rules)\n", p.Name, len(p.Rules))
	for i, r := range p.Rules {
		fmt.Fprintf(e.stdout, "  %2d  %-50s %-8s %-5s %s %s\n", i, r.Pattern, r.Format, r.Method, r.Axis, r.Tile)
	}
	fmt.Fprintf(e.stdout, "work (dry run: no tensor data read, nothing written)\n")
	fmt.Fprintf(e.stdout, "  source tensors   %d (%s)\n", w.SourceTensors, humanBytes(w.SourceBytes))
	fmt.Fprintf(e.stdout, "  stored tensors   %d (%s)\n", w.Tensors, humanBytes(w.OutputBytes))
	fmt.Fprintf(e.stdout, "  files            %d (%d expert groups, %d dense shards)\n", w.Files, w.ExpertFiles, w.DenseFiles)
	fmt.Fprintf(e.stdout, "  layers           %d\n", len(w.Layers))
	for _, k := range sortedKeys(w.Methods) {
		fmt.Fprintf(e.stdout, "  method %-9s %d tensors\n", k, w.Methods[k])
	}
	for _, k := range sortedKeys(w.Formats) {
		fmt.Fprintf(e.stdout, "  format %-9s %d tensors\n", k, w.Formats[k])
	}
	fmt.Fprintf(e.stdout, "  GPTQ matrices    %d (about %.3g GFLOP of solver work)\n", w.GPTQMatrices, w.GPTQFlops/1e9)
	if m := w.MoE; m != nil {
		fmt.Fprintf(e.stdout, "  GPTQ experts     %d layers × %d experts, hidden %d, expert width %d\n", m.Layers, m.ExpertsPerLayer, m.Hidden, m.ExpertWidth)
	}
	if sq := w.Sequential; sq != nil {
		fmt.Fprintf(e.stdout, "  calibration      %d × %d tokens (%d held out): %d tokens, %d routed rows per layer\n", sq.Sequences, sq.SeqLen, sq.HeldOut, sq.Tokens, sq.RoutedRowsPerLayer)
		fmt.Fprintf(e.stdout, "  forward passes   %d layers, %d token-layers (the quantized stream and the source model's)\n", sq.Layers, sq.ForwardTokenLayers)
		fmt.Fprintf(e.stdout, "  fits             %d matrices fitted to the source model's outputs\n", sq.Fits)
		fmt.Fprintf(e.stdout, "  scratch disk     %s in the output directory's bookkeeping (two layers' residual streams), besides the %s written\n", humanBytes(sq.ScratchBytes), humanBytes(w.OutputBytes))
		switch {
		case sq.FreeBytes < 0:
			fmt.Fprintf(e.stdout, "  disk             %s needed; the free space cannot be told (no --out, or not on this system)\n", humanBytes(sq.DiskBytes))
		case sq.FreeBytes < sq.DiskBytes:
			fmt.Fprintf(e.stdout, "  disk             %s needed, %s free on the file system of %s: NOT ENOUGH, the real run refuses\n", humanBytes(sq.DiskBytes), humanBytes(sq.FreeBytes), sq.FreeDir)
		default:
			fmt.Fprintf(e.stdout, "  disk             %s needed, %s free on the file system of %s\n", humanBytes(sq.DiskBytes), humanBytes(sq.FreeBytes), sq.FreeDir)
		}
	}
	printShards(e, w.Shards)
}

func sortedKeys(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// printGPTQDryRun prints a dry run's plan and work, with the GPTQ kernel
// time estimated from kernels measured for estimate on this machine.
func printGPTQDryRun(ctx context.Context, e *env, opt build.BuildOptions, res *build.BuildResult, blockSize int, estimate time.Duration, asJSON bool) error {
	var est *kernels.MoEEstimate
	if estimate > 0 && res.Work.MoE != nil {
		rep, err := kernels.RunBench(ctx, kernels.BenchOptions{Duration: estimate})
		if err != nil {
			return err
		}
		m := res.Work.MoE
		w := kernels.DefaultMoEWorkload()
		w.Layers, w.ExpertsPerLayer, w.Hidden, w.ExpertWidth, w.BlockSize = m.Layers, m.ExpertsPerLayer, m.Hidden, m.ExpertWidth, blockSize
		if sq := res.Work.Sequential; sq != nil {
			w.RoutedRowsPerLayer = sq.RoutedRowsPerLayer
		}
		me := rep.EstimateMoE(w)
		est = &me
	}
	if asJSON {
		return writeJSON(e.stdout, dryRunReport{SchemaVersion: schemaVersion, DryRun: true, Plan: opt.Plan, Work: res.Work, Estimate: est})
	}
	printWork(e, opt.Plan, res.Work)
	if est != nil {
		rows, from := kernels.DefaultMoEWorkload().RoutedRowsPerLayer, "assumed"
		if sq := res.Work.Sequential; sq != nil {
			rows, from = sq.RoutedRowsPerLayer, "from --sequences and --seq-len"
		}
		fmt.Fprintf(e.stdout, "  estimated kernel time  %s (Hessians %s, factors %s, updates %s; %d routed rows per layer %s,\n", estSeconds(est.TotalSeconds), estSeconds(est.HessianSeconds), estSeconds(est.FactorSeconds), estSeconds(est.UpdateSeconds), rows, from)
		fmt.Fprintf(e.stdout, "                         kernels measured for %s on this machine; I/O, routing and forward passes not included)\n", estimate)
	}
	return nil
}
