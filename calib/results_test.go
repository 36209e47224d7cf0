package calib

import (
	"context"
	"reflect"
	"testing"

	"github.com/ttquant/ttquant/internal/model"
)

// TestLayerRun: ranging over a LayerRun gives the results and the report
// the emit form gives; leaving the loop early stops the run with an error.
func TestLayerRun(t *testing.T) {
	cfg := model.MoEConfig{Hidden: 64, Experts: 4, TopK: 2, ExpertInter: 16, SharedInter: 16, NormTopK: true}
	l := testLayer(cfg, 5)
	cal, held := activations(t, 0, 256, 64, 2), activations(t, 256, 64, 64, 2)
	opt := LayerOptions{Workers: 2}
	wantRep, want := collect(t, l, cal, held, opt)

	run := NewLayerRun(context.Background(), l, cal, held, opt)
	var got []*ExpertResult
	for r := range run.Results() {
		got = append(got, r)
	}
	rep, err := run.Report()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rep, wantRep) || !reflect.DeepEqual(got, want) {
		t.Error("the iterator's results or report differ from the emit form's")
	}

	run = NewLayerRun(context.Background(), l, cal, held, opt)
	n := 0
	for range run.Results() {
		n++
		break
	}
	if _, err := run.Report(); err == nil || n != 1 {
		t.Errorf("early exit after %d results: report error %v", n, err)
	}
	for range run.Results() {
		t.Fatal("a run was ranged over twice")
	}
	if _, err := NewLayerRun(context.Background(), l, cal, held, opt).Report(); err == nil {
		t.Error("Report before the run")
	}
}
