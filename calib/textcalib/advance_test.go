package textcalib

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

// TestAdvance: the build reports its progress in rows through layers, one
// measure for one ETA, advancing inside a layer at each forward batch; a
// resumed build counts the finished layers as kept, so its rate leaves
// them out.
func TestAdvance(t *testing.T) {
	out := filepath.Join(t.TempDir(), "store")
	opt := resumeOptions(t, out) // 3 sequences of 32 tokens
	opt.batchRows = 32           // one sequence per batch
	var evs []Advance
	opt.Advance = func(a Advance) { evs = append(evs, a) }
	opt.afterStep = stopAfter(1)
	if _, err := Build(context.Background(), opt); !errors.Is(err, errStop) {
		t.Fatalf("stop after layer 1: %v", err)
	}
	if len(evs) == 0 {
		t.Fatal("no progress")
	}
	first := evs[0]
	// 4 trunk layers of 96 rows and the MTP layer's 93 (one fewer per sequence).
	if first.Layers != 5 || first.RowsTotal != 4*96+93 || first.RowsKept != 0 {
		t.Fatalf("first report %+v: want 5 layers, %d rows, none kept", first, 4*96+93)
	}
	batches := 0
	for i, a := range evs {
		if i > 0 && a.Rows < evs[i-1].Rows {
			t.Errorf("rows went back: %d after %d", a.Rows, evs[i-1].Rows)
		}
		if a.Kind == "batch" && a.Layer == 0 {
			batches++
		}
	}
	if batches != 3 {
		t.Errorf("%d batch reports in layer 0, want one per sequence (3)", batches)
	}
	if l := evs[len(evs)-1]; l.Kind != "layer" || l.Layer != 1 || l.Rows != 2*96 || l.LayerRows != 96 {
		t.Errorf("last report before the stop %+v: want layer 1 written at 192 rows", l)
	}

	evs = nil
	opt.afterStep = nil
	if _, err := Build(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	if f := evs[0]; f.RowsKept != 2*96 || f.Layer != 2 {
		t.Errorf("resumed build's first report %+v: want layers 0 and 1 (192 rows) kept, layer 2 running", f)
	}
	last := evs[len(evs)-1]
	if last.Rows != last.RowsTotal || !last.MTP || last.Kind != "layer" {
		t.Errorf("last report %+v: want the MTP layer written, every row done", last)
	}
	if _, ok := last.ETA(); !ok {
		t.Error("no ETA at the end of the resumed build")
	}
}
