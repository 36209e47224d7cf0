package emulator

import (
	"context"
	"testing"
)

// TestCompareOptionsRefuseNegatives: a negative chunk or worker count is an
// error before anything is read.
func TestCompareOptionsRefuseNegatives(t *testing.T) {
	for _, o := range []CompareOptions{{ChunkTokens: -1}, {Workers: -2}} {
		if _, err := CompareLogits(context.Background(), nil, nil, nil, nil, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if err := (CompareOptions{}).Validate(); err != nil {
		t.Error(err)
	}
}
