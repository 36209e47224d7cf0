package model

import (
	"fmt"
	"testing"
)

func TestExpertParts(t *testing.T) {
	got, err := ExpertParts("model.language_model.layers.2.mlp.experts.5.gate_up_proj", 5, []int64{256, 128})
	if err != nil {
		t.Fatal(err)
	}
	want := "[{model.language_model.layers.2.mlp.experts.5.gate_proj.weight 0 [128 128]} {model.language_model.layers.2.mlp.experts.5.up_proj.weight 16384 [128 128]}]"
	if fmt.Sprint(got) != want {
		t.Errorf("gate_up: %v\nwant %s", got, want)
	}
	got, err = ExpertParts("mtp.layers.0.mlp.experts.7.down_proj", 7, []int64{128, 64})
	if err != nil || fmt.Sprint(got) != "[{mtp.layers.0.mlp.experts.7.down_proj.weight 0 [128 64]}]" {
		t.Errorf("down: %v, %v", got, err)
	}
	for _, c := range []struct {
		name  string
		shape []int64
	}{{"layers.0.mlp.experts.1.gate_up_proj", []int64{255, 128}}, {"layers.0.mlp.gate.weight", []int64{16, 128}}, {"layers.0.mlp.experts.1.other", []int64{4, 4}}, {"layers.0.mlp.experts.1.down_proj", []int64{4}}} {
		if _, err := ExpertParts(c.name, 1, c.shape); err == nil {
			t.Errorf("%s %v accepted", c.name, c.shape)
		}
	}
}
