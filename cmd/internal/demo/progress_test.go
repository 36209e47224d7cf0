package demo

import (
	"testing"
	"time"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/manifest/build"
)

// TestMeterOneMeasure: the command's progress advances through every step
// in one measure, never backwards, and its ETA covers the steps to come:
// halfway through the build the ETA is the build's rest plus the
// evaluation at the build's rate.
func TestMeterOneMeasure(t *testing.T) {
	o := Options{Sequences: 4, SeqLen: 100, EvalSequences: 2, EvalSeqLen: 100} // build 800 tokens, evaluation 600
	clock := time.Unix(0, 0)
	var got []Progress
	o.Progress = func(p Progress) { got = append(got, p) }
	m := newMeter(&o)
	m.now = func() time.Time { return clock }
	m.start = clock

	m.begin(stepGPTQ)
	clock = clock.Add(40 * time.Second)
	m.build(build.ProgressEvent{Kind: "file", Layer: 0, Work: 5, WorkTotal: 10, LayerWork: 1, LayerWorkTotal: 2})
	half := got[len(got)-1]
	if half.Done != 400 || half.Total != 1400 {
		t.Fatalf("halfway through the build: done %v of %v tokens, want 400 of 1400", half.Done, half.Total)
	}
	// The build's rest: 40 s more; the evaluation: 600 tokens at 0.1 s.
	if eta, ok := half.ETA(); !ok || eta != 100*time.Second {
		t.Errorf("ETA halfway through the build: %v %v, want 1m40s", eta, ok)
	}
	if half.Layer != 0 || half.LayerShare != 0.5 || half.Step != 1 || half.Steps != 4 || half.Name != "sequential GPTQ" {
		t.Errorf("halfway: %+v", half)
	}
	clock = clock.Add(40 * time.Second)
	m.build(build.ProgressEvent{Kind: "layer", Layer: 0, Work: 10, WorkTotal: 10})
	m.begin(stepRTN)
	m.build(build.ProgressEvent{Kind: "layer", Layer: 0, Work: 3, WorkTotal: 10})
	m.begin(stepVerify)
	m.begin(stepEval)
	clock = clock.Add(30 * time.Second)
	m.eval(eval.Progress{Scored: 100, ScoredDone: 50})
	last := got[len(got)-1]
	if last.Done != 1100 {
		t.Errorf("halfway through the evaluation: done %v tokens, want 1100", last.Done)
	}
	if eta, ok := last.ETA(); !ok || eta != 30*time.Second {
		t.Errorf("ETA halfway through the evaluation: %v %v, want its own rate's 30s", eta, ok)
	}
	m.done()
	prev := -1.0
	layers := 0
	for _, p := range got {
		if p.Done < prev {
			t.Errorf("progress went back: %v after %v", p.Done, prev)
		}
		prev = p.Done
		if p.Kind == "layer" {
			layers++
		}
	}
	if layers != 1 {
		t.Errorf("%d layer milestones, want 1 (the rounding's layers are not the sequential pass's)", layers)
	}
	if end := got[len(got)-1]; end.Kind != "done" || end.Share() != 1 {
		t.Errorf("last event %+v, want done at 100%%", end)
	}
}
