package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/emulator/eval/harness"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/internal/text/dataset"
)

func init() {
	register(&command{
		name:    "eval",
		summary: "evaluate native checkpoints against their BF16 source: ΔPPL, top-1 and KL per corpus",
		run:     runEval,
	})
}

// evalFlags are the flags of eval.
type evalFlags struct {
	model, calibData, labels, numerics, kvCache *string
	svg, parts, assemble                        *string
	calibFraction, maxOverlap                   *float64
	overlapRun, workers, batchTokens            *int
	allowOverlap, self, stream, asJSON, quiet   *bool
	shard                                       *shardFlags
	data                                        *dataFlags
}

func addEvalFlags(fs *flag.FlagSet) *evalFlags {
	f := &evalFlags{}
	f.model = fs.String("model", "", "Hugging Face source `directory` (config.json, safetensors, tokenizer.json): the reference (required)")
	f.calibData = fs.String("calib-data", "", "calibration data `SPEC` the checkpoints were made from: its calibration set (--sequences, --seq-len, --mode, --short, --seed, --calib-fraction) is checked for overlap with the evaluation text")
	f.calibFraction = fs.Float64("calib-fraction", dataset.DefaultEvalFraction, "with --calib-data: the eval fraction the calibration set was built with, 0 < f < 1")
	f.allowOverlap = fs.Bool("allow-overlap", false, "warn instead of refusing when more than --max-overlap of the scored tokens is calibration text")
	f.maxOverlap = fs.Float64("max-overlap", harness.DefaultMaxOverlap, "largest share of the scored tokens that may lie in text shared with the calibration text (the fingerprint in the checkpoints' manifests, or --calib-data), 0 < f < 1")
	f.overlapRun = fs.Int("overlap-run", dataset.FingerprintRun, "with --calib-data: a run of this many tokens shared with the calibration text is overlap (8..4096; a manifest's fingerprint records its own)")
	f.labels = fs.String("labels", "", "comma-separated table labels of the checkpoints, in order (default: their directory names)")
	f.self = fs.Bool("self", false, "also evaluate the source model against itself (a check: ΔPPL 0, top-1 1, KL 0)")
	f.numerics = fs.String("numerics", "cpu", "candidate numerics: cpu (decoded weights, float32 activations and matmuls) or device[:LoFi|HiFi2|HiFi3|HiFi4] (weight products as the Tensix Matrix Unit computes them; default fidelity HiFi2)")
	f.kvCache = fs.String("kv-cache", "f32", "candidates' key-value cache of full-attention layers: f32 or bfp8 (stored as BFP8_b and read back)")
	f.stream = fs.Bool("stream", false, "read each layer's weights for every batch of windows (--batch-tokens) instead of keeping all runs' float32 weights in memory (large models)")
	f.batchTokens = fs.Int("batch-tokens", forward.BatchRows, "most tokens of consecutive windows run as one batch, each layer's weights read once per batch (1: a window at a time); memory grows with it, results do not change")
	f.workers = addWorkersFlag(fs, "goroutines")
	f.asJSON = fs.Bool("json", false, "print the result as JSON (schema_version, identities, data provenance, tables)")
	f.quiet = fs.Bool("quiet", false, "no progress on stderr")
	f.svg = fs.String("svg", "", "also write a picture of the result to this SVG `file`: per-corpus mean KL with error bars, and each candidate's distribution of the per-position KL")
	f.shard = addShardFlags(fs, "eval --assemble DIR with the same flags")
	f.parts = fs.String("parts", "", "with --shard: the `directory` (shared by the workers) this worker writes its part to")
	f.assemble = fs.String("assemble", "", "merge the parts a split evaluation's workers wrote to this `directory` (the same flags otherwise) into the table one process computes")
	f.data = addDataFlags(fs, calibrationSet|evaluationSet, 0)
	// Here the calibration flags describe --calib-data's set, and without
	// --eval-sequences the text is scored record by record.
	fs.Lookup("sequences").Usage = "with --calib-data: the calibration set's sequences, as the checkpoints were calibrated"
	fs.Lookup("eval-sequences").Usage = "evaluation sequences of --eval-seq-len tokens (0: every record its own window, longer ones split)"
	return f
}

func runEval(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "eval", "--model SRC --data SPEC [--eval-seq-len L] [--eval-sequences N --eval-mode pack|record] [--calib-data SPEC ...] [--json] CKPT [CKPT...]")
	f := addEvalFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	opt, err := f.options(fs)
	if err != nil {
		return err
	}
	// --workers bounds the kernels' goroutines too, as in run and calib
	// build: the process's setting, chosen here, not by the harness.
	prev := kernels.SetWorkers(opt.Workers)
	defer kernels.SetWorkers(prev)
	var pr *progress
	if !*f.quiet {
		pr = newProgress(e.stderr)
		defer pr.close()
		opt.Log = func(msg string) { pr.println("eval: " + msg) }
		opt.Progress = pr.evalEvent
	}
	start := time.Now()
	rep, err := harness.Run(ctx, opt)
	if pr != nil && err == nil {
		pr.println(fmt.Sprintf("eval: done in %s", time.Since(start).Round(time.Millisecond)))
	}
	var oe *harness.OverlapError
	switch {
	case errors.As(err, &oe):
		return fmt.Errorf("%w (--max-overlap %g is the limit; --allow-overlap evaluates anyway)", err, opt.MaxOverlap)
	case err != nil:
		return err
	}
	return printEval(e, rep, *f.asJSON, *f.svg, opt.Parts)
}

// options checks the flags and turns them into the harness's options.
func (f *evalFlags) options(fs *flag.FlagSet) (harness.Options, error) {
	var opt harness.Options
	sp, err := f.shard.spec()
	if err != nil {
		return opt, err
	}
	if err := checkEvalSplit(sp, *f.parts, *f.assemble, *f.svg); err != nil {
		return opt, err
	}
	if *f.model == "" {
		return opt, usageErrorf("--model SRC is required")
	}
	ckpts := fs.Args()
	if len(ckpts) == 0 && !*f.self {
		return opt, usageErrorf("no checkpoint given: ttquant eval --model SRC --data SPEC CKPT [CKPT...]")
	}
	lbls, err := parseLabels(*f.labels, len(ckpts))
	if err != nil {
		return opt, err
	}
	if err := checkWorkers(*f.workers); err != nil {
		return opt, err
	}
	if err := checkEvalRanges(*f.overlapRun, *f.maxOverlap, *f.batchTokens); err != nil {
		return opt, err
	}
	num, err := numericsFlags(*f.numerics, *f.kvCache)
	if err != nil {
		return opt, err
	}
	// The calibration flags describe --calib-data's set, not this run's
	// text: resolve the evaluation options without them.
	d := f.data
	calSeqs := d.sequences
	d.sequences = 0
	spec, dopt, err := d.resolve(*f.workers)
	d.sequences = calSeqs
	if err != nil {
		return opt, err
	}
	window := dopt.Evaluation.SeqLen
	heldOut, err := evalSet(fs, d, spec, &dopt)
	if err != nil {
		return opt, err
	}
	opt = harness.Options{Model: *f.model, Checkpoints: ckpts, Labels: lbls, Self: *f.self, Data: spec, DataOptions: dopt, HeldOutOfCalibration: heldOut,
		AllowOverlap: *f.allowOverlap, AllowedBy: "--allow-overlap", MaxOverlap: *f.maxOverlap, OverlapRun: *f.overlapRun, Stream: *f.stream, Window: window, Numerics: num, Workers: *f.workers, BatchTokens: *f.batchTokens,
		Shard: sp, Parts: *f.parts, Assemble: *f.assemble}
	if opt.Calib, opt.CalibOptions, err = calibSet(fs, d, *f.calibData, *f.calibFraction, calSeqs, dopt); err != nil {
		return opt, err
	}
	return opt, nil
}

// evalText is eval's one progress line: the share of the scored tokens
// done, windows, tokens and their rate, elapsed time and the ETA.
func evalText(p eval.Progress) string {
	rate := 0.0
	if p.Elapsed > 0 {
		rate = float64(p.ScoredDone) / p.Elapsed.Seconds()
	}
	return fmt.Sprintf("%3d%%  %d/%d windows  %d/%d scored tokens  %.0f tokens/s  %s elapsed  ETA %s", pct(p.ScoredDone, p.Scored),
		p.WindowsDone, p.Windows, p.ScoredDone, p.Scored, rate, p.Elapsed.Round(time.Second), etaText(p.ETA()))
}

func (p *progress) evalEvent(ev eval.Progress) {
	line := evalText(ev)
	if ev.WindowsDone == ev.Windows {
		p.end(line)
		return
	}
	p.draw(line, "", false, true)
}

// parseLabels checks the table labels of n checkpoints (none: nil).
func parseLabels(labels string, n int) ([]string, error) {
	if labels == "" {
		return nil, nil
	}
	lbls := strings.Split(labels, ",")
	if len(lbls) != n {
		return nil, usageErrorf("--labels gives %d labels for %d checkpoints", len(lbls), n)
	}
	seen := map[string]bool{}
	for _, l := range lbls {
		if strings.TrimSpace(l) == "" || seen[l] || l == "self" {
			return nil, usageErrorf("--labels %q: labels must be non-empty, distinct and not \"self\"", labels)
		}
		seen[l] = true
	}
	return lbls, nil
}

// evalSet settles what is scored. Without --eval-sequences the data is
// scored as it is: every record its own window of up to --eval-seq-len
// tokens (longer ones split); without --eval-fraction every record, or,
// when the data holds a file a checkpoint was calibrated on, the records
// its split held out (heldOut).
func evalSet(fs *flag.FlagSet, d *dataFlags, spec *dataset.Spec, dopt *dataset.Options) (heldOut bool, err error) {
	if spec.Options != nil || d.evalSequences != 0 {
		if !dopt.Evaluation.Requested() {
			return false, usageErrorf("the spec file %s builds no evaluation set: give its evaluation options there", d.data)
		}
		return false, nil
	}
	var set []string
	given := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "eval-mode", "eval-short":
			set = append(set, "--"+f.Name)
		case "eval-fraction":
			given = true
		}
	})
	if len(set) > 0 {
		return false, usageErrorf("%s shapes --eval-sequences N sequences; without it every record is scored as its own window", strings.Join(set, ", "))
	}
	dopt.Evaluation = dataset.SetOptions{AllRecords: true}
	if !given {
		dopt.EvalFraction = 1
		return true, nil
	}
	return false, nil
}

// calibSet is the calibration set of --calib-data (none: nil), whose
// overlap with the evaluation text is checked; the calibration flags
// (--sequences, --seq-len, --mode, --short, --calib-fraction) describe it.
// They mean something only with --calib-data, and only when its spec does
// not carry its own options: one given otherwise is a usage error, never
// ignored.
func calibSet(fs *flag.FlagSet, d *dataFlags, calibData string, calibFraction float64, calSeqs int, dopt dataset.Options) (*dataset.Spec, dataset.Options, error) {
	var calibFlags []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "sequences", "seq-len", "mode", "short", "calib-fraction":
			calibFlags = append(calibFlags, "--"+f.Name)
		}
	})
	if calibData != "" {
		cs, err := dataset.ParseSpec(calibData)
		if err != nil {
			return nil, dataset.Options{}, fmt.Errorf("--calib-data: %w", err)
		}
		copt := dopt
		if cs.Options != nil {
			if len(calibFlags) > 0 {
				return nil, dataset.Options{}, usageErrorf("%s: the --calib-data spec file carries its own options; give them there", strings.Join(calibFlags, ", "))
			}
			copt = *cs.Options
		} else {
			if calSeqs <= 0 {
				return nil, dataset.Options{}, usageErrorf("--calib-data needs --sequences N (the calibration set's size, as the checkpoints were calibrated)")
			}
			if calibFraction <= 0 || calibFraction >= 1 {
				return nil, dataset.Options{}, usageErrorf("--calib-fraction %v: want 0 < f < 1", calibFraction)
			}
			short := dataset.Short(d.short)
			if d.mode == "pack" {
				short = ""
			}
			copt.Calibration = dataset.SetOptions{Sequences: calSeqs, SeqLen: d.seqLen, Mode: dataset.Mode(d.mode), Short: short}
			copt.EvalFraction = calibFraction
		}
		return cs, copt, nil
	} else if len(calibFlags) > 0 || calSeqs > 0 {
		if len(calibFlags) == 0 {
			calibFlags = []string{"--sequences"}
		}
		return nil, dataset.Options{}, usageErrorf("%s describes the calibration set of --calib-data, which is not given", strings.Join(calibFlags, ", "))
	}
	return nil, dataset.Options{}, nil
}

// printEval prints a worker's part, or the table (and writes the picture).
func printEval(e *env, rep *harness.Report, asJSON bool, svgOut, parts string) error {
	if p := rep.Part; p != nil {
		if asJSON {
			return writeJSON(e.stdout, struct {
				SchemaVersion int    `json:"schema_version"`
				Part          string `json:"part"`
				Worker        int    `json:"worker"`
				Workers       int    `json:"workers"`
				Windows       int    `json:"windows"`
				Of            int    `json:"of_windows"`
			}{schemaVersion, p.Path, p.Worker, p.Workers, p.Windows, p.Of})
		}
		fmt.Fprintf(e.stdout, "worker      %d/%d: %d of %d windows scored\npart        %s (merge with eval --assemble %s)\n", p.Worker, p.Workers, p.Windows, p.Of, p.Path, parts)
		return nil
	}
	if svgOut != "" {
		var b bytes.Buffer
		if err := rep.WriteSVG(&b); err != nil {
			return err
		}
		if _, err := atomicfile.WriteFile(svgOut, b.Bytes()); err != nil {
			return err
		}
	}
	if asJSON {
		return rep.WriteJSON(e.stdout)
	}
	fmt.Fprintf(e.stdout, "Scored: %s.\n\n", rep.Data.(harness.DataInfo).Selection)
	if err := rep.WriteMarkdown(e.stdout); err != nil {
		return err
	}
	for _, w := range rep.Warnings {
		fmt.Fprintf(e.stdout, "\nwarning: %s\n", w)
	}
	return nil
}

// checkEvalSplit checks the flags of a split evaluation by the harness's
// rules (harness.CheckSplit), naming the flags: a worker writes its part
// to --parts, --assemble merges the parts (and may picture them).
func checkEvalSplit(sp shard.Spec, parts, assemble, svgOut string) error {
	var se *harness.SplitError
	switch err := harness.CheckSplit(sp, parts, assemble); {
	case errors.As(err, &se):
		return usageErrorf("%s", se.Message(harness.SplitNames{Shard: "--shard", Parts: "--parts", Assemble: "--assemble"}))
	case err != nil:
		return err
	case sp.Count > 1 && svgOut != "":
		return usageErrorf("--svg pictures the merged table: give it with --assemble")
	}
	return nil
}

// checkEvalRanges checks --batch-tokens, --overlap-run and --max-overlap.
func checkEvalRanges(run int, maxShare float64, batchTokens int) error {
	if batchTokens < 1 {
		return usageErrorf("--batch-tokens %d: want at least 1", batchTokens)
	}
	if run < 8 || run > 4096 {
		return usageErrorf("--overlap-run %d: want 8..4096", run)
	}
	if !(maxShare > 0 && maxShare < 1) {
		return usageErrorf("--max-overlap %v: want a share 0 < f < 1", maxShare)
	}
	return nil
}

// numericsFlags parses --numerics and --kv-cache.
func numericsFlags(numerics, kvCache string) (harness.Numerics, error) {
	num, err := harness.ParseNumerics(numerics, kvCache)
	switch {
	case errors.Is(err, harness.ErrNumerics):
		return num, usageErrorf("--numerics %q: want cpu, device or device:LoFi|HiFi2|HiFi3|HiFi4 (%v)", numerics, err)
	case err != nil:
		return num, usageErrorf("--kv-cache %q: want f32 or bfp8", kvCache)
	}
	return num, nil
}
