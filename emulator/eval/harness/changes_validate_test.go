package harness

import "testing"

func TestChangeOptionsValidate(t *testing.T) {
	if err := (ChangeOptions{}).Validate(); err != nil {
		t.Errorf("the zero options refused: %v", err)
	}
	for _, o := range []ChangeOptions{{Chunk: -1}, {Workers: -2}} {
		if o.Validate() == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
