// Package benchenv reads what benchmarks on a shared machine report beside
// their figures: the process's CPU time (work per CPU-second stays
// meaningful when other processes take the cores), the load average, and
// the process's memory high-water marks. Only tests and benchmarks use it;
// it imports nothing of the module.
package benchenv

import (
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// GoMemory samples the memory the Go runtime has mapped and not released
// (/memory/classes/total minus heap/released) from Start until Stop, every
// interval: a benchmark's peak beside its starting point.
type GoMemory struct {
	Base uint64 // at Start
	peak atomic.Uint64
	done chan struct{}
	wg   sync.WaitGroup
}

// goMapped reads the runtime's mapped, unreleased bytes.
func goMapped() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}

// StartGoMemory starts sampling; call Stop when the measured work is done.
func StartGoMemory(interval time.Duration) *GoMemory {
	m := &GoMemory{Base: goMapped(), done: make(chan struct{})}
	m.peak.Store(m.Base)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		tk := time.NewTicker(interval)
		defer tk.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-tk.C:
				if v := goMapped(); v > m.peak.Load() {
					m.peak.Store(v)
				}
			}
		}
	}()
	return m
}

// Stop ends the sampling and returns the peak seen.
func (m *GoMemory) Stop() uint64 {
	close(m.done)
	m.wg.Wait()
	return m.peak.Load()
}
