package harness

import (
	"context"
	"testing"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/testdata"
)

// scaled offers some tensors of a source multiplied by a factor.
type scaled struct {
	src    forward.WeightSource
	names  map[string]bool
	factor float32
}

func (s scaled) Shape(name string) ([]int64, bool) {
	if !s.names[name] {
		return nil, false
	}
	return s.src.Shape(name)
}

func (s scaled) Read(name string, dst []float32, start int64) error {
	if err := s.src.Read(name, dst, start); err != nil {
		return err
	}
	for i := range dst {
		dst[i] *= s.factor
	}
	return nil
}

// TestEvaluateChangesMatchesFullRuns: each change's row equals, bit for
// bit, the row of a full forward pass of the changed model scored by
// eval.Evaluate, for a change of one matrix, a change of two layers, and
// a change of part of a routed expert (its gate and up rows, the down
// projection from the fused source tensor); a change of nothing scores KL
// 0 exactly.
func TestEvaluateChangesMatchesFullRuns(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	ref, err := forward.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	ref.Resident = true
	p := ref.Config.Prefix
	recs := readReference(t, dir)
	var windows []eval.Window
	for _, r := range recs[:2] {
		ws, err := eval.StreamWindows(r.Corpus, r.IDs, 96)
		if err != nil {
			t.Fatal(err)
		}
		windows = append(windows, ws[:2]...)
	}
	labels := []string{recs[0].Corpus}
	if recs[1].Corpus != recs[0].Corpus {
		labels = append(labels, recs[1].Corpus)
	}
	changes := []Change{
		{Label: "o_proj", Layers: []int{3}, Src: scaled{ref.Src, map[string]bool{p + "layers.3.self_attn.o_proj.weight": true}, 1.05}},
		{Label: "two layers", Layers: []int{1, 2}, Src: scaled{ref.Src, map[string]bool{p + "layers.1.linear_attn.out_proj.weight": true, p + "layers.2.mlp.shared_expert.down_proj.weight": true}, 0.9}},
		{Label: "expert gate/up", Layers: []int{0}, Src: scaled{perExpert{ref.Src}, map[string]bool{p + "layers.0.mlp.experts.3.gate_proj.weight": true, p + "layers.0.mlp.experts.3.up_proj.weight": true}, 1.3}},
		{Label: "nothing", Layers: []int{2}, Src: scaled{ref.Src, map[string]bool{}, 2}},
	}
	rows, err := EvaluateChanges(context.Background(), ref, changes, windows, labels, ChangeOptions{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	var cands []eval.Model
	var names []string
	for _, c := range changes {
		m, err := forward.New(ref.Config, forward.Overlay{c.Src, perExpert{ref.Src}, ref.Src})
		if err != nil {
			t.Fatal(err)
		}
		cands, names = append(cands, newRunner(m)), append(names, c.Label)
	}
	sc, err := eval.NewScorer(ref.Config.Vocab, names, eval.ScorerOptions{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.Accumulator().SetOrder(labels); err != nil {
		t.Fatal(err)
	}
	rr := newRunner(ref)
	err = eval.Evaluate(context.Background(), sc, rr, cands, windows, eval.EvalOptions{})
	rr.wait()
	for _, c := range cands {
		c.(*runner).wait()
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range changes {
		all := sc.Accumulator().Rows(i)
		want := all[len(all)-1]
		if rows[i] != want {
			t.Errorf("%s: single-change row %+v, full run %+v", c.Label, rows[i], want)
		}
		if c.Label != "nothing" && !(rows[i].MeanKL > 0) {
			t.Errorf("%s: mean KL %v, want > 0", c.Label, rows[i].MeanKL)
		}
	}
	if rows[3].MeanKL != 0 || rows[3].Top1 != 1 {
		t.Errorf("a change of nothing: %+v", rows[3])
	}
	// perExpert's views are the fused tensors' rows.
	pe := perExpert{ref.Src}
	I, H := int64(ref.Config.ExpertInter), int64(ref.Config.Hidden)
	for _, part := range []struct {
		name, fused string
		off         int64
	}{{"gate_proj", "gate_up_proj", 3 * 2 * I * H}, {"up_proj", "gate_up_proj", 3*2*I*H + I*H}, {"down_proj", "down_proj", 3 * H * I}} {
		got, want := make([]float32, I*H), make([]float32, I*H)
		if err := pe.Read(p+"layers.0.mlp.experts.3."+part.name+".weight", got, 0); err != nil {
			t.Fatal(err)
		}
		if err := ref.Src.Read(p+"layers.0.mlp.experts."+part.fused, want, part.off); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: element %d is %v, the fused tensor's %v", part.name, i, got[i], want[i])
			}
		}
	}
	if err := pe.Read(p+"layers.0.mlp.experts.3.down_proj.weight", make([]float32, 2), I*H-1); err == nil {
		t.Error("a read past the expert's down projection accepted")
	}
	if _, err := EvaluateChanges(context.Background(), ref, []Change{{Label: "bad", Layers: []int{2, 1}, Src: ref.Src}}, windows, labels, ChangeOptions{}); err == nil {
		t.Error("descending layers accepted")
	}
}
