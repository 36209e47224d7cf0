package rng

import "testing"

// TestSplitMix64Reference checks the first outputs from seed 0 against the
// published SplitMix64 sequence.
func TestSplitMix64Reference(t *testing.T) {
	want := []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}
	r := SplitMix64{}
	for i, w := range want {
		if got := r.Next(); got != w {
			t.Fatalf("output %d = %#x, want %#x", i, got, w)
		}
	}
	r = SplitMix64{State: 42}
	for i := 0; i < 1000; i++ {
		u := r.Unit()
		if u < 0 || u >= 1 || u*(1<<24) != float32(int(u*(1<<24))) {
			t.Fatalf("Unit() = %v: not a 24-bit fraction in [0, 1)", u)
		}
		if s := r.Signed(); s < -1 || s >= 1 {
			t.Fatalf("Signed() = %v outside [-1, 1)", s)
		}
	}
}
