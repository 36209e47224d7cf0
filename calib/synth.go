package calib

import (
	"fmt"

	"github.com/ttquant/ttquant/internal/rng"
)

// SynthConfig parameterises the synthetic activation generator.
type SynthConfig struct {
	Hidden int    // features per token
	Seed   uint64 // any value; different seeds give unrelated activations
	// Factors is the number of latent factors shared by all channels
	// (channel correlation); 0 selects min(64, max(4, Hidden/8)).
	Factors int
	// Massive is the number of outlier channels; -1 selects none, 0
	// selects max(1, Hidden/128). In every token they carry a value of
	// fixed sign about OutlierScale times an ordinary channel's standard
	// deviation, and in the first token of every sequence a massive value
	// about MassiveScale times it.
	Massive int
	// OutlierScale defaults to 6, MassiveScale to 60.
	OutlierScale, MassiveScale float32
	// SeqLen is the sequence length the token index is divided into (for
	// the massive first-token values); 0 selects 256.
	SeqLen int
	// Noise is the standard deviation of the per-channel independent part,
	// relative to the shared part; 0 selects 0.25.
	Noise float32
}

// Synth generates deterministic activations that share the features GPTQ
// exploits in real ones: channels are correlated through a few latent
// factors, channel scales differ by an order of magnitude, a few channels
// carry "massive" values of nearly constant sign and size, and every token
// has its own overall scale. Row t depends only on the configuration and t,
// so any range of rows can be produced independently and in any order.
//
// Only additions and multiplications of SplitMix64 draws, each explicitly
// rounded to float32 (so never fused differently), are used: the values are
// the same on every platform.
type Synth struct {
	cfg        SynthConfig
	mix        []float32 // [hidden, factors]
	chScale    []float32 // [hidden]
	massive    []int
	massiveVal []float32 // signed base magnitude of each outlier channel
}

// NewSynth validates cfg and prepares a generator.
func NewSynth(cfg SynthConfig) (*Synth, error) {
	if cfg.Hidden <= 0 {
		return nil, fmt.Errorf("calib: synthetic activations: hidden size %d must be positive", cfg.Hidden)
	}
	if cfg.Factors == 0 {
		cfg.Factors = min(64, max(4, cfg.Hidden/8))
	}
	if cfg.Factors < 0 {
		return nil, fmt.Errorf("calib: synthetic activations: %d factors", cfg.Factors)
	}
	switch {
	case cfg.Massive == 0:
		cfg.Massive = max(1, cfg.Hidden/128)
	case cfg.Massive < 0:
		cfg.Massive = 0
	}
	if cfg.Massive > cfg.Hidden {
		return nil, fmt.Errorf("calib: synthetic activations: %d massive channels in %d", cfg.Massive, cfg.Hidden)
	}
	if cfg.MassiveScale == 0 {
		cfg.MassiveScale = 60
	}
	if cfg.OutlierScale == 0 {
		cfg.OutlierScale = 6
	}
	if cfg.SeqLen == 0 {
		cfg.SeqLen = 256
	}
	if cfg.SeqLen < 0 {
		return nil, fmt.Errorf("calib: synthetic activations: sequence length %d", cfg.SeqLen)
	}
	if cfg.Noise == 0 {
		cfg.Noise = 0.25
	}
	s := &Synth{cfg: cfg}
	rng := splitmix{State: cfg.Seed ^ 0x9e3779b97f4a7c15}
	h, f := cfg.Hidden, cfg.Factors
	s.mix = make([]float32, h*f)
	norm := float32(1)
	if f > 0 {
		norm = 1 / sqrtApprox(float32(f))
	}
	for i := range s.mix {
		s.mix[i] = gauss(&rng) * norm
	}
	s.chScale = make([]float32, h)
	for i := range s.chScale {
		// Between 1/4 and 4, skewed towards small: u⁴ spread.
		u := rng.Unit()
		u4 := float32(float32(u*u) * float32(u*u))
		s.chScale[i] = 0.25 + float32(3.75*u4)
	}
	// Massive channels: distinct, chosen by a partial Fisher–Yates shuffle.
	perm := make([]int, h)
	for i := range perm {
		perm[i] = i
	}
	for i := 0; i < cfg.Massive; i++ {
		j := i + int(rng.Next()%uint64(h-i))
		perm[i], perm[j] = perm[j], perm[i]
		v := 0.75 + float32(0.5*rng.Unit())
		if rng.Next()&1 == 1 {
			v = -v
		}
		s.massive = append(s.massive, perm[i])
		s.massiveVal = append(s.massiveVal, v)
	}
	return s, nil
}

// Config returns the configuration with defaults filled in.
func (s *Synth) Config() SynthConfig { return s.cfg }

// Rows writes rows first..first+n-1 into dst (n×Hidden, row-major).
func (s *Synth) Rows(dst []float32, first, n int) {
	h, f := s.cfg.Hidden, s.cfg.Factors
	if len(dst) < n*h {
		panic("calib: Synth.Rows: destination too short")
	}
	// Latent factors of every row, then their mix into the channels.
	z := make([]float32, n*f)
	rngs := make([]splitmix, n)
	for r := 0; r < n; r++ {
		t := uint64(first + r)
		rng := splitmix{State: s.cfg.Seed*0xd1b54a32d192ed03 + t*0x8cb92ba72f3d8dd7 + 1}
		for i := 0; i < f; i++ {
			z[r*f+i] = gauss(&rng)
		}
		rngs[r] = rng
	}
	for r := 0; r < n; r++ {
		zr := z[r*f : (r+1)*f]
		row := dst[r*h : (r+1)*h]
		for i := range row {
			row[i] = mixDot(s.mix[i*f:(i+1)*f], zr)
		}
	}
	for r := 0; r < n; r++ {
		t := uint64(first + r)
		rng := &rngs[r]
		// Per-token scale between 0.4 and 2.5, most tokens near 1.
		u := rng.Unit()
		u4 := float32(float32(u*u) * float32(u*u))
		scale := float32(0.4+float32(0.6*u)) + float32(1.5*u4)
		row := dst[r*h : (r+1)*h]
		for i, v := range row {
			v += float32(s.cfg.Noise * gauss(rng))
			row[i] = float32(scale*s.chScale[i]) * v
		}
		amp := s.cfg.OutlierScale
		if t%uint64(s.cfg.SeqLen) == 0 {
			amp = s.cfg.MassiveScale
		}
		for j, c := range s.massive {
			row[c] = float32(amp*s.massiveVal[j]) * (0.8 + float32(0.4*rng.Unit()))
		}
	}
}

// mixDot is a float32 dot product in four interleaved partial sums, every
// product and sum rounded explicitly (no fused multiply-add), so it gives
// the same bits on every platform.
func mixDot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 = float32(s0 + float32(a[i]*b[i]))
		s1 = float32(s1 + float32(a[i+1]*b[i+1]))
		s2 = float32(s2 + float32(a[i+2]*b[i+2]))
		s3 = float32(s3 + float32(a[i+3]*b[i+3]))
	}
	for ; i < len(a); i++ {
		s0 = float32(s0 + float32(a[i]*b[i]))
	}
	return (s0 + s1) + (s2 + s3)
}

// splitmix is the SplitMix64 generator the test models use.
type splitmix = rng.SplitMix64

// gauss returns an approximately standard normal value: the centred sum of
// four uniforms scaled to unit variance (Irwin–Hall), using no
// transcendental functions.
func gauss(s *splitmix) float32 {
	v := s.Unit() + s.Unit() + s.Unit() + s.Unit() - 2
	return v * 1.7320508
}

// sqrtApprox is a Newton square root in float32 arithmetic (exact enough for
// a normalisation constant and identical on every platform).
func sqrtApprox(x float32) float32 {
	if x <= 0 {
		return 0
	}
	r := x
	for i := 0; i < 40; i++ {
		r = 0.5 * (r + float32(x/r))
	}
	return r
}
