//go:build unix

package tokenizer

import (
	"syscall"
	"time"
)

// cpuTime returns the process's user+system CPU time, so that benchmarks on
// a shared machine can also report throughput per CPU-second.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
