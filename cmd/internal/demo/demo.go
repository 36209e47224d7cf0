// Package demo runs the main job end to end on the built-in model
// (internal/model/builtin: the trained tiny Qwen3.6-MoE and its text):
// sequential GPTQ (asymmetric fit) from the calibration text with the qwen36-35b-a3b
// preset (routed and shared experts BFP4_b with GPTQ, the rest BFP8_b),
// the same plan rounded to nearest for comparison, both checkpoints
// verified against the source, and the quality table of both against the
// BF16 model on held-back evaluation text. `ttquant demo` prints it.
package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/emulator/eval/harness"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/model/builtin"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
)

// Options configure Run. Zero values select the defaults given per field.
type Options struct {
	// Out keeps the model and the checkpoints (Out/model, Out/gptq,
	// Out/rtn); empty means a temporary directory removed before Run
	// returns.
	Out string
	// Workers (default 1); the checkpoints and the table do not depend on
	// it.
	Workers int
	// Tool identifies the program recorded in the checkpoints' manifests
	// (build.BuildOptions.Tool).
	Tool manifest.ToolInfo
	// Progress receives the command's progress (one measure, one ETA for
	// every step); Log one line per step.
	Progress func(Progress)
	Log      func(msg string)
	// Calibration: Sequences × SeqLen tokens of the calibration text
	// (default 48 × 512), the last HeldOut sequences (default 8) kept out
	// of the Hessians to measure each layer's held-out error. Fewer make
	// GPTQ's Hessians too thin to beat rounding on this model.
	Sequences, SeqLen, HeldOut int
	// Evaluation: EvalSequences × EvalSeqLen tokens of the evaluation text
	// (default 24 × 512), text the model never saw in training.
	EvalSequences, EvalSeqLen int
}

func (o *Options) defaults() {
	set := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	set(&o.Workers, 1)
	set(&o.Sequences, 48)
	set(&o.SeqLen, 512)
	set(&o.HeldOut, 8)
	set(&o.EvalSequences, 24)
	set(&o.EvalSeqLen, 512)
}

// Validate reports the first option out of range, after defaults.
func (o Options) Validate() error {
	o.defaults()
	switch {
	case o.Workers < 1:
		return fmt.Errorf("demo: workers %d: want at least 1", o.Workers)
	case o.Sequences < 2:
		return fmt.Errorf("demo: sequences %d: want at least 2", o.Sequences)
	case o.SeqLen < 2:
		return fmt.Errorf("demo: sequence length %d: want at least 2", o.SeqLen)
	case o.HeldOut < 1 || o.HeldOut >= o.Sequences:
		return fmt.Errorf("demo: held-out sequences %d: want 1 to %d (fewer than the sequences)", o.HeldOut, o.Sequences-1)
	case o.EvalSequences < 1:
		return fmt.Errorf("demo: evaluation sequences %d: want at least 1", o.EvalSequences)
	case o.EvalSeqLen < 2:
		return fmt.Errorf("demo: evaluation sequence length %d: want at least 2", o.EvalSeqLen)
	}
	return nil
}

// Layer is one row of the per-layer table: the held-out error of the
// layer's MoE block with the GPTQ experts and with round-to-nearest ones,
// relative to the mean square of the block's output, on the same inputs
// (the stream the quantized layers before it produce), and the drift of
// the quantized model's stream from the source model's after the layer.
type Layer struct {
	Layer         int     `json:"layer"`
	CalibTokens   int64   `json:"calib_tokens"`
	HeldOutTokens int64   `json:"held_out_tokens"`
	GPTQRelErr    float64 `json:"gptq_rel_mse"`
	RTNRelErr     float64 `json:"rtn_rel_mse"`
	Ratio         float64 `json:"ratio"`
	StreamRelMSE  float64 `json:"held_out_stream_rel_mse"`
	Starved       int     `json:"starved_experts"`
}

// Checkpoint describes one checkpoint the demo built.
type Checkpoint struct {
	Label    string                 `json:"label"`
	Dir      string                 `json:"dir,omitempty"`
	Identity string                 `json:"identity"`
	CacheKey string                 `json:"cache_key"`
	Files    int                    `json:"files"`
	Tensors  int                    `json:"tensors"`
	Bytes    int64                  `json:"bytes"`
	Verify   *manifest.VerifyReport `json:"verify"`
}

// Result is what Run did.
type Result struct {
	Model       string       `json:"model"`
	Checkpoints []Checkpoint `json:"checkpoints"`
	Layers      []Layer      `json:"layers"`
	// Fallbacks lists GPTQ matrices that were rounded to nearest, with why.
	Fallbacks []manifest.MatrixStats `json:"fallbacks,omitempty"`
	// Eval is the quality table: the BF16 model against each checkpoint.
	Eval *harness.Report `json:"eval"`
	// Reading says which metric ranks the checkpoints and what it says.
	Reading string `json:"reading,omitempty"`
	// Ranked is true when GPTQ's mean KL is below RTN's with error bars
	// (± one standard error) that do not overlap.
	Ranked bool `json:"ranked"`
	// Pictures are the SVG files written into Out (none without Out):
	// the per-layer held-out errors and drift, and the evaluation.
	Pictures []string `json:"pictures,omitempty"`
}

// OK reports whether every checkpoint verified.
func (r *Result) OK() bool {
	for _, c := range r.Checkpoints {
		if c.Verify == nil || !c.Verify.OK {
			return false
		}
	}
	return true
}

func (o *Options) log(format string, args ...any) {
	if o.Log != nil {
		o.Log(fmt.Sprintf(format, args...))
	}
}

// Run runs the demo.
func Run(ctx context.Context, opt Options) (*Result, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	opt.defaults()
	root := opt.Out
	if root == "" {
		tmp, err := os.MkdirTemp("", "ttquant-demo-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		root = tmp
	}
	src, err := builtin.Write(filepath.Join(root, "model"))
	if err != nil {
		return nil, err
	}
	p, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		return nil, err
	}
	calibSpec, err := dataset.ParseSpec("calib=" + filepath.Join(src, builtin.CalibText))
	if err != nil {
		return nil, err
	}
	dopt := dataset.Options{
		Calibration:  dataset.SetOptions{Sequences: opt.Sequences, SeqLen: opt.SeqLen, Mode: dataset.ModePack},
		EvalFraction: dataset.DefaultEvalFraction, Seed: 1, Workers: opt.Workers,
	}
	res := &Result{Model: builtin.Name}
	m := newMeter(&opt)

	opt.log("sequential GPTQ, asymmetric fit: %d × %d tokens of %s, %d sequences held out", opt.Sequences, opt.SeqLen, builtin.CalibText, opt.HeldOut)
	m.begin(stepGPTQ)
	gdir := filepath.Join(root, "gptq")
	g, err := build.GPTQ(ctx, build.BuildOptions{Tool: opt.Tool, Source: src, Out: gdir, Plan: p, Workers: opt.Workers, Progress: m.build,
		Data: calibSpec, DataOptions: dopt, Layers: "experts", HeldOutSequences: opt.HeldOut, Asymmetric: true})
	if err != nil {
		return nil, fmt.Errorf("sequential GPTQ: %w", err)
	}
	opt.log("round to nearest with the same plan")
	m.begin(stepRTN)
	rdir := filepath.Join(root, "rtn")
	r, err := build.Convert(ctx, build.BuildOptions{Tool: opt.Tool, Source: src, Out: rdir, Plan: p, Workers: opt.Workers, Progress: m.build})
	if err != nil {
		return nil, fmt.Errorf("round to nearest: %w", err)
	}
	m.begin(stepVerify)
	for _, c := range []struct {
		label string
		dir   string
		b     *build.BuildResult
	}{{"RTN", rdir, r}, {"GPTQ", gdir, g}} {
		opt.log("verify %s against the source", c.label)
		rep, err := build.Verify(ctx, c.dir, build.VerifyOptions{Source: src, Workers: opt.Workers})
		if err != nil {
			return nil, err
		}
		ck := Checkpoint{Label: c.label, Identity: c.b.Identity, CacheKey: c.b.CacheKey, Files: c.b.Files, Tensors: c.b.Tensors, Bytes: c.b.Bytes, Verify: rep}
		if opt.Out != "" {
			ck.Dir = c.dir
		}
		res.Checkpoints = append(res.Checkpoints, ck)
	}
	res.Layers, res.Fallbacks = heldOut(g.Manifest)
	if !res.OK() {
		return res, nil // the caller reports the failed checks
	}

	opt.log("evaluate: %d × %d tokens of %s against the BF16 model", opt.EvalSequences, opt.EvalSeqLen, builtin.EvalText)
	m.begin(stepEval)
	evalSpec, err := dataset.ParseSpec("eval=" + filepath.Join(src, builtin.EvalText))
	if err != nil {
		return nil, err
	}
	eopt := dataset.Options{
		Evaluation: dataset.SetOptions{Sequences: opt.EvalSequences, SeqLen: opt.EvalSeqLen, Mode: dataset.ModePack},
		// Every record of the evaluation file is evaluation text.
		EvalFraction: 1, Seed: 1,
	}
	rep, err := harness.Run(ctx, harness.Options{Model: src, Checkpoints: []string{rdir, gdir}, Labels: []string{"RTN", "GPTQ"},
		// The overlap with the calibration text is checked against the
		// fingerprint the GPTQ checkpoint's manifest records.
		Data: evalSpec, DataOptions: eopt, Window: opt.EvalSeqLen, Workers: opt.Workers, Log: opt.Log, Progress: m.eval})
	if err != nil {
		return nil, fmt.Errorf("evaluation: %w", err)
	}
	m.done()
	res.Eval = rep
	res.Reading, res.Ranked = reading(rep)
	if opt.Out != "" {
		if res.Pictures, err = pictures(root, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// heldOut is the per-layer table of the GPTQ build's manifest (the layers
// with held-out tokens) and its matrices that fell back.
func heldOut(m *manifest.Manifest) (layers []Layer, fallbacks []manifest.MatrixStats) {
	for _, l := range m.TTQuant.Layers {
		if l.HeldOutTokens == 0 {
			continue
		}
		dl := Layer{Layer: l.Layer, CalibTokens: l.CalibTokens, HeldOutTokens: l.HeldOutTokens, Starved: len(l.Starved), StreamRelMSE: l.HeldOutStreamRelMSE}
		if l.RefMeanSquare > 0 {
			dl.GPTQRelErr = l.HeldOutMSE / l.RefMeanSquare
			dl.RTNRelErr = l.HeldOutRTNMSE / l.RefMeanSquare
		}
		if l.HeldOutRTNMSE > 0 {
			dl.Ratio = l.HeldOutMSE / l.HeldOutRTNMSE
		}
		layers = append(layers, dl)
	}
	for _, ms := range m.TTQuant.Matrices {
		if ms.Fallback != "" {
			fallbacks = append(fallbacks, ms)
		}
	}
	return layers, fallbacks
}

// pictures writes layers.svg (per layer: the held-out MoE block error of
// GPTQ and of RTN, and the stream's drift) and eval.svg (the evaluation)
// into dir.
func pictures(dir string, res *Result) ([]string, error) {
	c := eval.LineChart{Title: "held-out error per layer (relative to the block output's mean square)", XLabel: "layer",
		YLabel: "relative mean squared error (log scale)", LogY: true}
	g, r, d := eval.Series{Name: "GPTQ block error"}, eval.Series{Name: "RTN block error"}, eval.Series{Name: "drift of the stream"}
	for _, l := range res.Layers {
		c.X = append(c.X, float64(l.Layer))
		g.Y, r.Y, d.Y = append(g.Y, l.GPTQRelErr), append(r.Y, l.RTNRelErr), append(d.Y, l.StreamRelMSE)
	}
	c.Series = []eval.Series{g, r, d}
	var out []string
	for _, p := range []struct {
		name  string
		write func(io.Writer) error
	}{
		{"layers.svg", func(w io.Writer) error { return eval.WriteLineSVG(w, c) }},
		{"eval.svg", res.Eval.WriteSVG},
	} {
		var b bytes.Buffer
		if err := p.write(&b); err != nil {
			return nil, fmt.Errorf("demo: %s: %w", p.name, err)
		}
		path := filepath.Join(dir, p.name)
		if _, err := atomicfile.WriteFile(path, b.Bytes()); err != nil {
			return nil, err
		}
		out = append(out, path)
	}
	return out, nil
}

// reading compares the two candidates' mean KL over all positions, with
// their standard errors, and says why mean KL is the metric read.
func reading(rep *harness.Report) (string, bool) {
	if len(rep.Candidates) != 2 {
		return "", false
	}
	last := func(i int) eval.Row { rows := rep.Candidates[i].Rows; return rows[len(rows)-1] }
	rtn, gptq := last(0), last(1)
	kl := func(r eval.Row) string { return eval.FormatKLSE(r.MeanKL, r.MeanKLSE) }
	s := "Read mean KL: it compares each position's whole next-token distribution with the BF16 model's, " +
		"so it measures what the weight error does to the model, and its noise is small. ΔPPL looks at the " +
		"observed token only, where gains and losses of opposite sign cancel: here its standard errors (" +
		eval.FormatDeltaSE(rtn.DeltaPPLPercent, rtn.DeltaPPLSE) + " for RTN, " + eval.FormatDeltaSE(gptq.DeltaPPLPercent, gptq.DeltaPPLSE) +
		" for GPTQ) are as large as the differences. Standard errors are over the " + fmt.Sprint(gptq.Windows) + " windows. "
	ranked := gptq.MeanKL+gptq.MeanKLSE < rtn.MeanKL-rtn.MeanKLSE
	switch {
	case ranked:
		s += fmt.Sprintf("GPTQ's mean KL %s is below RTN's %s, and the error bars do not overlap: GPTQ is the better checkpoint.", kl(gptq), kl(rtn))
	case rtn.MeanKL+rtn.MeanKLSE < gptq.MeanKL-gptq.MeanKLSE:
		s += fmt.Sprintf("RTN's mean KL %s is below GPTQ's %s, and the error bars do not overlap: RTN is the better checkpoint.", kl(rtn), kl(gptq))
	default:
		s += fmt.Sprintf("The error bars of GPTQ's mean KL %s and RTN's %s overlap: score more text (--eval-sequences) to rank them.", kl(gptq), kl(rtn))
	}
	return s, ranked
}
