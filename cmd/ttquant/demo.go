package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/manifest/build"
)

func init() {
	register(&command{name: "demo", summary: "the main job end to end on the built-in tiny model", run: runDemo})
}

// demoReport is the --json document of demo.
type demoReport struct {
	SchemaVersion int `json:"schema_version"`
	*build.DemoResult
}

func runDemo(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "demo", "[--out DIR] [--json]")
	out := fs.String("out", "", "keep the checkpoint in this directory (default: a temporary directory, removed)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	workers := addWorkersFlag(fs, "files produced and checked")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	seqs := fs.Int("sequences", 16, "synthetic calibration sequences")
	seqLen := fs.Int("seq-len", 128, "tokens per synthetic calibration sequence")
	heldOut := fs.Int("held-out", 4, "final sequences kept out of the Hessians for the held-out error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	if err := inRange("sequences", int64(*seqs), 2, math.MaxInt32); err != nil {
		return err
	}
	if err := inRange("seq-len", int64(*seqLen), 1, math.MaxInt32); err != nil {
		return err
	}
	if err := inRange("held-out", int64(*heldOut), 1, int64(*seqs)-1); err != nil {
		return err
	}
	setToolVersion()
	scratch, err := os.MkdirTemp("", "ttquant-demo-model-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	src := filepath.Join(scratch, "model")
	if err := testmodel.Write(src, testmodel.Tiny(), testmodel.Default); err != nil {
		return fmt.Errorf("writing the tiny model: %w", err)
	}
	opt := build.DemoOptions{Source: src, Out: *out, Workers: *workers, Sequences: *seqs, SeqLen: *seqLen, HeldOut: *heldOut}
	if !*quiet {
		opt.Progress = newProgress(e.stderr).event
		fmt.Fprintln(e.stderr, "demo: tiny Qwen3.6-MoE model, synthetic calibration, GPTQ for the routed experts, RTN for the rest")
	}
	res, err := build.Demo(ctx, opt)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(e.stdout, demoReport{SchemaVersion: schemaVersion, DemoResult: res}); err != nil {
			return err
		}
	} else {
		printDemo(e, res)
	}
	if !res.Verify.OK {
		return &statusError{status: exitVerifyKO, err: fmt.Errorf("the demo checkpoint failed verification (%d failed checks)", len(res.Verify.Failures))}
	}
	return nil
}

func printDemo(e *env, r *build.DemoResult) {
	w := e.stdout
	fmt.Fprintln(w, "held-out MoE block error (mean squared error / mean square of the output)")
	fmt.Fprintf(w, "%5s  %8s  %8s  %10s  %10s  %7s  %7s\n", "layer", "calib", "held-out", "GPTQ", "RTN", "GPTQ/RTN", "starved")
	for _, l := range r.Layers {
		fmt.Fprintf(w, "%5d  %8d  %8d  %10.3e  %10.3e  %7.3f  %7d\n", l.Layer, l.CalibTokens, l.HeldOutTokens, l.GPTQRelErr, l.RTNRelErr, l.Ratio, l.Starved)
	}
	if n := len(r.Fallbacks); n > 0 {
		fmt.Fprintf(w, "%d matrices rounded to nearest instead of GPTQ, e.g. %s: %s\n", n, r.Fallbacks[0].Tensor, r.Fallbacks[0].Fallback)
	}
	fmt.Fprintf(w, "checkpoint  %d files, %d tensors, %s", r.Files, r.Tensors, humanBytes(r.Bytes))
	if r.Dir != "" {
		fmt.Fprintf(w, " in %s", r.Dir)
	}
	fmt.Fprintln(w)
	status := "OK"
	if !r.Verify.OK {
		status = fmt.Sprintf("FAILED (%d checks)", len(r.Verify.Failures))
		for _, f := range r.Verify.Failures {
			fmt.Fprintf(w, "FAIL  %s\n", f)
		}
	}
	fmt.Fprintf(w, "verify      %s (against the source)\n", status)
	fmt.Fprintf(w, "identity    %s\n", r.Identity)
	fmt.Fprintf(w, "cache key   %s\n", r.CacheKey)
}
