package harness

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ttquant/ttquant/emulator"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
)

// rtnFixture writes the tiny random fixture (Micro geometry) and its
// native checkpoint with the 35B preset's rules (round to nearest: routed
// and shared experts BFP4_b, projections and LM head BFP8_b).
func rtnFixture(t *testing.T) (src, ckpt string) {
	t.Helper()
	src, ckpt = t.TempDir(), filepath.Join(t.TempDir(), "rtn")
	if err := testmodel.Write(src, testmodel.Micro(), testmodel.Default); err != nil {
		t.Fatal(err)
	}
	p, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := build.Convert(context.Background(), build.BuildOptions{Source: src, Out: ckpt, Plan: p}); err != nil {
		t.Fatal(err)
	}
	return src, ckpt
}

// operandCheck wraps DeviceLinears and compares each matrix's SrcA operand
// with the float32 weights the CPU candidate multiplies by.
type operandCheck struct {
	*DeviceLinears
	t *testing.T

	mu       sync.Mutex
	matrices int
	stored   int // rows taken from the checkpoint

	diff, norm float64 // Σ(device − exact)², Σ exact² over all products
}

func (c *operandCheck) Linear(w *forward.LinearWeight) (forward.Linear, error) {
	bf, err := c.operand(w)
	if err != nil {
		return nil, err
	}
	bad := 0
	for i, h := range bf {
		if math.Float32frombits(uint32(h)<<16) != w.W[i] {
			bad++
		}
	}
	if bad > 0 {
		c.t.Errorf("%s: %d of %d weights reach SrcA with another value than the decoded checkpoint holds", w.Name(), bad, len(bf))
	}
	c.mu.Lock()
	c.matrices++
	for _, rr := range w.Rows {
		if _, _, _, ok := c.native.Locate(rr.Tensor); ok {
			c.stored += rr.Rows
		}
	}
	c.mu.Unlock()
	l, err := c.DeviceLinears.Linear(w)
	if err != nil {
		return nil, err
	}
	return &productCheck{l: l, w: append([]float32(nil), w.W...), out: w.Out, in: w.In, c: c}, nil
}

// productCheck compares each device product with the float64 product of
// the same float32 operands, accumulating the squared differences.
type productCheck struct {
	l       forward.Linear
	w       []float32
	out, in int
	c       *operandCheck
}

func (p *productCheck) MatMulT(dst []float32, ldd int, x []float32, rows int) error {
	if err := p.l.MatMulT(dst, ldd, x, rows); err != nil {
		return err
	}
	var d, n float64
	for r := 0; r < rows; r++ {
		for o := 0; o < p.out; o++ {
			var e float64
			for k := 0; k < p.in; k++ {
				e += float64(x[r*p.in+k]) * float64(p.w[o*p.in+k])
			}
			g := float64(dst[r*ldd+o])
			d += (g - e) * (g - e)
			n += e * e
		}
	}
	p.c.mu.Lock()
	p.c.diff += d
	p.c.norm += n
	p.c.mu.Unlock()
	return nil
}

func fixtureLogits(t *testing.T, m *forward.Model, ids []int32) []float32 {
	t.Helper()
	x, err := m.Embed(ids)
	if err != nil {
		t.Fatal(err)
	}
	b := &forward.Batch{Lens: []int{len(ids)}, X: x}
	if err := m.Trunk(b, nil, nil); err != nil {
		t.Fatal(err)
	}
	hf, err := m.FinalNorm(b.X)
	if err != nil {
		t.Fatal(err)
	}
	var out []float32
	if err := m.Logits(hf, func(_, _ int, lg []float32) error { out = append(out, lg...); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// relDiff returns ‖a−b‖/‖b‖ and the fraction of rows whose arg-max
// agrees.
func relDiff(a, b []float32, vocab int) (rel, top1 float64) {
	var d, n float64
	agree, rows := 0, 0
	for r := 0; r*vocab < len(a); r++ {
		ia, ib := 0, 0
		for v := 0; v < vocab; v++ {
			i := r*vocab + v
			d += (float64(a[i]) - float64(b[i])) * (float64(a[i]) - float64(b[i]))
			n += float64(b[i]) * float64(b[i])
			if a[i] > a[r*vocab+ia] {
				ia = v
			}
			if b[i] > b[r*vocab+ib] {
				ib = v
			}
		}
		if ia == ib {
			agree++
		}
		rows++
	}
	return math.Sqrt(d / n), float64(agree) / float64(rows)
}

// TestDeviceNumericsForward runs the tiny random fixture's RTN checkpoint
// with device numerics: every matrix reaches SrcA with exactly the values
// the CPU candidate decodes (the stored rows through the emulated unpacker,
// mapped onto the forward pass's stacked matrices); every product differs
// from the float32 product of the same operands, but only slightly (in
// RMS over all products under 0.5% at HiFi4 — BF16 activations and
// outputs — and under 4% at LoFi, which also drops the low mantissa bits
// of BFP8 weights); the logits differ from the CPU candidate's, less at
// HiFi4 than at LoFi, and depend neither on the number of workers nor on
// keeping the prepared weights; a BFP8
// KV cache also changes them slightly. (The random fixture amplifies
// small differences through its layers far more than a trained model:
// the logit-level "slightly" is checked on the trained model by
// cmd/ttquant's TestEvalDeviceNumerics.)
func TestDeviceNumericsForward(t *testing.T) {
	src, ckpt := rtnFixture(t)
	ref, err := forward.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	ns, err := OpenNative(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	model := func() *forward.Model {
		m, err := forward.New(ref.Config, forward.Overlay{ns, ref.Src})
		if err != nil {
			t.Fatal(err)
		}
		m.Resident = true
		return m
	}
	ids := make([]int32, 48)
	for i := range ids {
		ids[i] = int32((i*37 + 5) % ref.Config.Vocab)
	}
	V := ref.Config.Vocab
	cpu := fixtureLogits(t, model(), ids)

	rels := map[emulator.Fidelity]float64{}
	for _, fid := range []emulator.Fidelity{emulator.LoFi, emulator.HiFi4} {
		n, err := ParseNumerics("device:"+fid.String(), "")
		if err != nil {
			t.Fatal(err)
		}
		var runs [][]float32
		for _, workers := range []int{1, 3} {
			cfg := *n.Device
			cfg.Workers = workers
			d, err := NewDeviceLinears(cfg, ns, workers == 1) // keep, or prepare at every use as --stream does
			if err != nil {
				t.Fatal(err)
			}
			oc := &operandCheck{DeviceLinears: d, t: t}
			m := model()
			m.Linears = oc
			runs = append(runs, fixtureLogits(t, m, ids))
			if workers == 1 && (oc.matrices == 0 || oc.stored == 0) {
				t.Errorf("%v: %d matrices, %d rows from the checkpoint", fid, oc.matrices, oc.stored)
			}
			prod := math.Sqrt(oc.diff / oc.norm)
			bound := 0.005
			if fid == emulator.LoFi {
				bound = 0.04
			}
			if workers == 1 {
				t.Logf("%v: products differ from float32 by %.3g relative (RMS over %d matrices)", fid, prod, oc.matrices)
			}
			if !(prod > 0 && prod < bound) {
				t.Errorf("%v: products differ from float32 by %g relative; want (0, %g)", fid, prod, bound)
			}
		}
		for i := range runs[0] {
			if math.Float32bits(runs[0][i]) != math.Float32bits(runs[1][i]) {
				t.Fatalf("%v: logit %d is %g with 1 worker and kept weights, %g with 3 and weights prepared at each use", fid, i, runs[0][i], runs[1][i])
			}
		}
		rel, top1 := relDiff(runs[0], cpu, V)
		t.Logf("%v: logits differ from the CPU candidate's by %.3g relative; arg-max agrees on %.3f of positions", fid, rel, top1)
		if !(rel > 0) || math.IsNaN(rel) {
			t.Errorf("%v: relative difference %g from the CPU candidate's logits", fid, rel)
		}
		rels[fid] = rel
	}
	if !(rels[emulator.HiFi4] < rels[emulator.LoFi]) {
		t.Errorf("relative difference HiFi4 %g, LoFi %g: want HiFi4 closer to float32", rels[emulator.HiFi4], rels[emulator.LoFi])
	}

	// A BFP8 KV cache alone.
	n, err := ParseNumerics("cpu", "bfp8")
	if err != nil {
		t.Fatal(err)
	}
	m := model()
	if err := n.apply(m, ns, 2, true); err != nil {
		t.Fatal(err)
	}
	rel, top1 := relDiff(fixtureLogits(t, m, ids), cpu, V)
	t.Logf("BFP8 KV cache: %.3g relative, arg-max agreement %.3f", rel, top1)
	if !(rel > 0 && rel < 0.05) || top1 < 0.9 {
		t.Errorf("BFP8 KV cache: relative difference %g, arg-max agreement %g", rel, top1)
	}
}

// TestParseNumerics: accepted spellings, the default fidelity, recorded
// descriptions and refusals.
func TestParseNumerics(t *testing.T) {
	for in, want := range map[[2]string]string{
		{"", ""}:                "cpu-fp32",
		{"cpu", "f32"}:          "cpu-fp32",
		{"cpu", "bfp8"}:         "cpu-fp32, kv bfp8",
		{"device", ""}:          "device:HiFi2 (fp32 dst, blackhole; bf16 activations and outputs)",
		{"device:lofi", "bfp8"}: "device:LoFi (fp32 dst, blackhole; bf16 activations and outputs), kv bfp8",
		{"Device:HiFi4", ""}:    "device:HiFi4 (fp32 dst, blackhole; bf16 activations and outputs)",
	} {
		n, err := ParseNumerics(in[0], in[1])
		if err != nil || n.String() != want {
			t.Errorf("ParseNumerics(%q, %q) = %q, %v; want %q", in[0], in[1], n.String(), err, want)
		}
	}
	for _, in := range [][2]string{{"gpu", ""}, {"device:", ""}, {"device:HiFi5", ""}, {"devices", ""}, {"CPU", ""}, {"cpu", "bfp4"}, {"cpu", "F32"}, {"", "fp8"}} {
		_, err := ParseNumerics(in[0], in[1])
		if err == nil {
			t.Errorf("ParseNumerics(%q, %q): no error", in[0], in[1])
			continue
		}
		// The error says which of the two is wrong.
		want := ErrNumerics
		if in[1] != "" && in[1] != "f32" {
			want = ErrKVCache
		}
		if !errors.Is(err, want) {
			t.Errorf("ParseNumerics(%q, %q): %v, want %v", in[0], in[1], err, want)
		}
	}
}

// TestSelfExactWithDeviceNumerics: the source evaluated against itself stays
// exact whatever numerics the checkpoints' runs use (it is the harness's
// own check), and the result records the numerics.
func TestSelfExactWithDeviceNumerics(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	lines := strings.SplitAfter(string(must(os.ReadFile(filepath.Join(dir, "eval-dev.jsonl")))), "\n")
	file := filepath.Join(t.TempDir(), "one.jsonl")
	if err := os.WriteFile(file, []byte(lines[44]), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, dopt := perRecord(t, file, 1)
	dopt.Evaluation = dataset.SetOptions{Sequences: 1, SeqLen: 64, Mode: dataset.ModePack}
	num, err := ParseNumerics("device:LoFi", "bfp8")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), Options{Model: dir, Self: true, Data: spec, DataOptions: dopt, Window: 64, Numerics: num})
	if err != nil {
		t.Fatal(err)
	}
	if rows := rep.Candidates[0].Rows; len(rows) == 0 || rows[len(rows)-1].Tokens != 63 {
		t.Fatalf("rows %+v: want 63 scored tokens", rows)
	}
	for _, r := range rep.Candidates[0].Rows {
		if r.DeltaPPLPercent != 0 || r.Top1 != 1 || r.MeanKL != 0 || r.P99KL != 0 {
			t.Errorf("%s: self ΔPPL %v, top-1 %v, KL %v", r.Corpus, r.DeltaPPLPercent, r.Top1, r.MeanKL)
		}
	}
	s := rep.Settings.(Settings)
	if rep.Candidates[0].Numerics != "cpu-fp32" || !strings.HasPrefix(s.Numerics, "device:LoFi") || s.KVCache != "bfp8" {
		t.Errorf("self numerics %q, settings %+v", rep.Candidates[0].Numerics, s)
	}
}
