package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
)

var maxWorkers atomic.Int64

// SetWorkers sets how many goroutines the kernels may use at once and
// returns the previous setting. n <= 0 restores the default,
// runtime.GOMAXPROCS(0). Results never depend on this setting: every output
// element is computed by one goroutine in an order fixed by the blocking
// constants alone.
func SetWorkers(n int) int {
	prev := Workers()
	if n <= 0 {
		n = 0
	}
	maxWorkers.Store(int64(n))
	return prev
}

// Workers returns the number of goroutines the kernels use.
func Workers() int {
	if n := maxWorkers.Load(); n > 0 {
		return int(n)
	}
	return runtime.GOMAXPROCS(0)
}

// ParallelFor runs f(task, worker) for task = 0..n-1 on up to workers
// goroutines (on the calling goroutine when workers <= 1 or n <= 1);
// worker is in [0, workers) and identifies per-goroutine scratch space.
// Tasks are handed out in increasing order. It returns when every task
// has finished. The calling goroutine runs tasks too, with the helpers of
// a persistent worker team (see team.go) when the team is free.
func ParallelFor(n, workers int, f func(task, worker int)) {
	parallelForSide(n, workers, f, nil)
}

// parallelForSide is ParallelFor with a side job: side (when not nil)
// runs on the calling goroutine before it takes tasks, while the other
// goroutines start on the tasks at once. With one goroutine it runs side
// first, then the tasks.
func parallelForSide(n, workers int, f func(task, worker int), side func()) {
	if workers > n {
		workers = n
	}
	if workers <= 1 {
		if side != nil {
			side()
		}
		for t := 0; t < n; t++ {
			f(t, 0)
		}
		return
	}
	if teamFor(n, workers, f, side) {
		return
	}
	// The team is busy: goroutines of our own, the caller being worker 0.
	j := &teamJob{n: n, f: f}
	var wg sync.WaitGroup
	wg.Add(workers - 1)
	for w := 1; w < workers; w++ {
		go func(w int) {
			defer wg.Done()
			j.run(w)
		}(w)
	}
	if side != nil {
		side()
	}
	j.run(0)
	wg.Wait()
}

// ParallelRows runs f over contiguous ranges covering [0, n) on up to
// Workers() goroutines, or on the calling goroutine alone when n·rowWork
// (elements touched) is too small to be worth it. f must treat the rows
// of different ranges independently; the split never changes results.
func ParallelRows(n, rowWork int, f func(r0, r1 int)) {
	w := Workers()
	if w <= 1 || n <= 1 || float64(n)*float64(rowWork) < 1<<15 {
		f(0, n)
		return
	}
	chunks := min(n, 4*w)
	ParallelFor(chunks, w, func(t, _ int) { f(t*n/chunks, (t+1)*n/chunks) })
}
