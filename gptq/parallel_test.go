package gptq

import (
	"math"
	"runtime"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

// TestSameResultAnyGOMAXPROCS: the in-block loop runs row chunks
// concurrently; the result must not depend on how many run at once. The
// 600-row problem has four chunks (the last one shorter), and the options
// cover sub-blocks, act-order and static groups on both axes.
func TestSameResultAnyGOMAXPROCS(t *testing.T) {
	p := newSynthProblem("procs", 600, 96, 200, 17)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, axis := range []Axis{InputAxis, OutputAxis} {
		for _, opt := range []Options{
			{BlockSize: 32, PercDamp: 0.01},
			{BlockSize: 40, SubBlock: 8, PercDamp: 0.01, ActOrder: true},
			{BlockSize: 64, PercDamp: 0.01, StaticGroups: true},
			{BlockSize: 48, PercDamp: 0.01, Float64: true},
		} {
			g := NewBFPGrid(bfp.BFP4, axis)
			var ref *Result
			for _, procs := range []int{1, 2, 3, 4} {
				runtime.GOMAXPROCS(procs)
				res, err := Quantize(p.W, p.Rows, p.Cols, p.H, g, opt)
				if err != nil {
					t.Fatal(err)
				}
				if ref == nil {
					ref = res
					continue
				}
				for i := range res.Q {
					if math.Float32bits(res.Q[i]) != math.Float32bits(ref.Q[i]) {
						t.Fatalf("%v %+v: GOMAXPROCS %d: Q[%d] = %g, with 1: %g", axis, opt, procs, i, res.Q[i], ref.Q[i])
					}
				}
				if res.Error != ref.Error || res.ProxyLoss != ref.ProxyLoss || res.RTNProxyLoss != ref.RTNProxyLoss {
					t.Errorf("%v %+v: GOMAXPROCS %d: losses %v %v %v, with 1: %v %v %v", axis, opt, procs,
						res.Error, res.ProxyLoss, res.RTNProxyLoss, ref.Error, ref.ProxyLoss, ref.RTNProxyLoss)
				}
			}
		}
	}
}
