package gptq

import "sync"

// bufPool keeps a few large work buffers (Hessian copies, inverse factors,
// working weights) for the next solve. Unlike sync.Pool it is not emptied
// by garbage collections, which the large allocations of a solve trigger
// every time, and it is bounded: at most poolSlots buffers per element
// type stay alive between solves, so the memory it holds does not grow
// with the number of matrices quantized.
type bufPool[T float] struct {
	mu   sync.Mutex
	free [][]T
}

const poolSlots = 8

var (
	pool32 bufPool[float32]
	pool64 bufPool[float64]
)

// get returns a slice of n values with arbitrary contents: the smallest
// pooled buffer that is large enough, or a new one.
func (p *bufPool[T]) get(n int) []T {
	p.mu.Lock()
	best := -1
	for i, b := range p.free {
		if cap(b) >= n && (best < 0 || cap(b) < cap(p.free[best])) {
			best = i
		}
	}
	if best >= 0 {
		b := p.free[best]
		p.free[best] = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]T, n)
}

// put hands b back; when the pool is full the smallest buffer is dropped.
func (p *bufPool[T]) put(b []T) {
	if cap(b) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < poolSlots {
		p.free = append(p.free, b)
		return
	}
	small := 0
	for i, f := range p.free {
		if cap(f) < cap(p.free[small]) {
			small = i
		}
	}
	if cap(b) > cap(p.free[small]) {
		p.free[small] = b
	}
}

// getBuf returns a pooled slice of n values of type T with arbitrary
// contents; putBuf hands it back (it must not be used afterwards, and
// must not be handed back twice).
func getBuf[T float](n int) []T {
	var zero T
	if _, ok := any(zero).(float32); ok {
		return any(pool32.get(n)).([]T)
	}
	return any(pool64.get(n)).([]T)
}

func putBuf[T float](b []T) {
	switch b := any(b).(type) {
	case []float32:
		pool32.put(b)
	case []float64:
		pool64.put(b)
	}
}
