package cpu

import "testing"

// TestFeaturesConsistent: FMA is only reported together with AVX2.
func TestFeaturesConsistent(t *testing.T) {
	if FMA && !AVX2 {
		t.Error("FMA without AVX2")
	}
	if AVX512F && !FMA {
		t.Error("AVX-512F without FMA")
	}
	t.Logf("AVX2=%v FMA=%v AVX512F=%v", AVX2, FMA, AVX512F)
}
