// Package benchenv reads what benchmarks on a shared machine report beside
// their figures: the process's CPU time (work per CPU-second stays
// meaningful when other processes take the cores), the load average, and
// the process's memory high-water marks. Only tests and benchmarks use it;
// it imports nothing of the module.
package benchenv

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// CPUTime returns the user plus system CPU time of the process so far; ok
// is false where the platform does not report it.
func CPUTime() (d time.Duration, ok bool) { return cpuTime() }

// CPU is CPUTime, 0 where unknown.
func CPU() time.Duration {
	d, _ := cpuTime()
	return d
}

// LoadAvg returns the one-minute load average (0 where unknown).
func LoadAvg() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// StatusKiB returns a field of /proc/self/status in KiB (VmHWM, VmRSS,
// …), 0 where unknown.
func StatusKiB(field string) float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				v, _ := strconv.ParseFloat(f[0], 64)
				return v
			}
		}
	}
	return 0
}

// PositiveEnv reads a positive integer benchmark parameter from the
// environment variable name (def when unset); anything else fails tb.
func PositiveEnv(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
