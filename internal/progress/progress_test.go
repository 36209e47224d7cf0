package progress

import (
	"testing"
	"time"
)

func TestETA(t *testing.T) {
	cases := []struct {
		elapsed           time.Duration
		done, kept, total float64
		want              time.Duration
		ok                bool
	}{
		{10 * time.Second, 25, 0, 100, 30 * time.Second, true},
		{10 * time.Second, 50, 25, 100, 20 * time.Second, true}, // kept work took no time
		{10 * time.Second, 25, 25, 100, 0, false},               // nothing done by this run yet
		{0, 25, 0, 100, 0, false},
		{10 * time.Second, 100, 0, 100, 0, true},
		{10 * time.Second, 120, 0, 100, 0, false}, // done past total: no estimate
	}
	for _, c := range cases {
		got, ok := ETA(c.elapsed, c.done, c.kept, c.total)
		if got != c.want || ok != c.ok {
			t.Errorf("ETA(%v, %v, %v, %v) = %v %v, want %v %v", c.elapsed, c.done, c.kept, c.total, got, ok, c.want, c.ok)
		}
	}
}
