package kernels

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// checkParallelFor runs ParallelFor(n, workers) and checks that every task
// ran exactly once, that worker ids are in range and that no worker id was
// in use by two tasks at the same time (per-worker scratch space relies on
// it). inner, when > 0, makes every task start a nested ParallelFor of
// that many tasks, which must not deadlock on the busy team.
func checkParallelFor(n, workers, inner int) error {
	runs := make([]atomic.Int32, n)
	inUse := make([]atomic.Int32, max(workers, 1))
	var bad atomic.Value
	ParallelFor(n, workers, func(task, w int) {
		if w < 0 || w >= len(inUse) {
			bad.Store(fmt.Sprintf("task %d got worker id %d of %d", task, w, workers))
			return
		}
		if inUse[w].Add(1) != 1 {
			bad.Store(fmt.Sprintf("worker id %d used by two tasks at once", w))
		}
		runs[task].Add(1)
		if inner > 0 {
			var sum atomic.Int64
			ParallelFor(inner, workers, func(t, _ int) { sum.Add(int64(t)) })
			if got, want := sum.Load(), int64(inner*(inner-1)/2); got != want {
				bad.Store(fmt.Sprintf("nested region summed %d, want %d", got, want))
			}
		}
		inUse[w].Add(-1)
	})
	if v := bad.Load(); v != nil {
		return fmt.Errorf("n=%d workers=%d: %s", n, workers, v)
	}
	for i := range runs {
		if c := runs[i].Load(); c != 1 {
			return fmt.Errorf("n=%d workers=%d: task %d ran %d times", n, workers, i, c)
		}
	}
	return nil
}

func TestParallelForTeam(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 5} {
		for _, n := range []int{0, 1, 2, 7, 300} {
			if err := checkParallelFor(n, workers, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := checkParallelFor(20, workers, 13); err != nil {
			t.Fatal(err)
		}
	}
	// After the helpers have parked, the next region must wake them.
	time.Sleep(3 * teamSpin)
	if err := checkParallelFor(100, 2, 0); err != nil {
		t.Fatal(err)
	}
	// Several callers at once: one gets the team, the others start
	// goroutines of their own.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := 0; it < 50; it++ {
				if err := checkParallelFor(40, 1+(g+it)%4, 0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// BenchmarkParallelForRegion times one parallel region of two tiny tasks
// per worker back to back: the fork/join cost the blocked
// factorizations pay about ten times per block step.
func BenchmarkParallelForRegion(b *testing.B) {
	for _, w := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			var sink [8]atomic.Int64
			for i := 0; i < b.N; i++ {
				ParallelFor(2*w, w, func(t, wk int) { sink[wk].Add(int64(t)) })
			}
		})
	}
}

// TestParallelForSide checks that the side job runs exactly once, on the
// calling goroutine before it takes a task, with the team free or busy
// and with one worker, and that every task still runs once.
func TestParallelForSide(t *testing.T) {
	for _, workers := range []int{1, 2, 3} {
		for _, busy := range []bool{false, true} {
			var sides, tasks atomic.Int32
			callerTasks := -1
			run := func() {
				parallelForSide(50, workers, func(task, w int) {
					tasks.Add(1)
					if w == 0 && callerTasks < 0 {
						callerTasks = int(sides.Load()) // the side job must be done
					}
				}, func() { sides.Add(1) })
			}
			if busy {
				// Inside a task of another region the team is busy.
				ParallelFor(2, 2, func(task, _ int) {
					if task == 0 {
						run()
					}
				})
			} else {
				run()
			}
			if sides.Load() != 1 || tasks.Load() != 50 {
				t.Fatalf("workers=%d busy=%v: side ran %d times, %d of 50 tasks", workers, busy, sides.Load(), tasks.Load())
			}
			if callerTasks == 0 {
				t.Fatalf("workers=%d busy=%v: the caller took a task before its side job", workers, busy)
			}
		}
	}
}
