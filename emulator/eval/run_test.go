package eval

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// hashModel is a deterministic stand-in for a forward pass: the logit of
// token v at position i depends on the tokens up to i (a running hash), and
// noise perturbs it per candidate.
type hashModel struct {
	vocab int
	noise float64
	calls int
	fail  error
}

type hashLogits struct {
	m    *hashModel
	hash []uint64
}

func (m *hashModel) Forward(ctx context.Context, tokens []int32) (WindowLogits, error) {
	m.calls++
	if m.fail != nil {
		return nil, m.fail
	}
	h := make([]uint64, len(tokens))
	x := uint64(1469598103934665603)
	for i, t := range tokens {
		x = (x ^ uint64(t)) * 1099511628211
		h[i] = x
	}
	return &hashLogits{m, h}, nil
}

func (l *hashLogits) Logits(dst []float32, lo, hi int) error {
	v := l.m.vocab
	for i := lo; i < hi; i++ {
		for j := 0; j < v; j++ {
			z := (l.hash[i] + uint64(j)*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
			base := float64(z>>40)/float64(1<<24)*8 - 4
			n := float64((z>>8)&0xffff)/65536 - 0.5
			dst[(i-lo)*v+j] = float32(base + l.m.noise*n)
		}
	}
	return nil
}

func TestEvaluate(t *testing.T) {
	const vocab = 53
	stream := make([]int32, 300)
	for i := range stream {
		stream[i] = int32((i * 7) % vocab)
	}
	ws, err := StreamWindows("code", stream, 64)
	if err != nil {
		t.Fatal(err)
	}
	recs := []Record{{Tokens: stream[:40], Mask: make([]bool, 40)}, {Tokens: stream[40:50], Mask: make([]bool, 10)}}
	for i := 20; i < 40; i++ {
		recs[0].Mask[i] = true
	}
	chat, _, err := MaskedWindows("chat", recs, 64)
	if err != nil {
		t.Fatal(err)
	}
	ws = append(ws, chat...)
	ws = append(ws, Window{Corpus: "chat", Tokens: stream[:5], Targets: []int32{1, 2, 3, 4, -1}, Score: make([]bool, 5)})

	ref := &hashModel{vocab: vocab}
	run := func(chunk int) (*Scorer, []Progress) {
		s, err := NewScorer(vocab, []string{"self", "noisy"}, ScorerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ps []Progress
		clock := time.Unix(0, 0)
		err = Evaluate(context.Background(), s, ref, []Model{&hashModel{vocab: vocab}, &hashModel{vocab: vocab, noise: 0.5}}, ws,
			EvalOptions{Chunk: chunk, Progress: func(p Progress) { ps = append(ps, p) }, Now: func() time.Time { clock = clock.Add(time.Second); return clock }})
		if err != nil {
			t.Fatal(err)
		}
		return s, ps
	}
	s, ps := run(7)
	// Direct: the whole window's logits at once.
	d, err := NewScorer(vocab, []string{"self", "noisy"}, ScorerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, w := range ws {
		total += w.Scored()
		n := len(w.Tokens)
		buf := make([][]float32, 3)
		for k, m := range []*hashModel{{vocab: vocab}, {vocab: vocab}, {vocab: vocab, noise: 0.5}} {
			l, _ := m.Forward(context.Background(), w.Tokens)
			buf[k] = make([]float32, n*vocab)
			l.Logits(buf[k], 0, n)
		}
		if err := d.Score(w.Batch(0, n, buf[0], buf[1:])); err != nil {
			t.Fatal(err)
		}
		d.Accumulator().EndWindow() // each window one unit of the standard errors, as Evaluate does
	}
	for k := 0; k < 2; k++ {
		if a, b := fmt.Sprint(s.Accumulator().Rows(k)), fmt.Sprint(d.Accumulator().Rows(k)); a != b {
			t.Errorf("candidate %d: lockstep %s, direct %s", k, a, b)
		}
	}
	if other, _ := run(64); fmt.Sprint(other.Accumulator().Rows(1)) != fmt.Sprint(s.Accumulator().Rows(1)) {
		t.Error("result depends on the chunk size")
	}
	rows := s.Accumulator().Rows(0)
	all := rows[len(rows)-1]
	if all.Tokens != int64(total) || all.Tokens != 4*63+20 || all.MeanKL != 0 || all.Top1 != 1 || all.DeltaPPLPercent != 0 {
		t.Errorf("identical candidate: %+v (want %d tokens)", all, total)
	}
	if s.Positions() != d.Positions() {
		t.Errorf("positions %d, direct %d", s.Positions(), d.Positions())
	}
	if len(ps) != len(ws) || ps[len(ps)-1].ScoredDone != int64(total) || ps[0].Elapsed <= 0 {
		t.Errorf("progress %+v", ps)
	} else if first, ok := ps[0].ETA(); !ok || first <= 0 {
		t.Errorf("first progress %+v: ETA %v %v, want a positive estimate", ps[0], first, ok)
	} else if last, ok := ps[len(ps)-1].ETA(); !ok || last != 0 {
		t.Errorf("last progress %+v: ETA %v %v, want 0", ps[len(ps)-1], last, ok)
	}
	if ref.calls != 2*(len(ws)-1) { // two runs; the window with nothing scored is skipped
		t.Errorf("reference ran %d windows, want %d", ref.calls, 2*(len(ws)-1))
	}

	// Errors name the run and the window.
	s2, _ := NewScorer(vocab, []string{"bad"}, ScorerOptions{})
	boom := errors.New("boom")
	err = Evaluate(context.Background(), s2, ref, []Model{&hashModel{vocab: vocab, fail: boom}}, ws, EvalOptions{})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), `candidate "bad", window 0 (code record 0 at 0)`) {
		t.Errorf("failing candidate: %v", err)
	}
	if err := Evaluate(context.Background(), s2, ref, nil, ws, EvalOptions{}); err == nil {
		t.Error("missing candidate model accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Evaluate(ctx, s2, ref, []Model{ref}, ws, EvalOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}
