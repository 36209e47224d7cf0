package build

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
)

// DemoOptions configure Demo.
type DemoOptions struct {
	// Source is the model to run on (required): a Qwen-family MoE
	// checkpoint directory. The command line writes the built-in tiny
	// Qwen3.6-MoE model there.
	Source string
	// Out is the checkpoint directory; empty means a temporary directory
	// that Demo removes before returning.
	Out string
	// Workers is the number of workers (default 1); the checkpoint does
	// not depend on it.
	Workers int
	// Progress receives build progress events, as in BuildOptions.
	Progress func(ProgressEvent)
	// Sequences and SeqLen size the synthetic calibration set (defaults 16
	// and 128); HeldOut is the number of its final sequences kept for the
	// held-out error (default 4).
	Sequences, SeqLen, HeldOut int
}

// DemoLayer is one row of the demo's table: a layer's held-out MoE block
// error with the GPTQ experts and with round-to-nearest ones, relative to
// the mean square of the block's output.
type DemoLayer struct {
	Layer         int     `json:"layer"`
	CalibTokens   int64   `json:"calib_tokens"`
	HeldOutTokens int64   `json:"held_out_tokens"`
	GPTQRelErr    float64 `json:"gptq_rel_mse"`
	RTNRelErr     float64 `json:"rtn_rel_mse"`
	Ratio         float64 `json:"ratio"`
	Starved       int     `json:"starved_experts"`
}

// DemoResult is what Demo did.
type DemoResult struct {
	Dir      string                 `json:"dir,omitempty"`
	Identity string                 `json:"identity"`
	CacheKey string                 `json:"cache_key"`
	Files    int                    `json:"files"`
	Tensors  int                    `json:"tensors"`
	Bytes    int64                  `json:"bytes"`
	Layers   []DemoLayer            `json:"layers"`
	Verify   *manifest.VerifyReport `json:"verify"`
	// Fallbacks lists GPTQ matrices that were rounded to nearest, with why.
	Fallbacks []manifest.MatrixStats `json:"fallbacks,omitempty"`
}

// Validate reports the first option out of range, after defaults.
func (o DemoOptions) Validate() error {
	o.defaults()
	switch {
	case o.Source == "":
		return fmt.Errorf("demo: no source model")
	case o.Workers < 0:
		return fmt.Errorf("demo: workers %d: want at least 1 (0 for the default)", o.Workers)
	case o.Sequences < 2:
		return fmt.Errorf("demo: sequences %d: want at least 2", o.Sequences)
	case o.SeqLen < 1:
		return fmt.Errorf("demo: sequence length %d: want at least 1", o.SeqLen)
	case o.HeldOut < 1 || o.HeldOut >= o.Sequences:
		return fmt.Errorf("demo: held-out sequences %d: want 1 to %d (fewer than the sequences)", o.HeldOut, o.Sequences-1)
	}
	return nil
}

func (o *DemoOptions) defaults() {
	if o.Sequences == 0 {
		o.Sequences = 16
	}
	if o.SeqLen == 0 {
		o.SeqLen = 128
	}
	if o.HeldOut == 0 {
		o.HeldOut = 4
	}
	if o.Workers == 0 {
		o.Workers = 1
	}
}

// Demo runs the main job end to end on a small MoE model (the command line
// gives it the built-in tiny Qwen3.6-MoE model): it writes a synthetic
// calibration store into a scratch directory, plans with the qwen36-35b-a3b preset, quantizes the routed
// experts with GPTQ and the other quantized tensors with round-to-nearest,
// writes the native checkpoint, verifies it against the source and reports
// per layer the held-out block error of GPTQ and of RTN.
func Demo(ctx context.Context, opt DemoOptions) (*DemoResult, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	opt.defaults()
	scratch, err := os.MkdirTemp("", "ttquant-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	out := opt.Out
	if out == "" {
		out = filepath.Join(scratch, "checkpoint")
	}
	src := opt.Source
	mc, err := model.ReadConfig(src)
	if err != nil {
		return nil, err
	}
	storeDir := filepath.Join(scratch, "calibration")
	if _, err := calib.SynthesizeStore(storeDir, mc, calib.SynthStoreOptions{Sequences: opt.Sequences, SeqLen: opt.SeqLen, Model: "ttquant tiny demo"}); err != nil {
		return nil, fmt.Errorf("writing the synthetic calibration store: %w", err)
	}
	p, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		return nil, err
	}
	res, err := GPTQ(ctx, BuildOptions{
		Source:   src,
		Out:      out,
		Plan:     p,
		Workers:  opt.Workers,
		Progress: opt.Progress,
		Calib:    storeDir,
		// The demo's model has random weights: synthetic activations are
		// all it has.
		AllowSyntheticCalibration: true,
		Layers:                    "experts",
		HeldOutSequences:          opt.HeldOut,
	})
	if err != nil {
		return nil, err
	}
	rep, err := Verify(ctx, out, VerifyOptions{Source: src, Workers: opt.Workers})
	if err != nil {
		return nil, err
	}
	dr := &DemoResult{Dir: opt.Out, Identity: res.Identity, CacheKey: res.CacheKey, Files: res.Files, Tensors: res.Tensors, Bytes: res.Bytes, Verify: rep}
	for _, l := range res.Manifest.TTQuant.Layers {
		if l.HeldOutTokens == 0 {
			continue
		}
		dl := DemoLayer{Layer: l.Layer, CalibTokens: l.CalibTokens, HeldOutTokens: l.HeldOutTokens, Starved: len(l.Starved)}
		if l.RefMeanSquare > 0 {
			dl.GPTQRelErr = l.HeldOutMSE / l.RefMeanSquare
			dl.RTNRelErr = l.HeldOutRTNMSE / l.RefMeanSquare
		}
		if l.HeldOutRTNMSE > 0 {
			dl.Ratio = l.HeldOutMSE / l.HeldOutRTNMSE
		}
		dr.Layers = append(dr.Layers, dl)
	}
	for _, m := range res.Manifest.TTQuant.Matrices {
		if m.Fallback != "" {
			dr.Fallbacks = append(dr.Fallbacks, m)
		}
	}
	return dr, nil
}
