package benchenv

import (
	"runtime"
	"testing"
	"time"
)

func TestReadings(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	c0, ok := CPUTime()
	if !ok {
		t.Fatal("no CPU time on linux")
	}
	x := 0
	for i := 0; i < 50_000_000; i++ {
		x += i ^ (x >> 3)
	}
	if c1 := CPU(); c1 <= c0 || x == 42 {
		t.Errorf("CPU time %v then %v after a busy loop", c0, c1)
	}
	if LoadAvg() < 0 {
		t.Error("negative load average")
	}
	// (The kernel updates VmHWM lazily: it may trail VmRSS.)
	if hwm, rss := StatusKiB("VmHWM"), StatusKiB("VmRSS"); !(hwm > 0 && rss > 0) {
		t.Errorf("VmHWM %g KiB, VmRSS %g KiB", hwm, rss)
	}
	if StatusKiB("NoSuchField") != 0 {
		t.Error("an unknown field read as non-zero")
	}
}

var sink []byte

func TestGoMemory(t *testing.T) {
	m := StartGoMemory(time.Millisecond)
	sink = make([]byte, 64<<20)
	for i := range sink {
		sink[i] = byte(i)
	}
	time.Sleep(20 * time.Millisecond)
	peak := m.Stop()
	if peak < m.Base+32<<20 {
		t.Errorf("peak %d bytes, base %d: a 64 MiB allocation not seen", peak, m.Base)
	}
	sink = nil
}
