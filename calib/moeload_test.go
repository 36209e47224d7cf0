package calib

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/testmodel"
)

// TestLoadMoELayerMatchesForward: the block LoadMoELayer reads gives the
// same bits as the one the forward pass reads through its weight source, in
// both expert layouts, so what calibration records is what the forward pass
// computes.
func TestLoadMoELayerMatchesForward(t *testing.T) {
	for _, v := range []testmodel.Variant{testmodel.Default, testmodel.PerExpert} {
		sm, cfg, _ := tinyModel(t, v)
		fm, err := forward.Open(sm.Path())
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, 53*cfg.Hidden)
		r := rand.New(rand.NewPCG(4, 4))
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		for i := 0; i < cfg.NumLayers(); i++ {
			cl, err := LoadMoELayer(sm, cfg, i)
			if err != nil {
				t.Fatal(err)
			}
			fl, err := fm.Layer(i)
			if err != nil {
				t.Fatal(err)
			}
			want, err := cl.Forward(x, 53)
			if err != nil {
				t.Fatal(err)
			}
			got, err := fl.MoE.Forward(x, 53)
			if err != nil {
				t.Fatal(err)
			}
			for j := range want {
				if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
					t.Fatalf("%v layer %d element %d: forward %g, calib %g", v, i, j, got[j], want[j])
				}
			}
		}
		fm.Close()
	}
}
