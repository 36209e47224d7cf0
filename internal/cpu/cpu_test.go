package cpu

import "testing"

// TestFeaturesConsistent: FMA is only reported together with AVX2.
func TestFeaturesConsistent(t *testing.T) {
	if FMA && !AVX2 {
		t.Error("FMA without AVX2")
	}
	t.Logf("AVX2=%v FMA=%v", AVX2, FMA)
}
