package gptq

import "github.com/ttquant/ttquant/internal/kernels"

// pool32 and pool64 keep a few large work buffers (Hessian copies, inverse
// factors, working weights) for the next solve; see kernels.BoundedPool.
var (
	pool32 = kernels.BoundedPool[float32]{Slots: 8}
	pool64 = kernels.BoundedPool[float64]{Slots: 8}
)

// getBuf returns a pooled slice of n values of type T with arbitrary
// contents; putBuf hands it back (it must not be used afterwards, and
// must not be handed back twice).
func getBuf[T float](n int) []T {
	var zero T
	if _, ok := any(zero).(float32); ok {
		return any(pool32.Get(n)).([]T)
	}
	return any(pool64.Get(n)).([]T)
}

func putBuf[T float](b []T) {
	switch b := any(b).(type) {
	case []float32:
		pool32.Put(b)
	case []float64:
		pool64.Put(b)
	}
}
