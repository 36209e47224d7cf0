package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/manifest/build"
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

func runSelect(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "select", "--model SRC (--calib STORE | --data SPEC) (--budget SIZE | --bpw X | --token-bytes SIZE) --out PLAN.json [flags]")
	bf := addBuildFlags(fs)
	calibPath := fs.String("calib", "", "calibration store (calib build) the sensitivities are measured on by store builds (or --data)")
	d := addDataFlags(fs, calibrationSet, 128)
	allowShort := addAllowShortFlag(fs)
	allowSynth := fs.Bool("allow-synthetic-calibration", false, "accept a calibration store of synthetic activations (calib synth)")
	cands := fs.String("candidates", selection.DefaultCandidates, "precisions each matrix may get: FORMAT:METHOD (BFP4_b:gptq, BFP4_b:rtn, BFP8_b:rtn, BFP8_b:gptq, BFP2_b:gptq, BFP2_b:rtn) or AS_IS, comma-separated")
	budget := fs.String("budget", "", "total stored tensor bytes (20GB, 19.5GiB, 4718592)")
	bpw := fs.Float64("bpw", 0, "bits per weight over every stored tensor")
	tokenBytes := fs.String("token-bytes", "", "bytes read per decoded token (routed experts weighted by their measured routing frequency)")
	weights := fs.String("weights", "", "multipliers of each role class's proxy loss: CLASS=W or CLASS@LAYER=W, comma-separated (attn_in, attn_out, mlp_in, mlp_out, other; default 1), or measure (the KL per unit of proxy loss of every class in every layer, from single-change evaluations on held-out calibration text, kept in the sensitivity file) or measure:class (one factor per class)")
	evalSeqs := fs.Int("eval-sequences", selection.DefaultWeightSequences, "with --weights measure: held-out calibration sequences the single changes are scored on")
	evalSeqLen := fs.Int("eval-seq-len", selection.DefaultWeightSeqLen, "with --weights measure: their length in tokens")
	override := fs.String("override", "", "plan whose rules pin the matrices they match (a unit whole or not at all)")
	sens := fs.String("sensitivity", "", "sensitivity file: read when it exists (no measurement), else measured and written there (default: beside --out)")
	svgPath := fs.String("svg", "", "Pareto curve picture (default: beside --out, .svg)")
	gf := addGPTQFlags(fs)
	parts := fs.String("parts", "", "with --shard: the `directory`, shared by the workers, of the measurement builds and the single-change evaluations' records")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q", pos[0])
	}
	opt, err := bf.options(e, true)
	if err != nil {
		return err
	}
	switch {
	case *calibPath != "" && d.data != "":
		return usageErrorf("give --calib (a calibration store) or --data (calibration text, measured by sequential builds), not both")
	case *calibPath == "" && d.data == "":
		return usageErrorf("--calib or --data is required")
	case *allowShort && d.data == "":
		return usageErrorf("--allow-short applies to --data (calibration text) only")
	}
	sp := opt.Shard
	if err := checkSelectSplit(sp, d.data, *parts); err != nil {
		return err
	}
	candidates, err := selection.ParseCandidates(*cands)
	if err != nil {
		return usageErrorf("--candidates: %v", err)
	}
	var b selection.Budget
	n := 0
	for _, f := range []struct {
		flag, value string
		kind        selection.BudgetKind
	}{{"budget", *budget, selection.BudgetBytes}, {"token-bytes", *tokenBytes, selection.BudgetTokenBytes}} {
		if f.value == "" {
			continue
		}
		n++
		v, err := selection.ParseSize(f.value)
		if err != nil {
			return usageErrorf("--%s: %v", f.flag, err)
		}
		b = selection.Budget{Kind: f.kind, Value: v}
	}
	if *bpw != 0 {
		n++
		if err := inRangeFloat("bpw", *bpw, 0.5, 64); err != nil {
			return err
		}
		b = selection.Budget{Kind: selection.BudgetBPW, Value: *bpw}
	}
	if n != 1 {
		return usageErrorf("give exactly one of --budget, --bpw, --token-bytes")
	}
	var w selection.Weights
	var wm *selection.WeightMeasure
	switch *weights {
	case "measure", "measure:class":
		wm = &selection.WeightMeasure{Mode: selection.WeightsPerClassLayer, Sequences: *evalSeqs, SeqLen: *evalSeqLen}
		if *weights == "measure:class" {
			wm.Mode = selection.WeightsPerClass
		}
		if err := wm.Validate(); err != nil {
			return usageErrorf("--eval-sequences/--eval-seq-len: %v", err)
		}
		if !bf.quiet {
			wm.Progress = func(msg string) { fmt.Fprintf(e.stderr, "select: %s\n", msg) }
		}
	default:
		if w, err = selection.ParseWeights(*weights); err != nil {
			return usageErrorf("--weights: %v", err)
		}
		given := false
		fs.Visit(func(f *flag.Flag) { given = given || f.Name == "eval-sequences" || f.Name == "eval-seq-len" })
		if given {
			return usageErrorf("--eval-sequences and --eval-seq-len apply to --weights measure only")
		}
	}
	var over *plan.Plan
	if *override != "" {
		if over, err = plan.LoadPlan(*override); err != nil {
			return err
		}
	}
	g, err := gf.options()
	if err != nil {
		return err
	}
	stem := strings.TrimSuffix(bf.out, ".json")
	if *sens == "" {
		*sens = stem + ".sensitivity.json"
	}
	if *svgPath == "" {
		*svgPath = stem + ".svg"
	}
	mopt := selection.MeasureOptions{Source: opt.Source, Calib: *calibPath, Base: opt.Plan, Candidates: candidates,
		Workers: opt.Workers, ExpertsPerFile: opt.ExpertsPerFile, GPTQOptions: &g, AllowSyntheticCalibration: *allowSynth}
	if d.data != "" {
		if mopt.Data, mopt.DataOptions, err = d.resolve(bf.workers); err != nil {
			return err
		}
		if err := inRange("sequences", int64(mopt.DataOptions.Calibration.Sequences), 1, math.MaxInt32); err != nil {
			return err
		}
		mopt.AllowShortData = *allowShort
	}
	sopt := selection.Options{Source: opt.Source, Base: opt.Plan, Overrides: over, Candidates: candidates, Budget: b, Weights: w}

	// Refusals before the measurement: a sensitivity file of other inputs,
	// an unmeasured candidate, a byte budget outside the achievable range,
	// an override splitting a unit.
	var s *selection.Sensitivity
	measured := false
	if _, statErr := os.Stat(*sens); statErr == nil {
		if s, err = selection.LoadSensitivity(*sens); err != nil {
			return err
		}
		modelID, err := selection.ModelIdentity(opt.Source)
		if err != nil {
			return err
		}
		mopt.SourceIdentity = modelID // a new measurement below does not hash the model again
		storeID, err := selection.CalibrationIdentity(ctx, mopt)
		if err != nil {
			return err
		}
		if err := s.Check(modelID, storeID, opt.Plan, opt.ExpertsPerFile); err != nil {
			return err
		}
		if wm != nil && !s.KL.Matches(wm) {
			if !bf.quiet {
				fmt.Fprintf(e.stderr, "select: %s holds no weights measured as asked (mode %s, %d × %d tokens): measuring again\n", *sens, wm.Mode, wm.Sequences, wm.SeqLen)
			}
			s = nil
		}
	}
	if s != nil && sp.Count > 0 {
		fmt.Fprintf(e.stdout, "sensitivity %s holds this measurement; nothing to do (run select without --shard)\n", *sens)
		return nil
	}
	if s == nil {
		mopt.Weights = wm
		skel, err := selection.Prepare(mopt)
		if err != nil {
			return err
		}
		if b.Kind != selection.BudgetTokenBytes {
			sopt.Sensitivity = skel
			if err := selection.CheckBudget(sopt); err != nil {
				return err
			}
		}
		if sp.Count > 0 {
			return measureShard(ctx, e, mopt, skel, selection.ShardOptions{Spec: sp, Dir: *parts, SensitivityFile: *sens}, bf.asJSON)
		}
		tmp, err := os.MkdirTemp(filepath.Dir(bf.out), ".select-measure-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		mopt.Scratch = tmp
		if !bf.quiet {
			fmt.Fprintf(e.stderr, "select: measuring %d matrices (one store build per format: %v)\n", len(skel.Tensors), skel.Measured)
		}
		if s, err = selection.MeasurePrepared(ctx, mopt, skel); err != nil {
			if errors.Is(err, build.ErrSyntheticCalibration) {
				return usageErrorf("%v (pass --allow-synthetic-calibration to use it anyway)", err)
			}
			return err
		}
		measured = true
	}
	if wm != nil {
		sopt.Weights = s.KL.Weights()
	}
	sopt.Sensitivity = s
	res, err := selection.Select(sopt)
	if err != nil {
		return err
	}
	if measured {
		if err := s.Save(*sens); err != nil {
			return err
		}
	}
	if err := res.Plan.Save(bf.out); err != nil {
		return err
	}
	var svg strings.Builder
	if err := res.WriteSVG(&svg); err != nil {
		return err
	}
	if _, err := atomicfile.WriteFile(*svgPath, []byte(svg.String())); err != nil {
		return err
	}
	var kw *selection.KLWeights
	if wm != nil {
		kw = s.KL
	}
	if bf.asJSON {
		return writeJSON(e.stdout, selectReport{SchemaVersion: schemaVersion, Plan: bf.out, Sensitivity: *sens, Measured: measured, SVG: *svgPath, KLWeights: kw, Result: res})
	}
	printSelection(e.stdout, res, kw, bf.out, *sens, *svgPath, measured)
	return nil
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

// checkSelectSplit refuses the flags of a split measurement that cannot
// go together: --shard needs a calibration store and --parts, --parts
// needs --shard.
func checkSelectSplit(sp shard.Spec, data, parts string) error {
	switch {
	case sp.Count > 0 && data != "":
		return usageErrorf("--shard splits a measurement from a calibration store (--calib); the sequential builds of --data stay on one machine")
	case sp.Count > 0 && parts == "":
		return usageErrorf("--shard %s needs --parts DIR, where the workers write the measurement", sp)
	case sp.Count == 0 && parts != "":
		return usageErrorf("--parts is for the workers of a split measurement (--shard i/N)")
	}
	return nil
}

// measureShard runs one worker's share of a split measurement and
// reports it.
func measureShard(ctx context.Context, e *env, mopt selection.MeasureOptions, skel *selection.Sensitivity, so selection.ShardOptions, asJSON bool) error {
	rep, err := selection.MeasureShard(ctx, mopt, skel, so)
	if errors.Is(err, build.ErrSyntheticCalibration) {
		return usageErrorf("%v (pass --allow-synthetic-calibration to use it anyway)", err)
	}
	if err != nil {
		return err
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
