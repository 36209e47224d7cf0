package tokenizer

// mergeTable maps a pair of token ids to its merge rule: an open-addressing
// hash table with linear probing, sized to at most half full, each slot one
// 16-byte record so that a probe touches one cache line. It is built once
// and then only read.
type mergeTable struct {
	slots []mergeSlot
	shift uint
	n     int
}

type mergeSlot struct {
	key1 uint64 // pair key + 1; 0 marks an empty slot
	merge
}

func newMergeTable(n int) *mergeTable {
	size, shift := 2, uint(63)
	for size < 2*n {
		size <<= 1
		shift--
	}
	return &mergeTable{slots: make([]mergeSlot, size), shift: shift}
}

func (m *mergeTable) index(key uint64) uint64 { return (key * 0x9E3779B97F4A7C15) >> m.shift }

// set stores the rule of key, replacing an earlier one.
func (m *mergeTable) set(key uint64, v merge) {
	mask := uint64(len(m.slots) - 1)
	for i := m.index(key); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key1 == 0 {
			*s = mergeSlot{key1: key + 1, merge: v}
			m.n++
			return
		}
		if s.key1 == key+1 {
			s.merge = v
			return
		}
	}
}

func (m *mergeTable) get(key uint64) (merge, bool) {
	mask := uint64(len(m.slots) - 1)
	for i := m.index(key); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key1 == key+1 {
			return s.merge, true
		}
		if s.key1 == 0 {
			return merge{}, false
		}
	}
}
