package kernels

import "sync"

var (
	pool32 sync.Pool // *[]float32
	pool64 sync.Pool // *[]float64
)

// getBuf returns a scratch slice of length n from a pool; its contents are
// arbitrary. putBuf returns it.
func getBuf[T float32 | float64](n int) *[]T {
	var p *sync.Pool
	var zero T
	switch any(zero).(type) {
	case float32:
		p = &pool32
	default:
		p = &pool64
	}
	if v, ok := p.Get().(*[]T); ok && cap(*v) >= n {
		*v = (*v)[:n]
		return v
	}
	s := make([]T, n)
	return &s
}

func putBuf[T float32 | float64](b *[]T) {
	var zero T
	switch any(zero).(type) {
	case float32:
		pool32.Put(b)
	default:
		pool64.Put(b)
	}
}

// BoundedPool is a free list of large buffers (n×n matrices, working
// copies of weights) kept for the next Hessian or solve. Unlike sync.Pool
// it is not emptied by garbage collections, which the large allocations
// it serves trigger every time, and it is bounded: at most Slots buffers
// stay alive, so the memory it holds does not grow with the number of
// matrices processed. The zero value holds nothing; a BoundedPool is safe
// for concurrent use.
type BoundedPool[T float32 | float64] struct {
	// Slots is the number of buffers kept; 0 keeps none.
	Slots int

	mu   sync.Mutex
	free [][]T
}

// Get returns a slice of n values with arbitrary contents: the smallest
// pooled buffer that is large enough, or a new one.
func (p *BoundedPool[T]) Get(n int) []T {
	p.mu.Lock()
	defer p.mu.Unlock()
	best := -1
	for i, b := range p.free {
		if cap(b) >= n && (best < 0 || cap(b) < cap(p.free[best])) {
			best = i
		}
	}
	if best < 0 {
		return make([]T, n)
	}
	b := p.free[best]
	p.free[best] = p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return b[:n]
}

// Put hands b back (it must not be used afterwards, nor handed back
// twice); when the pool is full the smallest buffer is dropped.
func (p *BoundedPool[T]) Put(b []T) {
	if cap(b) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < p.Slots {
		p.free = append(p.free, b)
		return
	}
	if len(p.free) == 0 {
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
