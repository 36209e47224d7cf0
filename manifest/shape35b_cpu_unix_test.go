//go:build unix

package manifest

import "syscall"

// shape35BCPU returns the process's user + system CPU seconds (0 where
// unknown): on a shared machine, bytes per CPU-second are steadier than
// bytes per wall second.
func shape35BCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}
