package build

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/calib/textcalib"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/manifest"
)

// asymOpts calibrates on 24 sequences of 512 tokens, 4 held out: 10,240
// calibration rows, enough rows per input column
// (calib.AsymmetricMinRowsPerColumn) for the shared expert and most routed
// experts of the trained model to be fitted asymmetrically.
func asymOpts(t testing.TB, out string, workers int, asym bool) BuildOptions {
	opt := seqOpts(t, out, workers)
	opt.DataOptions.Calibration = dataset.SetOptions{Sequences: 24, SeqLen: 512}
	opt.HeldOutSequences = 4
	opt.Asymmetric = asym
	return opt
}

// TestSequentialAsymmetric builds the trained model with asymmetric
// calibration: it verifies, records the option (so its identity differs
// from the symmetric build's), gives a lower held-out MoE block error than
// the symmetric build over the layers, writes the same bytes for any
// worker count, and an interrupted run resumes to the same bytes.
func TestSequentialAsymmetric(t *testing.T) {
	if purego {
		t.Skip("three more GPTQ builds on 12,288 tokens; the portable kernels make them slow")
	}
	sym, err := GPTQ(context.Background(), asymOpts(t, filepath.Join(t.TempDir(), "sym"), 2, false))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	res, err := GPTQ(context.Background(), asymOpts(t, out, 1, true))
	if err != nil {
		t.Fatal(err)
	}
	if rep := mustVerify(t, out, VerifyOptions{}); !rep.OK {
		t.Fatalf("the asymmetric checkpoint does not verify: %v", rep.Failures)
	}
	m := res.Manifest
	if !m.TTQuant.Options.Asymmetric {
		t.Error("the manifest does not record the asymmetric fit")
	}
	if res.Identity == sym.Identity {
		t.Error("asymmetric and symmetric builds share an identity")
	}
	var ea, es float64
	for i, ls := range m.TTQuant.Layers {
		ss := sym.Manifest.TTQuant.Layers[i]
		t.Logf("layer %d: held-out GPTQ/RTN %.3f asymmetric, %.3f symmetric; stream drift %.3g, %.3g",
			ls.Layer, ls.HeldOutMSE/ls.HeldOutRTNMSE, ss.HeldOutMSE/ss.HeldOutRTNMSE, ls.HeldOutStreamRelMSE, ss.HeldOutStreamRelMSE)
		if !(ls.HeldOutMSE > 0 && ls.HeldOutMSE < ls.HeldOutRTNMSE) {
			t.Errorf("layer %d: held-out error %g, RTN %g", ls.Layer, ls.HeldOutMSE, ls.HeldOutRTNMSE)
		}
		ea += ls.HeldOutMSE / ls.HeldOutRTNMSE
		es += ss.HeldOutMSE / ss.HeldOutRTNMSE
	}
	if !(ea < es) {
		t.Errorf("summed held-out GPTQ/RTN ratio %.3f asymmetric, %.3f symmetric: the fit to the source outputs should win", ea, es)
	}
	last := len(m.TTQuant.Layers) - 2 // the last trunk layer
	if a, s := m.TTQuant.Layers[last].HeldOutStreamRelMSE, sym.Manifest.TTQuant.Layers[last].HeldOutStreamRelMSE; !(a < s) {
		t.Errorf("held-out stream drift after the last layer %.4g asymmetric, %.4g symmetric", a, s)
	}
	// The matrices fitted asymmetrically say so: the shared expert's
	// (every layer has 10,240 rows for 128 columns) and some routed ones.
	fits := map[string]int{}
	for _, ms := range m.TTQuant.Matrices {
		if ms.Fit == manifest.FitAsymmetric {
			switch {
			case strings.Contains(ms.Tensor, "shared_expert."):
				fits["shared"]++
			case strings.Contains(ms.Tensor, ".experts."):
				fits["routed"]++
			default:
				fits["other"]++
			}
		}
	}
	if fits["shared"] != 15 || fits["routed"] == 0 || fits["other"] != 0 {
		t.Errorf("asymmetric fits %v: want the 15 shared expert matrices, some routed ones, nothing else", fits)
	}
	for _, ms := range sym.Manifest.TTQuant.Matrices {
		if ms.Fit != "" {
			t.Fatalf("symmetric build: %s records fit %q", ms.Tensor, ms.Fit)
		}
	}

	// Two workers, and a run stopped after layer 2 then resumed.
	two := filepath.Join(t.TempDir(), "out")
	opt := asymOpts(t, two, 2, true)
	interruptAfterLayer(t, opt, 2)
	// The unfinished asymmetric build is not resumed as a symmetric one.
	if _, err := GPTQ(context.Background(), asymOpts(t, two, 2, false)); !errors.Is(err, ErrResumeMismatch) || !strings.Contains(err.Error(), "asymmetric") {
		t.Errorf("symmetric run over an unfinished asymmetric build: %v, want %v naming the option", err, ErrResumeMismatch)
	}
	if _, err := GPTQ(context.Background(), asymOpts(t, two, 2, true)); err != nil {
		t.Fatalf("resume: %v", err)
	}
	sameTree(t, "2 workers, interrupted and resumed, against 1", out, two)
}

// TestSequentialAsymmetricAllLayers fits attention and Gated DeltaNet
// projections too (--layers all): their targets come from the source
// layer's own sites.
func TestSequentialAsymmetricAllLayers(t *testing.T) {
	if purego {
		t.Skip("one more full GPTQ build; the portable kernels make it slow")
	}
	out := filepath.Join(t.TempDir(), "out")
	opt := asymOpts(t, out, 2, true)
	opt.DataOptions.Calibration.Sequences = 12 // 4,096 calibration rows: 256 columns at most are fitted
	opt.Layers = "all"
	res, err := GPTQ(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if rep := mustVerify(t, out, VerifyOptions{}); !rep.OK {
		t.Fatalf("does not verify: %v", rep.Failures)
	}
	for _, ls := range res.Manifest.TTQuant.Layers {
		if !(ls.HeldOutStreamRelMSE > 0 && ls.HeldOutStreamRelMSE < 0.05) {
			t.Errorf("layer %d: held-out stream drift %g", ls.Layer, ls.HeldOutStreamRelMSE)
		}
	}
	fitted := 0
	for _, ms := range res.Manifest.TTQuant.Matrices {
		for _, k := range []string{".q_proj.", ".o_proj.", ".in_proj_qkv.", ".out_proj."} {
			if !strings.Contains(ms.Tensor, k) {
				continue
			}
			if ms.Method != manifest.MethodGPTQ || ms.Fallback != "" {
				t.Errorf("%s: method %s (%s), want GPTQ", ms.Tensor, ms.Method, ms.Fallback)
			}
			if ms.Fit == manifest.FitAsymmetric {
				fitted++
			}
		}
	}
	// Those reading the 128 hidden features (q_proj, in_proj_qkv) have
	// rows enough; wider inputs are fitted symmetrically.
	if fitted == 0 {
		t.Error("no attention or Gated DeltaNet projection was fitted asymmetrically")
	}
}

func TestAsymmetricNeedsRows(t *testing.T) {
	opt := seqOpts(t, filepath.Join(t.TempDir(), "out"), 1)
	opt.Data = nil
	opt.Asymmetric = true
	if err := opt.Validate(); err == nil || !strings.Contains(err.Error(), "--asymmetric") {
		t.Errorf("asymmetric without calibration rows: %v, want a refusal naming the flag", err)
	}
	opt.DryRun = true
	if err := opt.Validate(); err != nil {
		t.Errorf("a dry run plans without rows: %v", err)
	}
	opt.DryRun, opt.Hessians = false, zeroHessians{}
	if err := opt.Validate(); err == nil || !strings.Contains(err.Error(), "Hessian source") {
		t.Errorf("asymmetric with a Hessian source: %v, want a refusal", err)
	}
}

type zeroHessians struct{}

func (zeroHessians) Hessian(context.Context, string, int, int, int) ([]float64, int64, *calib.FallbackError, error) {
	return nil, 0, calib.Fallback(calib.ErrNoInputs, "none", nil), nil
}

// TestStoreAsymmetric: with a calibration store the inputs are the source
// model's, so the asymmetric fit leaves gate and up as they are and fits
// every down projection (routed and shared) through the quantized gate
// and up; the held-out block error drops in every layer.
func TestStoreAsymmetric(t *testing.T) {
	if purego {
		t.Skip("two more GPTQ builds on 12,288 tokens; the portable kernels make them slow")
	}
	opt := asymOpts(t, "", 2, false)
	store := filepath.Join(t.TempDir(), "store")
	if _, err := textcalib.Build(context.Background(), textcalib.Options{Model: opt.Source, Out: store, Data: opt.Data, DataOptions: opt.DataOptions}); err != nil {
		t.Fatal(err)
	}
	asymDir := filepath.Join(t.TempDir(), "asym")
	build := func(asym bool) *BuildResult {
		o := asymOpts(t, filepath.Join(t.TempDir(), "out"), 2, asym)
		if asym {
			o.Out = asymDir
		}
		o.Data, o.Calib = nil, store
		res, err := GPTQ(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if rep := mustVerify(t, o.Out, VerifyOptions{}); !rep.OK {
			t.Fatalf("asymmetric %v: does not verify: %v", asym, rep.Failures)
		}
		return res
	}
	sym, asym := build(false), build(true)
	fitted := 0
	for _, ms := range asym.Manifest.TTQuant.Matrices {
		if ms.Fit != manifest.FitAsymmetric {
			continue
		}
		fitted++
		if !strings.Contains(ms.Tensor, "down_proj") {
			t.Errorf("%s fitted asymmetrically: only down projections should change with a store", ms.Tensor)
		}
	}
	if fitted == 0 {
		t.Error("no down projection fitted asymmetrically")
	}
	// verify holds the fit marks to the schema.
	for _, c := range []struct {
		name string
		edit func(m *manifest.Manifest)
	}{
		{"a fit without the option", func(m *manifest.Manifest) { m.TTQuant.Options.Asymmetric = false }},
		{"an unknown fit", func(m *manifest.Manifest) {
			for i := range m.TTQuant.Matrices {
				if m.TTQuant.Matrices[i].Fit != "" {
					m.TTQuant.Matrices[i].Fit = "symmetric"
					break
				}
			}
		}},
	} {
		dir := t.TempDir()
		copyTree(t, asymDir, dir)
		data, err := os.ReadFile(filepath.Join(dir, manifest.ManifestName))
		if err != nil {
			t.Fatal(err)
		}
		m, err := manifest.DecodeManifest(data)
		if err != nil {
			t.Fatal(err)
		}
		c.edit(m)
		rewriteManifest(t, dir, m)
		if rep := mustVerify(t, dir, VerifyOptions{}); rep.OK || !strings.Contains(fmt.Sprint(rep.Failures), "schema: ") {
			t.Errorf("%s: verify %v, want a schema failure", c.name, rep.Failures)
		}
	}
	for i, ls := range asym.Manifest.TTQuant.Layers {
		ss := sym.Manifest.TTQuant.Layers[i]
		if ls.HeldOutTokens == 0 {
			continue
		}
		t.Logf("layer %d: held-out GPTQ/RTN %.3f asymmetric, %.3f symmetric", ls.Layer, ls.HeldOutMSE/ls.HeldOutRTNMSE, ss.HeldOutMSE/ss.HeldOutRTNMSE)
		if !(ls.HeldOutMSE < ss.HeldOutMSE) {
			t.Errorf("layer %d: held-out error %g asymmetric, %g symmetric", ls.Layer, ls.HeldOutMSE, ss.HeldOutMSE)
		}
	}
}
