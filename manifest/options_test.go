package manifest

import (
	"context"
	"testing"
)

// TestVerifyOptionsRefuseNegatives: a negative worker count or manifest
// cap is an error, not the default.
func TestVerifyOptionsRefuseNegatives(t *testing.T) {
	for _, o := range []VerifyOptions{{Workers: -1}, {MaxManifestBytes: -1}} {
		if _, err := Verify(context.Background(), t.TempDir(), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}
