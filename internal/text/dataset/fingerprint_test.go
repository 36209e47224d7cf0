package dataset

import (
	"math/rand/v2"
	"testing"
)

// fpSet is a set of one sequence per record of the given token ids.
func fpSet(recs ...[]int32) *Set {
	s := &Set{}
	for i, r := range recs {
		s.Sequences = append(s.Sequences, Sequence{IDs: r, Records: []RecordRef{{Source: 0, Where: string(rune('a' + i))}}})
	}
	return s
}

func randIDs(r *rand.Rand, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(r.IntN(4000))
	}
	return out
}

func sharedCount(m [][]bool) int {
	n := 0
	for _, s := range m {
		for _, b := range s {
			if b {
				n++
			}
		}
	}
	return n
}

// TestFingerprint: copied text is found, boilerplate (a run in three
// records) and short shared spans are not, and a damaged fingerprint is
// refused.
func TestFingerprint(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	header := randIDs(r, 80)
	var cal [][]int32
	for i := 0; i < 4; i++ {
		cal = append(cal, append(append([]int32(nil), header...), randIDs(r, 2000)...))
	}
	fp, err := NewFingerprint(fpSet(cal...), 0)
	if err != nil {
		t.Fatal(err)
	}
	if fp.Dropped == 0 || fp.Shingles < 4*2000/FingerprintSample/2 {
		t.Fatalf("fingerprint %+v: want the header's runs dropped and about one run in %d kept", fp, FingerprintSample)
	}
	x, err := fp.Index()
	if err != nil {
		t.Fatal(err)
	}
	copied := cal[2][500:1500]
	short := cal[1][900:950]
	ev := fpSet(append(append(append([]int32(nil), header...), randIDs(r, 300)...), copied...), append(randIDs(r, 200), short...), randIDs(r, 1000))
	m := x.Shared(ev)
	if n := sharedCount(m[:1]); n < 800 || n > 1000 {
		t.Errorf("%d tokens of a 1000-token copy found", n)
	}
	for k := 0; k < len(header); k++ {
		if m[0][k] {
			t.Fatalf("the boilerplate header counts as shared at %d", k)
		}
	}
	if n := sharedCount(m[1:]); n != 0 {
		t.Errorf("a 50-token span and random text: %d shared tokens", n)
	}
	bad := *fp
	bad.Shingles++
	if _, err := bad.Index(); err == nil {
		t.Error("a fingerprint with a wrong count decodes")
	}
	bad = *fp
	bad.Sample = 10
	if _, err := bad.Index(); err == nil {
		t.Error("a fingerprint with sample 10 decodes")
	}
	y, err := x.Merge(x)
	if err != nil || sharedCount(y.Shared(ev)) != sharedCount(m) {
		t.Errorf("merging an index with itself changes it: %v", err)
	}
}
