package selection

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/manifest/plan"
)

// RunOptions say what Run selects: the measurement's inputs, the
// selection's own options, and the sensitivity file.
type RunOptions struct {
	// Measure are the measurement's inputs; the selection is of its
	// source, base plan and candidates (and family). With Measure.Weights
	// the selection uses the measured weights instead of Weights.
	Measure   MeasureOptions
	Overrides *plan.Plan
	Budget    Budget
	Weights   Weights
	// SensitivityFile is read when it exists (no measurement) and refused
	// when it was measured on other inputs (Sensitivity.Check); a file
	// without weights measured as Measure.Weights asks is measured again.
	// A measurement is written there once the selection succeeds.
	SensitivityFile string
	// ScratchIn is the directory the measurement builds' scratch
	// directory is made in, and removed from after the measurement
	// (empty: the system's temporary directory).
	ScratchIn string
	// Shard and Parts make the run one worker of a measurement split
	// across workers, sharing the directory Parts (RunShard); CheckSplit
	// says which go together. Run is no worker.
	Shard shard.Spec
	Parts string
	// Log receives one line per step.
	Log func(msg string)
}

// RunResult is what Run chose, and from which sensitivities.
type RunResult struct {
	*Result
	Sensitivity *Sensitivity
	// Measured says whether the sensitivities were measured (and written
	// to the sensitivity file) rather than read from it.
	Measured bool
}

// Run selects a plan for the budget from the sensitivities of the
// sensitivity file, or measures them first. Every refusal that needs no
// measurement (a sensitivity file of other inputs, a byte or
// bits-per-weight budget outside the achievable range, an override
// splitting a unit) comes before the measurement starts.
func Run(ctx context.Context, opt RunOptions) (*RunResult, error) {
	if err := opt.checkSplit(); err != nil {
		return nil, err
	}
	if opt.Shard.Count > 0 {
		return nil, fmt.Errorf("selection: worker %s of a split measurement selects nothing (RunShard runs it)", opt.Shard)
	}
	s, err := opt.savedSensitivity(ctx)
	if err != nil {
		return nil, err
	}
	measured := s == nil
	if measured {
		if s, err = opt.measure(ctx); err != nil {
			return nil, err
		}
	}
	sopt := opt.selectOptions(s)
	if opt.Measure.Weights != nil {
		sopt.Weights = s.KL.Weights()
	}
	res, err := Select(sopt)
	if err != nil {
		return nil, err
	}
	if measured {
		if err := s.Save(opt.SensitivityFile); err != nil {
			return nil, err
		}
	}
	return &RunResult{Result: res, Sensitivity: s, Measured: measured}, nil
}

// RunShard runs worker opt.Shard's share of the measurement Run would
// make (MeasureShard), in the directory opt.Parts; the assembly
// (AssembleMeasurement) writes the sensitivity file once every worker has
// finished. The same refusals as Run's come before the measurement
// starts. It returns nil when the sensitivity file already holds this
// measurement: there is nothing to measure.
func RunShard(ctx context.Context, opt RunOptions) (*ShardReport, error) {
	if err := opt.checkSplit(); err != nil {
		return nil, err
	}
	if opt.Shard.Count == 0 {
		return nil, errors.New("selection: RunShard needs a worker (RunOptions.Shard)")
	}
	s, err := opt.savedSensitivity(ctx)
	if err != nil || s != nil {
		return nil, err
	}
	skel, err := opt.prepare()
	if err != nil {
		return nil, err
	}
	return MeasureShard(ctx, opt.Measure, skel, ShardOptions{Spec: opt.Shard, Dir: opt.Parts, SensitivityFile: opt.SensitivityFile})
}

// checkSplit checks the split options by CheckSplit.
func (opt *RunOptions) checkSplit() error {
	return CheckSplit(opt.Shard, opt.Measure.Data != nil, opt.Parts)
}

// selectOptions are the options of Select from the sensitivities s.
func (opt *RunOptions) selectOptions(s *Sensitivity) Options {
	m := &opt.Measure
	return Options{Sensitivity: s, Source: m.Source, Base: m.Base, Overrides: opt.Overrides, Candidates: m.Candidates,
		Budget: opt.Budget, Weights: opt.Weights, Family: m.Family}
}

func (opt *RunOptions) log(format string, args ...any) {
	if opt.Log != nil {
		opt.Log(fmt.Sprintf(format, args...))
	}
}

// savedSensitivity reads the sensitivity file and checks it against the
// inputs: nil when there is none, or it holds no weights measured as
// asked.
func (opt *RunOptions) savedSensitivity(ctx context.Context) (*Sensitivity, error) {
	path := opt.SensitivityFile
	if _, err := os.Stat(path); err != nil {
		return nil, nil
	}
	s, err := LoadSensitivity(path)
	if err != nil {
		return nil, err
	}
	m := &opt.Measure
	modelID, err := ModelIdentity(m.Source)
	if err != nil {
		return nil, err
	}
	m.SourceIdentity = modelID // a new measurement does not hash the model again
	storeID, err := CalibrationIdentity(ctx, *m)
	if err != nil {
		return nil, err
	}
	if err := s.Check(modelID, storeID, m.Base, m.ExpertsPerFile); err != nil {
		return nil, err
	}
	if w := m.Weights; w != nil && !s.KL.Matches(w) {
		opt.log("%s holds no weights measured as asked (mode %s, %d × %d tokens): measuring again", path, w.Mode, w.Sequences, w.SeqLen)
		return nil, nil
	}
	return s, nil
}

// prepare is the measurement's skeleton (Prepare), once the budget is
// known to be achievable (a budget in bytes per token needs the measured
// routing).
func (opt *RunOptions) prepare() (*Sensitivity, error) {
	skel, err := Prepare(opt.Measure)
	if err != nil {
		return nil, err
	}
	if opt.Budget.Kind != BudgetTokenBytes {
		if err := CheckBudget(opt.selectOptions(skel)); err != nil {
			return nil, err
		}
	}
	return skel, nil
}

// measure measures the sensitivities in a scratch directory of its own.
func (opt *RunOptions) measure(ctx context.Context) (*Sensitivity, error) {
	skel, err := opt.prepare()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(opt.ScratchIn, ".select-measure-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	mopt := opt.Measure
	mopt.Scratch = tmp
	opt.log("measuring %d matrices (one store build per format: %v)", len(skel.Tensors), skel.Measured)
	return MeasurePrepared(ctx, mopt, skel)
}
