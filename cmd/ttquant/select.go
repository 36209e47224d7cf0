package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/manifest/selection"
)

func init() {
	register(&command{name: "select", summary: "choose a precision per matrix to fit a budget with the least predicted error", run: runSelect})
}

// selectReport is the --json document of select.
type selectReport struct {
	SchemaVersion int    `json:"schema_version"`
	Plan          string `json:"plan_file"`
	Sensitivity   string `json:"sensitivity_file"`
	Measured      bool   `json:"measured"`
	SVG           string `json:"svg_file"`
	// KLWeights are the measured weights used (--weights measure).
	KLWeights *selection.KLWeights `json:"kl_weights,omitempty"`
	Result    *selection.Result    `json:"result"`
}

// selectFlags are the flags of select.
type selectFlags struct {
	build                         *buildFlags
	data                          *dataFlags
	gptq                          *gptqFlags
	calib, candidates, budget     *string
	tokenBytes, weights, override *string
	sensitivity, svg, parts       *string
	bpw                           *float64
	evalSequences, evalSeqLen     *int
	allowShort, allowSynthetic    *bool
}

func addSelectFlags(fs *flag.FlagSet) *selectFlags {
	f := &selectFlags{build: addBuildFlags(fs)}
	f.calib = fs.String("calib", "", "calibration store (calib build) the sensitivities are measured on by store builds (or --data)")
	f.data = addDataFlags(fs, calibrationSet, 128)
	f.allowShort = addAllowShortFlag(fs)
	f.allowSynthetic = fs.Bool("allow-synthetic-calibration", false, "accept a calibration store of synthetic activations (calib synth)")
	f.candidates = fs.String("candidates", selection.DefaultCandidates, "precisions each matrix may get: FORMAT:METHOD (BFP4_b:gptq, BFP4_b:rtn, BFP8_b:rtn, BFP8_b:gptq, BFP2_b:gptq, BFP2_b:rtn) or AS_IS, comma-separated")
	f.budget = fs.String("budget", "", "total stored tensor bytes (20GB, 19.5GiB, 4718592)")
	f.bpw = fs.Float64("bpw", 0, "bits per weight over every stored tensor")
	f.tokenBytes = fs.String("token-bytes", "", "bytes read per decoded token (routed experts weighted by their measured routing frequency)")
	f.weights = fs.String("weights", "", "multipliers of each role class's proxy loss: CLASS=W or CLASS@LAYER=W, comma-separated (attn_in, attn_out, mlp_in, mlp_out, other; default 1), or measure (the KL per unit of proxy loss of every class in every layer, from single-change evaluations on held-out calibration text, kept in the sensitivity file) or measure:class (one factor per class)")
	f.evalSequences = fs.Int("eval-sequences", selection.DefaultWeightSequences, "with --weights measure: held-out calibration sequences the single changes are scored on")
	f.evalSeqLen = fs.Int("eval-seq-len", selection.DefaultWeightSeqLen, "with --weights measure: their length in tokens")
	f.override = fs.String("override", "", "plan whose rules pin the matrices they match (a unit whole or not at all)")
	f.sensitivity = fs.String("sensitivity", "", "sensitivity file: read when it exists (no measurement), else measured and written there (default: beside --out)")
	f.svg = fs.String("svg", "", "Pareto curve picture (default: beside --out, .svg)")
	f.gptq = addGPTQFlags(fs)
	f.parts = fs.String("parts", "", "with --shard: the `directory`, shared by the workers, of the measurement builds and the single-change evaluations' records")
	return f
}

func runSelect(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "select", "--model SRC (--calib STORE | --data SPEC) (--budget SIZE | --bpw X | --token-bytes SIZE) --out PLAN.json [flags]")
	f := addSelectFlags(fs)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	opt, err := f.options(e, fs)
	if err != nil {
		return err
	}
	bf := f.build
	if opt.Shard.Count > 0 {
		return measureShard(ctx, e, opt, bf.asJSON)
	}
	res, err := selection.Run(ctx, opt)
	if err != nil {
		return syntheticCalibrationError(err)
	}
	if err := res.Plan.Save(bf.out); err != nil {
		return err
	}
	var svg strings.Builder
	if err := res.WriteSVG(&svg); err != nil {
		return err
	}
	if _, err := atomicfile.WriteFile(*f.svg, []byte(svg.String())); err != nil {
		return err
	}
	var kw *selection.KLWeights
	if opt.Measure.Weights != nil {
		kw = res.Sensitivity.KL
	}
	if bf.asJSON {
		return writeJSON(e.stdout, selectReport{SchemaVersion: schemaVersion, Plan: bf.out, Sensitivity: *f.sensitivity, Measured: res.Measured, SVG: *f.svg, KLWeights: kw, Result: res.Result})
	}
	printSelection(e.stdout, res.Result, kw, bf.out, *f.sensitivity, *f.svg, res.Measured)
	return nil
}

// options checks the flags and turns them into the selection's options;
// the sensitivity file and the picture default to beside --out.
func (f *selectFlags) options(e *env, fs *flag.FlagSet) (selection.RunOptions, error) {
	var opt selection.RunOptions
	bf, d := f.build, f.data
	bopt, err := bf.options(e, true)
	if err != nil {
		return opt, err
	}
	switch {
	case *f.calib != "" && d.data != "":
		return opt, usageErrorf("give --calib (a calibration store) or --data (calibration text, measured by sequential builds), not both")
	case *f.calib == "" && d.data == "":
		return opt, usageErrorf("--calib or --data is required")
	case *f.allowShort && d.data == "":
		return opt, usageErrorf("--allow-short applies to --data (calibration text) only")
	}
	if err := checkSelectSplit(bopt.Shard, d.data != "", *f.parts); err != nil {
		return opt, err
	}
	opt.Shard, opt.Parts = bopt.Shard, *f.parts
	candidates, err := selection.ParseCandidates(*f.candidates)
	if err != nil {
		return opt, usageErrorf("--candidates: %v", err)
	}
	if opt.Budget, err = f.budgetFlag(); err != nil {
		return opt, err
	}
	if opt.Weights, opt.Measure.Weights, err = f.weightsFlags(fs); err != nil {
		return opt, err
	}
	if *f.override != "" {
		if opt.Overrides, err = plan.LoadPlan(*f.override); err != nil {
			return opt, err
		}
	}
	g, err := f.gptq.options()
	if err != nil {
		return opt, err
	}
	stem := strings.TrimSuffix(bf.out, ".json")
	if *f.sensitivity == "" {
		*f.sensitivity = stem + ".sensitivity.json"
	}
	if *f.svg == "" {
		*f.svg = stem + ".svg"
	}
	m := &opt.Measure
	m.Source, m.Calib, m.Base, m.Candidates = bopt.Source, *f.calib, bopt.Plan, candidates
	m.Workers, m.ExpertsPerFile, m.GPTQOptions, m.AllowSyntheticCalibration = bopt.Workers, bopt.ExpertsPerFile, &g, *f.allowSynthetic
	if d.data != "" {
		if m.Data, m.DataOptions, err = d.resolve(bf.workers); err != nil {
			return opt, err
		}
		if err := inRange("sequences", int64(m.DataOptions.Calibration.Sequences), 1, math.MaxInt32); err != nil {
			return opt, err
		}
		m.AllowShortData = *f.allowShort
	}
	opt.SensitivityFile, opt.ScratchIn = *f.sensitivity, filepath.Dir(bf.out)
	if !bf.quiet {
		opt.Log = func(msg string) { fmt.Fprintf(e.stderr, "select: %s\n", msg) }
		if wm := m.Weights; wm != nil {
			wm.Progress = opt.Log
		}
	}
	return opt, nil
}

// budgetFlag is the one budget of --budget, --token-bytes and --bpw.
func (f *selectFlags) budgetFlag() (selection.Budget, error) {
	var b selection.Budget
	n := 0
	for _, s := range []struct {
		flag, value string
		kind        selection.BudgetKind
	}{{"budget", *f.budget, selection.BudgetBytes}, {"token-bytes", *f.tokenBytes, selection.BudgetTokenBytes}} {
		if s.value == "" {
			continue
		}
		n++
		v, err := selection.ParseSize(s.value)
		if err != nil {
			return b, usageErrorf("--%s: %v", s.flag, err)
		}
		b = selection.Budget{Kind: s.kind, Value: v}
	}
	if *f.bpw != 0 {
		n++
		if err := inRangeFloat("bpw", *f.bpw, 0.5, 64); err != nil {
			return b, err
		}
		b = selection.Budget{Kind: selection.BudgetBPW, Value: *f.bpw}
	}
	if n != 1 {
		return b, usageErrorf("give exactly one of --budget, --bpw, --token-bytes")
	}
	return b, nil
}

// weightsFlags are the weights of --weights: given by hand, or measured
// (--weights measure, on --eval-sequences of --eval-seq-len tokens, which
// apply to a measurement only).
func (f *selectFlags) weightsFlags(fs *flag.FlagSet) (selection.Weights, *selection.WeightMeasure, error) {
	switch *f.weights {
	case "measure", "measure:class":
		wm := &selection.WeightMeasure{Mode: selection.WeightsPerClassLayer, Sequences: *f.evalSequences, SeqLen: *f.evalSeqLen}
		if *f.weights == "measure:class" {
			wm.Mode = selection.WeightsPerClass
		}
		if err := wm.Validate(); err != nil {
			return nil, nil, usageErrorf("--eval-sequences/--eval-seq-len: %v", err)
		}
		return nil, wm, nil
	}
	w, err := selection.ParseWeights(*f.weights)
	if err != nil {
		return nil, nil, usageErrorf("--weights: %v", err)
	}
	given := false
	fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == "eval-sequences" || fl.Name == "eval-seq-len" })
	if given {
		return nil, nil, usageErrorf("--eval-sequences and --eval-seq-len apply to --weights measure only")
	}
	return w, nil, nil
}

func printSelection(w io.Writer, r *selection.Result, kw *selection.KLWeights, planPath, sensPath, svgPath string, measured bool) {
	fmt.Fprintf(w, "## Precision selection: %s\n\n", r.Budget)
	verb := "read"
	if measured {
		verb = "measured, written to"
	}
	fmt.Fprintf(w, "plan `%s`; sensitivities %s `%s`; Pareto curve `%s`\n\n", planPath, verb, sensPath, svgPath)
	grid := "exact (64-byte cells)"
	if !r.Exact {
		grid = fmt.Sprintf("grid cell %.4g, within the optimum at budget − %.4g", r.Grid, r.Bound)
	}
	pinned := 0
	for _, u := range r.Units {
		if u.Pinned {
			pinned++
		}
	}
	fmt.Fprintf(w, "solver: %s; %d units (%d pinned by the overrides); %d tensors fixed by the base plan or the overrides\n\n", grid, len(r.Units), pinned, r.Fixed)
	fmt.Fprintf(w, "| plan | stored | per token | bits/weight | predicted error |\n|---|---:|---:|---:|---:|\n")
	for _, p := range append([]selection.Point{r.Selected, r.Smallest, r.Largest}, r.References...) {
		fmt.Fprintf(w, "| %s | %s | %s | %.3f | %.6g |\n", p.Name, humanBytes(p.StoredBytes), humanBytes(int64(math.Round(p.TokenBytes))), p.BitsPerWeight, p.PredictedError)
	}
	fmt.Fprintf(w, "\n| format | tensors | bytes |\n|---|---:|---:|\n")
	for _, f := range r.Formats {
		fmt.Fprintf(w, "| %s | %d | %s |\n", f.Format, f.Tensors, humanBytes(f.StoredBytes))
	}
	fmt.Fprintf(w, "\n| role | format | tensors | bytes |\n|---|---|---:|---:|\n")
	for _, f := range r.Roles {
		fmt.Fprintf(w, "| %s | %s | %d | %s |\n", f.Role, f.Format, f.Tensors, humanBytes(f.Bytes))
	}
	if kw != nil {
		fmt.Fprintf(w, "\nweights: each key's matrices moved alone to %s, mean KL on %d held-out tokens over the predicted error at weight 1\n\n", kw.Candidate, kw.Scored)
		fmt.Fprintf(w, "| key | matrices | mean KL | loss | weight |\n|---|---:|---:|---:|---:|\n")
		for _, c := range kw.Changes {
			fmt.Fprintf(w, "| %s | %d | %.4g ± %.2g | %.4g | %.4g |\n", c.Key, c.Tensors, c.KL, c.KLSE, c.Loss, c.Weight)
		}
	}
	fmt.Fprintf(w, "\n| layer | unit | choice | bytes | routed share | predicted error |\n|---:|---|---|---:|---:|---:|\n")
	for _, u := range r.Units {
		pin := ""
		if u.Pinned {
			pin = " (override)"
		}
		fmt.Fprintf(w, "| %d | %s | %s%s | %s | %.3f | %.6g |\n", u.Layer, u.Name, u.Choice, pin, humanBytes(u.Bytes), u.Frequency, u.Error)
	}
}

// checkSelectSplit checks the flags of a split measurement by the
// selection's rules (selection.CheckSplit), naming the flags: --shard
// needs a calibration store and --parts, --parts needs --shard.
func checkSelectSplit(sp shard.Spec, fromText bool, parts string) error {
	var se *selection.SplitError
	if err := selection.CheckSplit(sp, fromText, parts); errors.As(err, &se) {
		return usageErrorf("%s", se.Message(selection.SplitNames{Shard: "--shard", Parts: "--parts", Data: "--data", Calib: "--calib"}))
	} else if err != nil {
		return err
	}
	return nil
}

// measureShard runs one worker's share of a split measurement
// (selection.RunShard) and reports it.
func measureShard(ctx context.Context, e *env, opt selection.RunOptions, asJSON bool) error {
	rep, err := selection.RunShard(ctx, opt)
	if err != nil {
		return syntheticCalibrationError(err)
	}
	if rep == nil {
		fmt.Fprintf(e.stdout, "sensitivity %s holds this measurement; nothing to do (run select without --shard)\n", opt.SensitivityFile)
		return nil
	}
	return printMeasureShard(e, rep, asJSON)
}

// measureShardDoc is the --json document of one worker of a split
// measurement.
type measureShardDoc struct {
	SchemaVersion int                    `json:"schema_version"`
	Shard         *selection.ShardReport `json:"shard"`
}

// printMeasureShard reports what one worker of a split measurement did
// and what comes next.
func printMeasureShard(e *env, r *selection.ShardReport, asJSON bool) error {
	if asJSON {
		return writeJSON(e.stdout, measureShardDoc{SchemaVersion: schemaVersion, Shard: r})
	}
	for _, b := range r.Builds {
		fmt.Fprintf(e.stdout, "worker      %d/%d: measurement build %s, %d files (%d kept from an earlier run)\n", r.Worker, r.Workers, b.Format, b.Files, b.Kept)
	}
	if r.Changes > 0 {
		kept := ""
		if r.KeptChanges {
			kept = " (kept from an earlier run)"
		}
		fmt.Fprintf(e.stdout, "worker      %d/%d: %d of %d single changes scored%s\n", r.Worker, r.Workers, r.WorkerChanges, r.Changes, kept)
	}
	if a := r.Assembled; a != nil {
		fmt.Fprintf(e.stdout, "sensitivity %s written\n", a.SensitivityFile)
		return nil
	}
	next := "ttquant assemble " + r.Dir + " writes the sensitivity file"
	if !r.BuildsAssembled && r.Changes == 0 {
		next = "ttquant assemble " + r.Dir + " assembles the measurement builds"
	}
	fmt.Fprintf(e.stdout, "next        %s once every worker has finished\n", next)
	return nil
}
