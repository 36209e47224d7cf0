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
