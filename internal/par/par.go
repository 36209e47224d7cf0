// Package par holds the module's one loop over independent tasks with a
// bounded number of goroutines, an error stop and cancellation.
package par

import (
	"context"
	"sync"
)

// For runs fn(0..n-1) on up to workers goroutines, stopping at the
// first error or when ctx is done. The error returned is the one of the
// lowest index that failed, so it does not depend on scheduling.
func For(ctx context.Context, n, workers int, fn func(i int) error) error {
	if workers < 1 {
		workers = 1
	}
	errs := make([]error, n)
	var mu sync.Mutex
	next := 0
	failed := false
	var wg sync.WaitGroup
	for w := 0; w < workers && w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if failed || next >= n {
					mu.Unlock()
					return
				}
				i := next
				next++
				mu.Unlock()
				if err := ctx.Err(); err != nil {
					errs[i] = err
					mu.Lock()
					failed = true
					mu.Unlock()
					return
				}
				if err := fn(i); err != nil {
					errs[i] = err
					mu.Lock()
					failed = true
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return ctx.Err()
}
