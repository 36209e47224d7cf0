// Package rng holds the SplitMix64 generator that the built-in test models
// and the synthetic calibration stores draw from. Its outputs are fixed:
// files generated from it are compared byte for byte across platforms.
package rng

// SplitMix64 is the SplitMix64 generator: a 64-bit counter advanced by the
// golden-ratio increment and passed through a bit mixer. State is the
// counter; any value, zero included, is a valid seed.
type SplitMix64 struct{ State uint64 }

// Next advances the counter and returns the next 64-bit output.
func (r *SplitMix64) Next() uint64 {
	r.State += 0x9e3779b97f4a7c15
	z := r.State
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Unit returns u = (x >> 40)·2^-24 for the next output x: 24 random bits,
// exactly representable, in [0, 1).
func (r *SplitMix64) Unit() float32 {
	return float32(r.Next()>>40) * (1.0 / (1 << 24))
}

// Signed returns s = 2u − 1 in [-1, 1) for the next unit draw u, exact in
// float32.
func (r *SplitMix64) Signed() float32 {
	u := r.Unit()
	return float32(float32(2*u) - 1)
}
