package manifest

import (
	"context"
	"fmt"
	"github.com/ttquant/ttquant/internal/model"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/testmodel"
)

// DemoOptions configure Demo.
type DemoOptions struct {
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
	Dir      string        `json:"dir,omitempty"`
	Identity string        `json:"identity"`
	CacheKey string        `json:"cache_key"`
	Files    int           `json:"files"`
	Tensors  int           `json:"tensors"`
	Bytes    int64         `json:"bytes"`
	Layers   []DemoLayer   `json:"layers"`
	Verify   *VerifyReport `json:"verify"`
	// Fallbacks lists GPTQ matrices that were rounded to nearest, with why.
	Fallbacks []MatrixStats `json:"fallbacks,omitempty"`
}

// Demo runs the main job end to end on the built-in tiny Qwen3.6-MoE model:
// it writes the model and a synthetic calibration store into a scratch
// directory, plans with the qwen36-35b-a3b preset, quantizes the routed
// experts with GPTQ and the other quantized tensors with round-to-nearest,
// writes the native checkpoint, verifies it against the source and reports
// per layer the held-out block error of GPTQ and of RTN.
func Demo(ctx context.Context, opt DemoOptions) (*DemoResult, error) {
	if opt.Sequences == 0 {
		opt.Sequences = 16
	}
	if opt.SeqLen == 0 {
		opt.SeqLen = 128
	}
	if opt.HeldOut == 0 {
		opt.HeldOut = 4
	}
	if opt.Workers <= 0 {
		opt.Workers = 1
	}
	scratch, err := os.MkdirTemp("", "ttquant-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	out := opt.Out
	if out == "" {
		out = filepath.Join(scratch, "checkpoint")
	}
	src := filepath.Join(scratch, "model")
	if err := testmodel.Write(src, testmodel.Tiny(), testmodel.Default); err != nil {
		return nil, fmt.Errorf("writing the tiny model: %w", err)
	}
	mc, err := model.ReadConfig(src)
	if err != nil {
		return nil, err
	}
	storeDir := filepath.Join(scratch, "calibration")
	if _, err := calib.SynthesizeStore(storeDir, mc, calib.SynthStoreOptions{Sequences: opt.Sequences, SeqLen: opt.SeqLen, Model: "ttquant tiny demo"}); err != nil {
		return nil, fmt.Errorf("writing the synthetic calibration store: %w", err)
	}
	plan, err := Preset(PresetQwen36MoE)
	if err != nil {
		return nil, err
	}
	res, err := GPTQ(ctx, BuildOptions{
		Source:           src,
		Out:              out,
		Plan:             plan,
		Workers:          opt.Workers,
		Progress:         opt.Progress,
		Calib:            storeDir,
		Layers:           "experts",
		HeldOutSequences: opt.HeldOut,
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
