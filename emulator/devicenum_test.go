package emulator

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/emulator/eval"
)

// linearLM is a one-matmul language model: the logits of a position are
// its token's embedding (float32) times a BFP8 LM head, computed in float32
// (cfg nil: the fake-quant reference) or with device numerics.
type linearLM struct {
	emb        []float32 // [vocab, d]
	head       []float32 // decoded weights [vocab, d], for the float32 run
	w          *DeviceWeights
	cfg        *DeviceConfig
	vocab, dim int
}

type linearLogits struct {
	m      *linearLM
	tokens []int32
}

func (m *linearLM) Forward(ctx context.Context, tokens []int32) (eval.WindowLogits, error) {
	return &linearLogits{m, tokens}, nil
}

func (l *linearLogits) Logits(dst []float32, lo, hi int) error {
	m := l.m
	x := make([]float32, (hi-lo)*m.dim)
	for i := lo; i < hi; i++ {
		copy(x[(i-lo)*m.dim:], m.emb[int(l.tokens[i])*m.dim:(int(l.tokens[i])+1)*m.dim])
	}
	if m.cfg != nil {
		y, err := DeviceMatMul(context.Background(), x, hi-lo, m.w, *m.cfg)
		if err != nil {
			return err
		}
		copy(dst, y)
		return nil
	}
	for i := 0; i < hi-lo; i++ {
		for v := 0; v < m.vocab; v++ {
			var s float32
			for k := 0; k < m.dim; k++ {
				s += x[i*m.dim+k] * m.head[v*m.dim+k]
			}
			dst[i*m.vocab+v] = s
		}
	}
	return nil
}

// TestDeviceNumericsEvaluation runs device numerics through the evaluation
// loop: against the float32 run of the same BFP8 weights, the KL the device
// adds shrinks with fidelity, and the same numerics on both sides give KL 0.
func TestDeviceNumericsEvaluation(t *testing.T) {
	const vocab, dim = 96, 64
	r := rand.New(rand.NewPCG(71, 72))
	emb := make([]float32, vocab*dim)
	for i := range emb {
		emb[i] = float32(r.NormFloat64())
	}
	wf := make([]float32, vocab*dim)
	for i := range wf {
		wf[i] = float32(r.NormFloat64() * 0.4)
	}
	packed, err := bfp.Pack(bfp.BFP8, bfp.Tile32x32, wf, vocab, dim)
	if err != nil {
		t.Fatal(err)
	}
	head, err := bfp.Unpack(bfp.BFP8, bfp.Tile32x32, packed, vocab, dim)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewDeviceWeightsBFP(bfp.BFP8, bfp.Tile32x32, packed, vocab, dim)
	if err != nil {
		t.Fatal(err)
	}
	stream := make([]int32, 4*128)
	for i := range stream {
		stream[i] = int32(r.IntN(vocab))
	}
	ws, err := eval.StreamWindows("prose", stream, 128)
	if err != nil {
		t.Fatal(err)
	}
	ref := &linearLM{emb: emb, head: head, vocab: vocab, dim: dim}
	fids := []Fidelity{LoFi, HiFi2, HiFi4}
	var cands []eval.Model
	var names []string
	for _, f := range fids {
		cfg := &DeviceConfig{Config: Config{Fidelity: f}, Output: OutBF16}
		cands = append(cands, &linearLM{emb: emb, w: w, cfg: cfg, vocab: vocab, dim: dim})
		names = append(names, "device:"+f.String())
	}
	s, err := eval.NewScorer(vocab, names, eval.ScorerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := eval.Evaluate(context.Background(), s, ref, cands, ws, eval.EvalOptions{}); err != nil {
		t.Fatal(err)
	}
	kl := make([]float64, len(fids))
	var table strings.Builder
	for i := range fids {
		rows := s.Accumulator().Rows(i)
		all := rows[len(rows)-1]
		kl[i] = all.MeanKL
		if all.Tokens != 4*127 || !(all.MeanKL > 0) || all.Top1 < 0.9 {
			t.Errorf("%s: %+v", names[i], all)
		}
	}
	if !(kl[0] > kl[1] && kl[1] >= kl[2]) {
		t.Errorf("mean KL by fidelity %v: want LoFi > HiFi2 ≥ HiFi4", kl)
	}
	res, err := eval.NewResult(eval.RunInfo{Label: "float32"}, []eval.RunInfo{{Label: "LoFi"}, {Label: "HiFi2"}, {Label: "HiFi4"}}, s, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	res.WriteMarkdown(&table)
	t.Logf("device numerics of a BFP8 LM head against its float32 run:\n%s", table.String())

	// The same device numerics on both sides: exactly zero.
	same, _ := eval.NewScorer(vocab, []string{"self"}, eval.ScorerOptions{})
	if err := eval.Evaluate(context.Background(), same, cands[1], cands[1:2], ws, eval.EvalOptions{Chunk: 5}); err != nil {
		t.Fatal(err)
	}
	rows := same.Accumulator().Rows(0)
	if all := rows[len(rows)-1]; all.MeanKL != 0 || all.Top1 != 1 || all.DeltaPPLPercent != 0 || math.IsNaN(all.RefPPL) {
		t.Errorf("identical numerics: %+v", all)
	}
}
