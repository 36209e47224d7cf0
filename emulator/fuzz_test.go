package emulator

import (
	"encoding/binary"
	"math"
	"testing"
)

// FuzzCompareToken feeds arbitrary logit rows (pairs of float32 from the
// input bytes, NaN and ±Inf included) to CompareToken: it must never panic,
// must reject exactly the rows that define no distribution, and otherwise
// give a KL that is ≥ 0 (possibly +Inf, never NaN), arg-maxes in range and
// KL = 0 against itself.
func FuzzCompareToken(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 128, 191}, 0)
	f.Add([]byte{0, 0, 128, 255, 0, 0, 128, 255, 0, 0, 128, 63, 0, 0, 0, 0}, 1)
	f.Add([]byte{0, 0, 192, 127, 0, 0, 0, 0}, -1)
	f.Add([]byte{0, 0, 128, 127, 0, 0, 0, 0}, 0)
	f.Fuzz(func(t *testing.T, data []byte, target int) {
		n := len(data) / 8
		if n == 0 {
			return
		}
		ref := make([]float32, n)
		cand := make([]float32, n)
		for i := 0; i < n; i++ {
			ref[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[8*i:]))
			cand[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[8*i+4:]))
		}
		if target < -1 || target >= n {
			target = -1
		}
		bad := func(x []float32) bool {
			fin := false
			for _, v := range x {
				if v != v || math.IsInf(float64(v), 1) {
					return true
				}
				fin = fin || !math.IsInf(float64(v), -1)
			}
			return !fin
		}
		q, err := CompareToken(ref, cand, target)
		if (err != nil) != (bad(ref) || bad(cand)) {
			t.Fatalf("ref %v cand %v: error %v", ref, cand, err)
		}
		if err != nil {
			return
		}
		if math.IsNaN(q.KL) || q.KL < 0 || q.RefTop1 < 0 || q.RefTop1 >= n || q.CandTop1 < 0 || q.CandTop1 >= n {
			t.Fatalf("ref %v cand %v: %+v", ref, cand, q)
		}
		if target >= 0 && (math.IsNaN(q.RefNLL) || q.RefNLL < -1e-12 || math.IsNaN(q.CandNLL)) {
			t.Fatalf("ref %v cand %v target %d: %+v", ref, cand, target, q)
		}
		self, err := CompareToken(ref, ref, target)
		if err != nil || self.KL != 0 || self.RefTop1 != self.CandTop1 {
			t.Fatalf("ref %v against itself: %+v, %v", ref, self, err)
		}
	})
}
