package tokenizer

import (
	"math/rand/v2"
	"testing"
)

// TestMergeTable checks the open-addressing table against a Go map,
// including the zero key, overwrites and absent keys.
func TestMergeTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	ref := map[uint64]merge{}
	m := newMergeTable(5000)
	for i := 0; i < 5000; i++ {
		k := pairKey(int32(rng.IntN(300)), int32(rng.IntN(300)))
		if i == 0 {
			k = 0 // ids 0 and 0
		}
		v := merge{rank: int32(i), id: int32(rng.IntN(1 << 20))}
		m.set(k, v)
		ref[k] = v
	}
	if m.n != len(ref) {
		t.Fatalf("%d entries, want %d", m.n, len(ref))
	}
	for a := int32(0); a < 310; a++ {
		for b := int32(0); b < 310; b++ {
			k := pairKey(a, b)
			got, ok := m.get(k)
			want, wok := ref[k]
			if ok != wok || got != want {
				t.Fatalf("key (%d,%d): %v %v, want %v %v", a, b, got, ok, want, wok)
			}
		}
	}
}
