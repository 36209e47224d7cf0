package calib

import "testing"

func TestStoreAssembleOptionsValidate(t *testing.T) {
	if err := (StoreAssembleOptions{Dir: "s"}).Validate(); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
	for _, o := range []StoreAssembleOptions{{}, {Dir: "s", Workers: -1}} {
		if o.Validate() == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
