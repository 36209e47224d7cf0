package kernels

import (
	"runtime"
	"sync/atomic"
	"time"
)

// The worker team: long-lived helper goroutines that run the tasks of
// ParallelFor together with the calling goroutine.
//
// Starting goroutines for every parallel region and waiting on a
// WaitGroup costs little CPU but much latency: the goroutines need an
// idle processor, and waking one (an operating-system thread parked in
// the kernel) takes tens of microseconds on a virtual machine. The
// inverse factor of order 512 had about a hundred such regions (now
// about twenty), most of them a few tens of microseconds long, so that
// latency ate most of what a second core could give. The helpers instead poll for the next region
// for a short while after finishing one (teamSpin), yielding the
// processor between polls, and only then park on a channel; the caller
// runs tasks itself instead of sleeping until the helpers are done.
//
// One region at a time uses the team. A ParallelFor that finds the team
// busy (another goroutine's region, or a region started from inside a
// task) starts goroutines for itself as before. Which goroutine runs
// which task never changes results (see SetWorkers), so neither does the
// team.

// teamSpin is how long an idle helper keeps polling for the next region
// before it parks: longer than most gaps between the regions of one
// factorization or solve (the diagonal blocks' scalar work overlaps a
// product), short enough that the polling costs little CPU time when
// the caller has serial work to do.
//
// callerSpin is how long the caller polls for the helpers' last tasks
// before it parks.
const (
	teamSpin   = 100 * time.Microsecond
	callerSpin = 20 * time.Microsecond
)

type teamJob struct {
	n      int
	f      func(task, worker int)
	limit  int64        // goroutines allowed, the caller included
	next   atomic.Int64 // next task to hand out
	slots  atomic.Int64 // worker ids handed out to helpers (the caller is 0)
	active atomic.Int64 // helpers that may still run a task

	// The caller, once out of tasks, polls active for a while
	// (callerSpin) and then parks on done; the helper that brings active
	// to zero while waiting is set wakes it.
	waiting atomic.Bool
	done    chan struct{}
}

// run takes tasks until none are left.
func (j *teamJob) run(worker int) {
	for {
		t := int(j.next.Add(1) - 1)
		if t >= j.n {
			return
		}
		j.f(t, worker)
	}
}

// join is a helper's part in a region: it takes a worker id, registers
// as active before taking its first task (so that the caller, who waits
// until no helper is active once every task has been handed out, never
// returns while a task runs), and runs tasks.
func (j *teamJob) join() {
	id := j.slots.Add(1)
	if id >= j.limit {
		return
	}
	j.active.Add(1)
	j.run(int(id))
	if j.active.Add(-1) == 0 && j.waiting.Load() && j.waiting.CompareAndSwap(true, false) {
		j.done <- struct{}{}
	}
}

// wait returns once no helper is running a task of j (the caller has
// taken the last one). The helpers' last tasks are short (one block of a
// product), so it polls first, yielding the processor to them if they
// share it, and parks only when they take longer: a parked caller costs a
// wake-up, a polling one the CPU time of a core.
func (j *teamJob) wait() {
	start := time.Now()
	for spins := 0; j.active.Load() != 0; spins++ {
		if spins&15 != 15 {
			continue
		}
		if time.Since(start) < callerSpin {
			runtime.Gosched()
			continue
		}
		j.waiting.Store(true)
		if j.active.Load() == 0 && j.waiting.CompareAndSwap(true, false) {
			return
		}
		<-j.done
		return
	}
}

type teamHelper struct {
	parked atomic.Bool
	wake   chan struct{} // one token per successful parked true→false
}

var team struct {
	busy    atomic.Bool
	job     atomic.Pointer[teamJob]
	helpers []*teamHelper // grown only by the goroutine that set busy
}

func (h *teamHelper) loop() {
	var last *teamJob
	idleSince := time.Now()
	for spins := 0; ; spins++ {
		if j := team.job.Load(); j != nil && j != last {
			last = j
			j.join()
			idleSince = time.Now()
			spins = 0
			continue
		}
		if spins&63 != 63 {
			continue
		}
		if time.Since(idleSince) < teamSpin {
			runtime.Gosched()
			continue
		}
		// Park. A poster stores the job before it looks at parked; a
		// helper sets parked before it looks at the job. So either the
		// helper sees the new job here, or the poster sees parked and
		// sends a token.
		h.parked.Store(true)
		if j := team.job.Load(); j != nil && j != last {
			if !h.parked.CompareAndSwap(true, false) {
				<-h.wake // the poster got there first: take its token
			}
		} else {
			<-h.wake
		}
		idleSince = time.Now()
		spins = 0
	}
}

// teamFor runs f over n tasks on the calling goroutine and up to
// workers-1 helpers, and reports false (doing nothing) when the team is
// in use. side, when not nil, runs on the calling goroutine before it
// takes tasks.
func teamFor(n, workers int, f func(task, worker int), side func()) bool {
	if !team.busy.CompareAndSwap(false, true) {
		return false
	}
	defer team.busy.Store(false)
	need := workers - 1
	for len(team.helpers) < need {
		h := &teamHelper{wake: make(chan struct{}, 1)}
		team.helpers = append(team.helpers, h)
		go h.loop()
	}
	j := &teamJob{n: n, f: f, limit: int64(workers), done: make(chan struct{}, 1)}
	team.job.Store(j)
	for _, h := range team.helpers[:need] {
		if h.parked.Load() && h.parked.CompareAndSwap(true, false) {
			h.wake <- struct{}{}
		}
	}
	if side != nil {
		side()
	}
	j.run(0)
	// Every task has been handed out; wait for the helpers still in one.
	j.wait()
	// Helpers that join from now on find no task and leave at once.
	return true
}
