package gptq

import (
	"math"
	"runtime"
	"strings"
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
	for _, axis := range []bfp.Axis{bfp.AxisInput, bfp.AxisOutput} {
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

// TestCheckHessianLargeFirstProblem: the Hessian checks scan row ranges
// concurrently for large matrices; the problem reported is still the first
// in row-major (for symmetry: tile) order.
func TestCheckHessianLargeFirstProblem(t *testing.T) {
	const n = 600
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{1, 2, 4} {
		runtime.GOMAXPROCS(procs)
		h := make([]float64, n*n)
		for i := 0; i < n; i++ {
			h[i*n+i] = 1
		}
		if err := checkHessian(h, n, "x"); err != nil {
			t.Fatalf("identity: %v", err)
		}
		h[590*n+3] = math.NaN()
		h[400*n+7] = math.Inf(1)
		if err := checkHessian(h, n, "x"); err == nil || !strings.Contains(err.Error(), "[400,7]") {
			t.Errorf("GOMAXPROCS %d: non-finite: %v, want [400,7]", procs, err)
		}
		h[590*n+3], h[400*n+7] = 0, 0
		h[580*n+500] = 0.5 // [500,580] stays 0
		h[450*n+20] = -0.5 // [20,450] stays 0; tile row 14 comes first
		if err := checkHessian(h, n, "x"); err == nil || !strings.Contains(err.Error(), "[450,20]") {
			t.Errorf("GOMAXPROCS %d: asymmetry: %v, want [450,20]", procs, err)
		}
	}
}
