package kernels

import "testing"

// TestBoundedPool checks the two promises of the pool: Get hands out the
// smallest kept buffer that is large enough, and no more than Slots
// buffers are kept (a full pool drops its smallest).
func TestBoundedPool(t *testing.T) {
	p := BoundedPool[float64]{Slots: 2}
	p.Put(make([]float64, 10))
	p.Put(make([]float64, 30))
	p.Put(make([]float64, 20)) // full: replaces the 10
	if got := len(p.free); got != 2 {
		t.Fatalf("%d buffers kept, want 2", got)
	}
	if b := p.Get(15); cap(b) != 20 || len(b) != 15 {
		t.Fatalf("Get(15): len %d cap %d, want the 20-value buffer", len(b), cap(b))
	}
	if b := p.Get(25); cap(b) != 30 {
		t.Fatalf("Get(25): cap %d, want the 30-value buffer", cap(b))
	}
	if b := p.Get(5); cap(b) != 5 {
		t.Fatalf("Get(5) on an empty pool: cap %d, want a new buffer of 5", cap(b))
	}
	var none BoundedPool[float32]
	none.Put(make([]float32, 4))
	if len(none.free) != 0 {
		t.Fatal("the zero pool kept a buffer")
	}
}
