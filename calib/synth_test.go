package calib

import (
	"math"
	"testing"
)

func TestSynthProperties(t *testing.T) {
	const h, n = 256, 1024
	s, err := NewSynth(SynthConfig{Hidden: h, Seed: 42, SeqLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, n*h)
	s.Rows(x, 0, n)

	// Any row range is generated independently of the others.
	part := make([]float32, 7*h)
	s.Rows(part, 300, 7)
	for i, v := range part {
		if math.Float32bits(v) != math.Float32bits(x[300*h+i]) {
			t.Fatalf("rows 300..306 generated alone differ at %d: %g vs %g", i, v, x[300*h+i])
		}
	}
	cfg := s.Config()
	if cfg.Massive != 2 || cfg.Factors != 32 {
		t.Errorf("defaults: %+v", cfg)
	}
	isMassive := map[int]bool{}
	for _, c := range s.massive {
		isMassive[c] = true
	}
	// Outlier channels: fixed sign, several times an ordinary channel's
	// typical magnitude; massive in the first token of each sequence.
	var ordinary float64
	for tk := 1; tk < n; tk++ {
		if tk%128 == 0 {
			continue
		}
		for c := 0; c < h; c++ {
			if !isMassive[c] {
				ordinary += math.Abs(float64(x[tk*h+c]))
			}
		}
	}
	ordinary /= float64((n - n/128) * (h - len(s.massive)))
	for _, c := range s.massive {
		sign := math.Signbit(float64(x[h+c]))
		var mag float64
		for tk := 1; tk < n; tk++ {
			v := float64(x[tk*h+c])
			if math.Signbit(v) != sign {
				t.Fatalf("outlier channel %d changes sign at token %d", c, tk)
			}
			if tk%128 != 0 {
				mag += math.Abs(v)
			}
		}
		mag /= float64(n - n/128)
		first := math.Abs(float64(x[128*h+c]))
		if mag < 3*ordinary || first < 5*mag {
			t.Errorf("channel %d: outlier mean %g, first-token %g, ordinary %g", c, mag, first, ordinary)
		}
	}
	// Channels are correlated: the mean |correlation| between ordinary
	// channels is far above what independent channels would give (about
	// 1/sqrt(n) = 0.03).
	var sumCorr float64
	pairs := 0
	for a := 0; a < 40; a++ {
		for b := a + 1; b < 40; b++ {
			if isMassive[a] || isMassive[b] {
				continue
			}
			var sa, sb, sab, saa, sbb float64
			for tk := 0; tk < n; tk++ {
				va, vb := float64(x[tk*h+a]), float64(x[tk*h+b])
				sa += va
				sb += vb
				sab += va * vb
				saa += va * va
				sbb += vb * vb
			}
			cov := sab/n - sa*sb/(n*n)
			corr := cov / math.Sqrt((saa/n-sa*sa/(n*n))*(sbb/n-sb*sb/(n*n)))
			sumCorr += math.Abs(corr)
			pairs++
		}
	}
	if m := sumCorr / float64(pairs); m < 0.1 {
		t.Errorf("mean |channel correlation| %.3f: channels look independent", m)
	}
	// Per-token scale varies: the coefficient of variation of the token RMS
	// (ordinary channels) is well above zero.
	var rs, rss float64
	for tk := 0; tk < n; tk++ {
		var ss float64
		for c := 0; c < h; c++ {
			if !isMassive[c] {
				ss += float64(x[tk*h+c]) * float64(x[tk*h+c])
			}
		}
		r := math.Sqrt(ss / float64(h))
		rs += r
		rss += r * r
	}
	mean := rs / n
	if cv := math.Sqrt(rss/n-mean*mean) / mean; cv < 0.2 {
		t.Errorf("token RMS coefficient of variation %.3f: no per-token scale variation", cv)
	}
	if _, err := NewSynth(SynthConfig{Hidden: 0}); err == nil {
		t.Error("hidden 0 accepted")
	}
	if _, err := NewSynth(SynthConfig{Hidden: 4, Massive: 5}); err == nil {
		t.Error("more massive channels than channels accepted")
	}
}

// TestSynthGolden pins a few generated values, so that a change to the
// generator (which would silently change every synthetic store) is noticed.
// The values were produced by this generator when the test was written.
func TestSynthGolden(t *testing.T) {
	s, _ := NewSynth(SynthConfig{Hidden: 64, Seed: 7})
	x := make([]float32, 3*64)
	s.Rows(x, 255, 3)
	got := []uint32{math.Float32bits(x[0]), math.Float32bits(x[64+17]), math.Float32bits(x[2*64+63])}
	t.Logf("golden bits %#x", got)
	want := [3]uint32{0xbeaa920b, 0x3ef1d426, 0x3e9be0d1}
	if want != [3]uint32(got) {
		t.Errorf("generator output changed: %#x, golden %#x", got, want)
	}
}
