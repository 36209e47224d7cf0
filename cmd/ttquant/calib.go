package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/quant"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

func init() {
	register(&command{name: "calib", summary: "calibration stores: stats, synth (synthetic store), quantize (one MoE layer, GPTQ vs RTN)", run: runCalib})
}

const calibUsage = `usage: ttquant calib <subcommand> [flags] [args]

subcommands:
  stats STORE [--model DIR] [--deep] [--json]
                                           check every shard; tokens per layer and site; with the model, tokens routed to each expert
  build --model DIR --data SPEC --out STORE [--sequences 128 --seq-len 2048]
                                           run the model over calibration text and store every layer's sites
  synth --model DIR --out STORE [flags]    write a deterministic synthetic store for the model's config
  quantize --model DIR --store STORE [--layers all|N,M,...] [flags]
                                           quantize MoE layers' experts and report held-out GPTQ vs RTN error per layer`

func runCalib(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(e.stderr, calibUsage)
		return &statusError{status: exitUsage}
	}
	switch args[0] {
	case "stats":
		return runCalibStats(ctx, e, args[1:])
	case "build":
		return runCalibBuild(ctx, e, args[1:])
	case "synth":
		return runCalibSynth(ctx, e, args[1:])
	case "quantize":
		return runCalibQuantize(ctx, e, args[1:])
	case "-h", "--help", "help":
		fmt.Fprintln(e.stdout, calibUsage)
		return nil
	}
	fmt.Fprintln(e.stderr, calibUsage)
	return usageErrorf("unknown calib subcommand %q", args[0])
}

// openCalibModel opens a checkpoint directory and reads its config.json.
func openCalibModel(dir string) (*safetensors.Model, *model.Config, error) {
	cfg, err := model.ReadConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		return nil, nil, err
	}
	return m, cfg, nil
}

// calibStatsDoc is the --json document of calib stats.
type calibStatsDoc struct {
	SchemaVersion int    `json:"schema_version"`
	Store         string `json:"store"`
	*calib.StoreStats
}

func runCalibStats(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "calib stats", "STORE [--model DIR] [--deep] [--json]")
	deep := fs.Bool("deep", false, "also read every stored row and check that it decodes to finite values")
	modelDir := fs.String("model", "", "model checkpoint directory: also report tokens routed to each expert")
	minFrac := fs.Float64("min-fraction", calib.DefaultMinTokensFraction, "starved-expert threshold as a fraction of the layer's tokens")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("calib stats needs exactly one STORE argument, got %d", len(pos))
	}
	if *minFrac <= 0 || *minFrac > 1 {
		return usageErrorf("--min-fraction %g outside (0, 1]", *minFrac)
	}
	st, err := calib.OpenStore(pos[0])
	if err != nil {
		return err
	}
	if err := st.Check(ctx, *deep); err != nil {
		return err
	}
	var m *safetensors.Model
	var cfg *model.Config
	if *modelDir != "" {
		if m, cfg, err = openCalibModel(*modelDir); err != nil {
			return err
		}
		defer m.Close()
	}
	stats, err := calib.ComputeStoreStats(st, m, cfg, *minFrac)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, calibStatsDoc{SchemaVersion: schemaVersion, Store: pos[0], StoreStats: stats})
	}
	p := stats.Provenance
	fmt.Fprintf(e.stdout, "store %s\nmodel %q revision %q: %d sequences, %d tokens, token ids sha256 %s\n",
		pos[0], p.Model, p.Revision, p.Sequences, p.Tokens, p.TokenIDsSHA256)
	fmt.Fprintf(e.stdout, "\n%5s  %-22s %6s %10s %5s %6s %12s\n", "layer", "site", "cols", "tokens", "dtype", "shards", "bytes")
	for _, s := range stats.Sites {
		fmt.Fprintf(e.stdout, "%5d  %-22s %6d %10d %5s %6d %12d\n", s.Layer, s.Site, s.Cols, s.Tokens, s.DType, s.Shards, s.Bytes)
	}
	for _, r := range stats.Routing {
		fmt.Fprintf(e.stdout, "\nlayer %d routing: %d tokens × top-%d; per expert min %d, mean %.1f, max %d; starved (< %d tokens): %s\n",
			r.Layer, r.Tokens, r.TopK, r.Min, r.Mean, r.Max, r.MinTokens, calibIntList(r.Starved))
		fmt.Fprintln(e.stdout, calibHistogram(r.Counts))
	}
	return nil
}

func calibIntList(v []int) string {
	if len(v) == 0 {
		return "none"
	}
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, " ")
}

// calibHistogram prints a few buckets of the per-expert token counts.
func calibHistogram(counts []int64) string {
	if len(counts) == 0 {
		return ""
	}
	sorted := append([]int64(nil), counts...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	lo, hi := sorted[0], sorted[len(sorted)-1]
	const buckets = 8
	width := max((hi-lo+buckets)/buckets, 1)
	n := make([]int, buckets)
	for _, c := range counts {
		n[min(int((c-lo)/width), buckets-1)]++
	}
	var b strings.Builder
	for i, k := range n {
		if k == 0 {
			continue
		}
		a := lo + int64(i)*width
		fmt.Fprintf(&b, "  tokens %7d..%-7d %4d experts %s\n", a, a+width-1, k, strings.Repeat("#", min(k, 60)))
	}
	return strings.TrimRight(b.String(), "\n")
}

func runCalibSynth(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "calib synth", "--model DIR --out STORE [flags]")
	modelDir := fs.String("model", "", "model checkpoint directory (its config.json decides layers and widths)")
	out := fs.String("out", "", "store directory to create")
	seqs := fs.Int("sequences", 16, "number of sequences")
	seqLen := fs.Int("seq-len", 256, "tokens per sequence")
	seed := fs.Uint64("seed", 0, "generator seed")
	dtype := fs.String("dtype", "BF16", "stored dtype: BF16 or F32")
	name := fs.String("name", "synthetic", "model name recorded in the provenance")
	asJSON := fs.Bool("json", false, "print the resulting store statistics as JSON")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *modelDir == "" || *out == "" {
		return usageErrorf("--model and --out are required")
	}
	if err := inRange("sequences", int64(*seqs), 1, math.MaxInt32); err != nil {
		return err
	}
	if err := inRange("seq-len", int64(*seqLen), 1, math.MaxInt32); err != nil {
		return err
	}
	dt, err := safetensors.ParseDType(*dtype)
	if err != nil || (dt != safetensors.BF16 && dt != safetensors.F32) {
		return usageErrorf("--dtype %q: want BF16 or F32", *dtype)
	}
	cfg, err := model.ReadConfig(*modelDir)
	if err != nil {
		return err
	}
	e.log.Info("writing synthetic calibration store", "out", *out, "layers", cfg.NumLayers(), "tokens", *seqs**seqLen)
	st, err := calib.SynthesizeStore(*out, cfg, calib.SynthStoreOptions{Sequences: *seqs, SeqLen: *seqLen, Seed: *seed,
		Model: *name, Store: calib.StoreOptions{DType: dt}})
	if err != nil {
		return err
	}
	stats, err := calib.ComputeStoreStats(st, nil, nil, 0)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, calibStatsDoc{SchemaVersion: schemaVersion, Store: *out, StoreStats: stats})
	}
	fmt.Fprintf(e.stdout, "wrote %s: %d sites, %d sequences × %d tokens\n", *out, len(stats.Sites), *seqs, *seqLen)
	return nil
}

// calibQuantizeDoc is the --json document of calib quantize.
type calibQuantizeDoc struct {
	SchemaVersion int                `json:"schema_version"`
	Layers        []calibLayerReport `json:"layers"`
}

type calibLayerReport struct {
	Layer int `json:"layer"`
	*calib.LayerReport
}

// parseLayerList parses "all" or a comma-separated list of layer indices.
func parseLayerList(s string, n int) ([]int, error) {
	if s == "all" {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	var out []int
	seen := map[int]bool{}
	for _, f := range strings.Split(s, ",") {
		var v int
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d", &v); err != nil || fmt.Sprint(v) != strings.TrimSpace(f) {
			return nil, fmt.Errorf("--layers: %q is not a layer index", f)
		}
		if v < 0 || v >= n {
			return nil, fmt.Errorf("--layers: layer %d outside 0..%d", v, n-1)
		}
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out, nil
}

func runCalibQuantize(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "calib quantize", "--model DIR --store STORE [--layers all|N,M,...] [flags]")
	modelDir := fs.String("model", "", "model checkpoint directory")
	store := fs.String("store", "", "calibration store")
	layers := fs.String("layers", "all", "layers whose MoE blocks are quantized: all, or a comma-separated list of indices (MTP layers follow the trunk layers)")
	format := fs.String("format", "BFP4_b", "expert format: BFP4_b, BFP8_b or BFP2_b")
	axis := fs.String("axis", string(plan.PresetAxis), "BFP block axis: output (packed [in, out], the layout tt-metal's linear reads; the presets' axis) or input (packed [out, in])")
	method := fs.String("method", "gptq", "gptq or rtn")
	starved := fs.String("starved", "rtn", "starved-expert policy: rtn, identity or all-tokens")
	minTokens := fs.Int("min-tokens", 0, "starvation threshold in routed tokens (0: 0.5% of the calibration tokens; -1: only experts without tokens)")
	heldOut := fs.Int("held-out", 2, "trailing sequences held out for the block-error measurement")
	workers := addWorkersFlag(fs, "experts quantized")
	gf := addGPTQFlags(fs)
	exponent := addExponentFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON, with per-expert statistics")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *modelDir == "" || *store == "" {
		return usageErrorf("--model and --store are required")
	}
	opt, err := layerOptions(*format, *axis, *method, *starved)
	if err != nil {
		return err
	}
	opt.MinTokens, opt.Workers = *minTokens, *workers
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	if err := inRange("min-tokens", int64(*minTokens), -1, math.MaxInt32); err != nil {
		return err
	}
	if err := inRange("held-out", int64(*heldOut), 0, math.MaxInt32); err != nil {
		return err
	}
	g, err := gf.options()
	if err != nil {
		return err
	}
	if g.Exponent, err = exponentRule(*exponent); err != nil {
		return err
	}
	opt.GPTQ = &g
	if err := opt.Validate(); err != nil {
		return usageErrorf("%v", err)
	}
	m, cfg, err := openCalibModel(*modelDir)
	if err != nil {
		return err
	}
	defer m.Close()
	st, err := calib.OpenStore(*store)
	if err != nil {
		return err
	}
	if err := st.Check(ctx, false); err != nil {
		return err
	}
	list, err := quantizeLayers(e, *modelDir, *layers, cfg, st)
	if err != nil {
		return err
	}
	doc := calibQuantizeDoc{SchemaVersion: schemaVersion, Layers: []calibLayerReport{}}
	for _, layer := range list {
		l, err := calib.LoadMoELayer(m, cfg, layer)
		if err != nil {
			return err
		}
		cal, held, err := st.LoadActivations(layer, calib.SiteMoE, *heldOut)
		if err != nil {
			return err
		}
		e.log.Info("quantizing MoE layer", "layer", layer, "experts", cfg.MoE().Experts, "calibration_tokens", cal.Tokens, "held_out_tokens", held.Tokens)
		rep, err := calib.QuantizeMoELayer(ctx, l, cal, held, opt, nil)
		if err != nil {
			return fmt.Errorf("layer %d: %w", layer, err)
		}
		doc.Layers = append(doc.Layers, calibLayerReport{Layer: layer, LayerReport: rep})
		if *asJSON {
			continue
		}
		fmt.Fprintf(e.stdout, "layer %d: %s %s-axis, method %s, %d calibration tokens, minimum %d per expert, starved (%s): %s\n",
			layer, rep.Format, rep.Axis, rep.Method, rep.Tokens, rep.MinTokens, rep.Policy, calibIntList(rep.Starved))
		if h := rep.HeldOut; h != nil {
			fmt.Fprintf(e.stdout, "  held-out MoE block output MSE over %d tokens: %s %.6g, RTN %.6g, ratio %.3f (output mean square %.6g)\n",
				h.Tokens, rep.Method, h.MSE, h.RTNMSE, h.Ratio, h.RefMeanSquare)
		}
	}
	if *asJSON {
		return writeJSON(e.stdout, doc)
	}
	return nil
}

// layerOptions parses the format, axis, method and starved-expert policy
// of calib quantize.
func layerOptions(format, axis, method, starved string) (calib.LayerOptions, error) {
	var opt calib.LayerOptions
	var err error
	if opt.Format, err = bfp.ParseFormat(format); err != nil {
		return opt, usageErrorf("--format: %v", err)
	}
	if opt.Axis, err = bfp.ParseAxis(axis); err != nil {
		return opt, usageErrorf("--axis: %v", err)
	}
	if opt.Method, err = quant.ParseMethod(method); err != nil {
		return opt, usageErrorf("--method: %v", err)
	}
	if opt.Starved, err = calib.ParseStarvedPolicy(starved); err != nil {
		return opt, usageErrorf("--starved: %v", err)
	}
	return opt, nil
}

// quantizeLayers is the --layers list of calib quantize: MoE layers only.
// A store built from text has no MTP-layer sites, so "all" means every
// layer with MoE inputs in the store; a layer named explicitly must have
// an MoE block.
func quantizeLayers(e *env, modelDir, layers string, cfg *model.Config, st *calib.Store) ([]int, error) {
	list, err := parseLayerList(layers, cfg.NumLayers())
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	if !cfg.HasMoE() {
		return nil, fmt.Errorf("%s is a dense %s model without MoE blocks: calib quantize quantizes routed experts (gptq --calib quantizes dense layers)", modelDir, cfg.ModelType)
	}
	if layers == "all" {
		kept := list[:0]
		for _, l := range list {
			if !cfg.IsMoE(l) {
				e.log.Info("skipping dense layer (no MoE block)", "layer", l)
			} else if _, ok := st.Site(l, calib.SiteMoE); ok {
				kept = append(kept, l)
			} else {
				e.log.Info("skipping layer without MoE inputs in the store", "layer", l)
			}
		}
		list = kept
	}
	for _, l := range list {
		if !cfg.IsMoE(l) {
			return nil, fmt.Errorf("layer %d has a dense MLP, not an MoE block: calib quantize quantizes routed experts (use gptq --calib for dense layers)", l)
		}
	}
	return list, nil
}
