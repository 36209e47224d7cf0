package selection

import (
	"testing"

	"github.com/ttquant/ttquant/internal/shard"
)

// TestSplitOptionsValidate: the split measurement's two options structs
// refuse what cannot run, and accept a complete value.
func TestSplitOptionsValidate(t *testing.T) {
	for _, o := range []ShardOptions{{}, {Spec: shard.Spec{Index: 0, Count: 2}}} {
		if o.Validate() == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if err := (ShardOptions{Spec: shard.Spec{Index: 1, Count: 2}, SensitivityFile: "s.json"}).Validate(); err != nil {
		t.Error(err)
	}
	for _, o := range []MeasureAssembleOptions{{}, {Dir: "d", Workers: -1}} {
		if o.Validate() == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if err := (MeasureAssembleOptions{Dir: "d"}).Validate(); err != nil {
		t.Error(err)
	}
}
