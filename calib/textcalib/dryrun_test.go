package textcalib

import (
	"math"
	"testing"

	"github.com/ttquant/ttquant/internal/model"
)

// TestForwardMemory35B: at the 35B's width the estimate is the figures
// docs/distributed.md quotes: a process of all 128 × 2,048 tokens, and a
// worker of 16 and of 4.
func TestForwardMemory35B(t *testing.T) {
	cfg := &model.Config{Hidden: 2048}
	for _, c := range []struct {
		tokens int64
		gib    float64
	}{{1 << 18, 12.7}, {1 << 14, 2.2}, {1 << 16, 4.3}} {
		got := float64(ForwardMemory(cfg, c.tokens)) / (1 << 30)
		if math.Abs(got-c.gib) > 0.05 {
			t.Errorf("%d tokens: %.2f GiB, want about %.1f", c.tokens, got, c.gib)
		}
	}
}
