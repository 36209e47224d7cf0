//go:build unix

package calib

import (
	"syscall"
	"time"
)

// processCPU returns the user plus system CPU time of the process so far
// (benchmarks on shared machines report CPU-seconds per expert with it).
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
