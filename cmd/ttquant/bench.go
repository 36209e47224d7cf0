package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/ttquant/ttquant/internal/kernels"
)

func init() {
	register(&command{
		name:    "bench",
		summary: "measure the compute kernels on this machine (sizing)",
		run:     runBench,
	})
}

// benchDoc is the --json document of ttquant bench.
type benchDoc struct {
	SchemaVersion int                   `json:"schema_version"`
	Impl          string                `json:"impl"`
	Workers       int                   `json:"workers"`
	DurationSec   float64               `json:"duration_seconds"`
	Peak          kernels.Peak          `json:"peak"`
	Results       []kernels.BenchResult `json:"results"`
	Workload      kernels.MoEWorkload   `json:"moe_workload"`
	Estimate      kernels.MoEEstimate   `json:"moe_estimate"`
}

func runBench(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "bench", "[--duration 60s] [--workers N] [--json] [estimate flags]")
	duration := fs.Duration("duration", time.Minute, "total time to spend measuring")
	workers := fs.Int("workers", 0, "goroutines to use (0: GOMAXPROCS)")
	asJSON := fs.Bool("json", false, "print a JSON document instead of a table")
	small := fs.Bool("small", false, "use shapes 8 times smaller (a quick check, not for sizing)")
	w := kernels.DefaultMoEWorkload()
	fs.IntVar(&w.Layers, "layers", w.Layers, "estimate: MoE layers")
	fs.IntVar(&w.ExpertsPerLayer, "experts", w.ExpertsPerLayer, "estimate: routed experts per layer")
	fs.IntVar(&w.Hidden, "hidden", w.Hidden, "estimate: hidden size (input features of gate/up)")
	fs.IntVar(&w.ExpertWidth, "expert-width", w.ExpertWidth, "estimate: expert intermediate size")
	fs.Int64Var(&w.RoutedRowsPerLayer, "routed-rows", w.RoutedRowsPerLayer, "estimate: routed (token, expert) rows per layer")
	fs.IntVar(&w.BlockSize, "block", w.BlockSize, "estimate: GPTQ block size")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageErrorf("bench takes no arguments, got %q", fs.Args())
	}
	if *duration <= 0 {
		return usageErrorf("--duration must be positive, got %v", *duration)
	}
	if *workers < 0 {
		return usageErrorf("--workers must not be negative, got %d", *workers)
	}
	if w.Layers <= 0 || w.ExpertsPerLayer <= 0 || w.Hidden <= 0 || w.ExpertWidth <= 0 || w.RoutedRowsPerLayer < 0 || w.BlockSize <= 0 {
		return usageErrorf("estimate flags must be positive: %+v", w)
	}
	prev := kernels.SetWorkers(*workers)
	defer kernels.SetWorkers(prev)
	e.log.Info("measuring kernels", "duration", duration.String(), "workers", kernels.Workers(), "impl", kernels.Impl())
	start := time.Now()
	rep, err := kernels.RunBench(ctx, kernels.BenchOptions{
		Duration: *duration,
		Small:    *small,
		Progress: func(s string) { e.log.Info(s) },
	})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	est := rep.EstimateMoE(w)
	if *asJSON {
		return writeJSON(e.stdout, benchDoc{
			SchemaVersion: schemaVersion, Impl: rep.Impl, Workers: rep.Workers,
			DurationSec: time.Since(start).Seconds(), Peak: rep.Peak, Results: rep.Results,
			Workload: w, Estimate: est,
		})
	}
	printBench(e.stdout, rep, w, est, *small)
	return nil
}

func printBench(out io.Writer, rep *kernels.BenchReport, w kernels.MoEWorkload, est kernels.MoEEstimate, small bool) {
	fmt.Fprintf(out, "kernels: %s, %d workers\n", rep.Impl, rep.Workers)
	fmt.Fprintf(out, "FMA peak: %.1f GFLOP/s float32, %.1f GFLOP/s float64\n\n", rep.Peak.F32, rep.Peak.F64)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "kernel\tshape\tGFLOP/s\tof peak\tbest s\tmedian s\truns")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.0f%% %s\t%.4f\t%.4f\t%d\n",
			r.Name, r.Shape, r.GFLOPS, 100*r.PeakFrac, shortPrec(r.Precision), r.Best, r.Median, r.Runs)
	}
	tw.Flush()
	fmt.Fprintln(out)
	for _, r := range rep.Results {
		if r.Note != "" {
			fmt.Fprintf(out, "%s: %s\n", r.Name, r.Note)
		}
	}
	if small {
		fmt.Fprintln(out, "\n(--small shapes: not representative for sizing)")
		return
	}
	fmt.Fprintf(out, "\nEstimated kernel time for the routed experts of a %d-layer, %d-expert model (hidden %d, expert width %d,\n",
		w.Layers, w.ExpertsPerLayer, w.Hidden, w.ExpertWidth)
	fmt.Fprintf(out, "%d routed rows per layer, %d GPTQ solves, block %d), excluding the per-column quantization loop:\n",
		w.RoutedRowsPerLayer, est.Solves, w.BlockSize)
	fmt.Fprintf(out, "  Hessians %s, inverse factors %s, block updates %s, total %s\n",
		fmtSeconds(est.HessianSeconds), fmtSeconds(est.FactorSeconds), fmtSeconds(est.UpdateSeconds), fmtSeconds(est.TotalSeconds))
}

func shortPrec(p string) string {
	if p == "float64" {
		return "f64"
	}
	return "f32"
}

func fmtSeconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}
