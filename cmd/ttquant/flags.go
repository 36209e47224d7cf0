package main

import (
	"errors"
	"flag"
	"math"
	"os"
	"runtime"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/manifest/plan"
)

// inRange is a usage error naming the flag and the accepted range unless
// lo ≤ v ≤ hi.
func inRange(flagName string, v, lo, hi int64) error {
	if v >= lo && v <= hi {
		return nil
	}
	if hi == math.MaxInt64 {
		return usageErrorf("--%s %d is out of range: want at least %d", flagName, v, lo)
	}
	return usageErrorf("--%s %d is out of range: want %d to %d", flagName, v, lo, hi)
}

// inRangeFloat is inRange for a float flag; NaN is never in range.
func inRangeFloat(flagName string, v, lo, hi float64) error {
	if v >= lo && v <= hi {
		return nil
	}
	return usageErrorf("--%s %g is out of range: want %g to %g", flagName, v, lo, hi)
}

// maxWorkers bounds every --workers flag: far more goroutines than any
// machine has cores is a typo.
const maxWorkers = 1 << 12

// addWorkersFlag defines --workers, the same in every command that runs
// work in parallel: default one per CPU, range 1 to maxWorkers, results
// independent of it. what says what runs at once.
func addWorkersFlag(fs *flag.FlagSet, what string) *int {
	return fs.Int("workers", runtime.NumCPU(), what+" at once (1 to 4096); the results do not depend on it")
}

// checkWorkers is the range check of --workers.
func checkWorkers(n int) error { return inRange("workers", int64(n), 1, maxWorkers) }

// gptqFlags are the GPTQ solver flags, the same in every command that runs
// the solver (gptq, calib quantize).
type gptqFlags struct {
	blockSize             int
	percDamp              float64
	actOrder, f64, noLoss bool
}

func addGPTQFlags(fs *flag.FlagSet) *gptqFlags {
	def := gptq.DefaultOptions()
	g := &gptqFlags{}
	fs.IntVar(&g.blockSize, "block-size", def.BlockSize, "GPTQ lazy-update block size (1 to 65536)")
	fs.Float64Var(&g.percDamp, "percdamp", def.PercDamp, "GPTQ damping, as a fraction of the mean Hessian diagonal (0 to 1)")
	fs.BoolVar(&g.actOrder, "act-order", false, "process columns in order of decreasing Hessian diagonal")
	fs.BoolVar(&g.f64, "float64", false, "run the solver in float64")
	fs.BoolVar(&g.noLoss, "no-proxy-loss", false, "skip each matrix's proxy losses of GPTQ and of rounding (recorded as 0); rounding's costs about a fifth of the GPTQ time")
	return g
}

// options checks the flags' ranges (a usage error naming the flag) and
// returns the solver options.
func (g *gptqFlags) options() (gptq.Options, error) {
	if err := inRange("block-size", int64(g.blockSize), 1, gptq.MaxBlockSize); err != nil {
		return gptq.Options{}, err
	}
	if err := inRangeFloat("percdamp", g.percDamp, 0, gptq.MaxPercDamp); err != nil {
		return gptq.Options{}, err
	}
	o := gptq.DefaultOptions()
	o.BlockSize, o.PercDamp, o.ActOrder, o.Float64 = g.blockSize, g.percDamp, g.actOrder, g.f64
	o.NoProxyLoss = g.noLoss
	if err := o.Validate(); err != nil {
		return gptq.Options{}, usageErrorf("%v", err)
	}
	return o, nil
}

// addExponentFlag defines --bfp-exponent, the same in every command that
// quantizes to BFP: the rule choosing each block's shared exponent, in
// GPTQ and in rounding.
func addExponentFlag(fs *flag.FlagSet) *string {
	return fs.String("bfp-exponent", gptq.ExpMax.String(), "rule choosing each BFP block's shared exponent, in GPTQ and rounding: max (the largest magnitude's, as the packer), ttmetal (E_max or E_max-1 by unweighted squared error, tt-metal's optional rule) or search (E_max, E_max-1 or, for BFP4_b/BFP2_b, E_max-2 by the quantizer's weighted error; docs/gptq.md)")
}

// exponentRule parses --bfp-exponent (a usage error naming the flag).
func exponentRule(s string) (gptq.ExponentRule, error) {
	r, err := gptq.ParseExponentRule(s)
	if err != nil {
		return 0, usageErrorf("--bfp-exponent: %v", err)
	}
	return r, nil
}

// planFlags are --preset, --plan and --axis, the same in every command that
// takes a precision plan (convert, gptq, plan).
type planFlags struct{ preset, file, axis string }

func addPlanFlags(fs *flag.FlagSet) *planFlags {
	p := &planFlags{}
	fs.StringVar(&p.preset, "preset", "", "built-in plan: "+strings.Join(plan.PresetNames(), ", ")+" (default "+plan.PresetQwen36MoE+" unless --plan is given)")
	fs.StringVar(&p.file, "plan", "", "precision plan JSON file")
	fs.StringVar(&p.axis, "axis", "", "BFP block axis of every BFP rule of the plan: output (packed [in, out], the layout tt-metal's linear reads; the presets' axis) or input (packed [out, in]); default: as the plan says")
	return p
}

// load returns the plan the flags name, with --axis applied. A bad
// --axis, both --preset and --plan, an unknown preset and --axis with a
// plan without BFP rules are usage errors; a plan file that does not load
// is an error.
func (p *planFlags) load() (*plan.Plan, error) {
	if p.preset != "" && p.file != "" {
		return nil, usageErrorf("give --preset or --plan, not both")
	}
	var axis bfp.Axis
	if p.axis != "" {
		a, err := bfp.ParseAxis(p.axis)
		if err != nil {
			return nil, usageErrorf("--axis: %v", err)
		}
		axis = a
	}
	var pl *plan.Plan
	var err error
	if p.file != "" {
		pl, err = plan.LoadPlan(p.file)
	} else {
		name := p.preset
		if name == "" {
			name = plan.PresetQwen36MoE
		}
		if pl, err = plan.Preset(name); errors.Is(err, plan.ErrUnknownPreset) {
			return nil, usageErrorf("--preset: %v", err)
		}
	}
	if err != nil || axis == "" {
		return pl, err
	}
	if pl, err = pl.WithAxis(axis); err != nil {
		return nil, usageErrorf("--axis: %v", err)
	}
	return pl, nil
}

// isSHA256 reports whether s is a sha256 in lowercase hex.
func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// shardFlags are --shard and --shard-count, the same in every command whose
// work splits across processes (convert, gptq --calib, eval).
type shardFlags struct {
	value string
	count int
}

// merge says how the workers' results are joined, for the help text.
func addShardFlags(fs *flag.FlagSet, merge string) *shardFlags {
	s := &shardFlags{}
	fs.StringVar(&s.value, "shard", "", "run one worker of a split run: i/N (worker i of N, from 0), or auto (from SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT, or JOB_COMPLETION_INDEX with --shard-count or TTQUANT_SHARD_COUNT); then "+merge+" (docs/distributed.md)")
	fs.IntVar(&s.count, "shard-count", 0, "with --shard auto under a Kubernetes Indexed Job: the number of workers (the job's completions)")
	return s
}

// spec returns the worker the flags name (the zero Spec without --shard).
func (s *shardFlags) spec() (shard.Spec, error) {
	switch {
	case s.value == "" && s.count != 0:
		return shard.Spec{}, usageErrorf("--shard-count applies to --shard auto only")
	case s.value == "":
		return shard.Spec{}, nil
	case s.count != 0 && s.value != "auto":
		return shard.Spec{}, usageErrorf("--shard-count applies to --shard auto only (--shard %s names its count)", s.value)
	}
	if err := inRange("shard-count", int64(s.count), 0, shard.MaxCount); err != nil {
		return shard.Spec{}, err
	}
	sp, err := shard.Parse(s.value, s.count, os.Getenv)
	if err != nil {
		return shard.Spec{}, usageErrorf("--shard: %v", err)
	}
	return sp, nil
}
