//go:build unix

package safetensors

import "syscall"

// processCPUTime returns the user+system CPU time this process has used,
// in nanoseconds, so benchmarks on a shared machine can report CPU cost
// next to wall time.
func processCPUTime() (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
