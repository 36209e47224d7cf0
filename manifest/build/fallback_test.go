package build

import (
	"context"
	"errors"
	"testing"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/model"
)

// TestHessianFallbacksAreTyped: every reason the Hessian source gives for
// a matrix GPTQ cannot run on is a calib.FallbackError of kind
// calib.ErrNoInputs (errors.Is works), with the text the manifest records.
func TestHessianFallbacksAreTyped(t *testing.T) {
	s := &storeHessians{store: &memSites{}, family: model.Qwen3, cache: map[string]*hessEntry{}, roles: map[string]string{
		"lm_head.weight":                         string(model.RoleLMHead),
		"model.layers.0.self_attn.q_proj.weight": string(model.RoleAttnQ),
		"model.layers.0.mlp.down_proj.weight":    string(model.RoleMLPDown),
	}}
	for _, c := range []struct {
		tensor string
		layer  int
		want   string
	}{
		{"lm_head.weight", -1, "no calibration inputs are defined for this matrix"},
		{"model.layers.0.self_attn.q_proj.weight", 0, `calibration store has no "attn" inputs for layer 0`},
		{"model.layers.0.mlp.down_proj.weight", 0, "the layer's gate and up projections, whose output feeds this matrix, were not found"},
	} {
		h, _, fb, err := s.Hessian(context.Background(), c.tensor, c.layer, -1, 8)
		if err != nil || h != nil || fb == nil {
			t.Fatalf("%s: h %v, fallback %v, err %v: want a fallback", c.tensor, h != nil, fb, err)
		}
		if !errors.Is(fb, calib.ErrNoInputs) {
			t.Errorf("%s: fallback %v is not calib.ErrNoInputs", c.tensor, fb)
		}
		if fb.Error() != c.want {
			t.Errorf("%s: fallback text %q, want %q", c.tensor, fb.Error(), c.want)
		}
	}
}

// TestFallbackText: the fallback reasons' texts are the ones manifests
// have always recorded, and the underlying error stays reachable.
func TestFallbackText(t *testing.T) {
	cause := errors.New("solver exploded")
	for _, c := range []struct {
		fb   *calib.FallbackError
		kind error
		want string
	}{
		{calib.Fallback(calib.ErrGPTQFailed, "gptq", cause), calib.ErrGPTQFailed, "gptq: solver exploded"},
		{calib.Fallback(calib.ErrGPTQFailed, "", cause), calib.ErrGPTQFailed, "GPTQ failed: solver exploded"},
		{calib.Fallback(calib.ErrNoCalibration, "", nil), calib.ErrNoCalibration, "no calibration data"},
	} {
		if c.fb.Error() != c.want || !errors.Is(c.fb, c.kind) {
			t.Errorf("%v: text %q, want %q and kind %v", c.fb, c.fb.Error(), c.want, c.kind)
		}
		if c.fb.Err != nil && !errors.Is(c.fb, cause) {
			t.Errorf("%v: the cause is not reachable", c.fb)
		}
	}
}
