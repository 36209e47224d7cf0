package calib

import "testing"

// synthRouter is a router matrix of uniform values in ±1/16.
func synthRouter(experts, hidden int, seed uint64) []float32 {
	rng := splitmix{State: seed}
	w := make([]float32, experts*hidden)
	for i := range w {
		w[i] = (2*rng.Unit() - 1) / 16
	}
	return w
}

// synthX is tokens rows of synthetic activations.
func synthX(t testing.TB, tokens, hidden int, seed uint64) []float32 {
	s, err := NewSynth(SynthConfig{Hidden: hidden, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, tokens*hidden)
	s.Rows(x, 0, tokens)
	return x
}
