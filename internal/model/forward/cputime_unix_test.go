//go:build unix

package forward

import "syscall"

// cpuSeconds is the process's user + system CPU time: under a loaded
// machine, rates per CPU-second are steadier than rates per wall second.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}
