package kernels

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestRunBenchSmall(t *testing.T) {
	rep, err := RunBench(context.Background(), BenchOptions{Duration: 300 * time.Millisecond, Small: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Peak.F32 <= 0 || rep.Peak.F64 <= 0 {
		t.Errorf("peak not measured: %+v", rep.Peak)
	}
	want := []string{"hessian", "gptq-update-96x256", "gptq-update-256x96", "inverse-factor-256", "inverse-factor-96", "sgemm", "dgemm"}
	if len(rep.Results) != len(want) {
		t.Fatalf("got %d results, want %d", len(rep.Results), len(want))
	}
	for i, r := range rep.Results {
		if r.Name != want[i] || r.Runs < 1 || !(r.GFLOPS > 0) || r.Best > r.Median {
			t.Errorf("result %d = %+v", i, r)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := RunBench(ctx, BenchOptions{Duration: time.Millisecond, Small: true}); err == nil {
		t.Error("cancelled context not reported")
	}
}

func TestEstimateMoE(t *testing.T) {
	rep := &BenchReport{Results: []BenchResult{
		{Name: "hessian", GFLOPS: 100},
		{Name: "gptq-update-768x2048", GFLOPS: 50},
		{Name: "gptq-update-2048x768", GFLOPS: 25},
		{Name: "inverse-factor-2048", GFLOPS: 40},
		{Name: "inverse-factor-768", GFLOPS: 20},
	}}
	w := MoEWorkload{Layers: 1, ExpertsPerLayer: 1, Hidden: 2048, ExpertWidth: 512, RoutedRowsPerLayer: 1000, BlockSize: 128}
	e := rep.EstimateMoE(w)
	if e.Solves != 3 {
		t.Errorf("solves = %d", e.Solves)
	}
	wantH := 1000 * (2048.0*2049 + 512.0*513) / 100e9
	if math.Abs(e.HessianSeconds-wantH) > 1e-12*wantH {
		t.Errorf("hessian seconds = %g, want %g", e.HessianSeconds, wantH)
	}
	// gate+up use the 2048-column rate, down the 768-column one.
	gu := GPTQUpdateFLOPs(512, 2048, 128)
	dn := GPTQUpdateFLOPs(2048, 512, 128)
	wantU := 2*gu/50e9 + dn/25e9
	if math.Abs(e.UpdateSeconds-wantU) > 1e-12*wantU {
		t.Errorf("update seconds = %g, want %g", e.UpdateSeconds, wantU)
	}
	wantF := 2*2048.0*2048*2048/3/40e9 + 2*512.0*512*512/3/20e9
	if math.Abs(e.FactorSeconds-wantF) > 1e-12*wantF {
		t.Errorf("factor seconds = %g, want %g", e.FactorSeconds, wantF)
	}
	// GPTQUpdateFLOPs by hand for a 4×6 weight, block 4: blocks [0,4) then
	// [4,6): 2·4·4·2 + 0.
	if got := GPTQUpdateFLOPs(4, 6, 4); got != 64 {
		t.Errorf("GPTQUpdateFLOPs(4, 6, 4) = %g, want 64", got)
	}
}

func TestEstimateHelpers(t *testing.T) {
	rep := &BenchReport{Results: []BenchResult{
		{Name: "hessian", GFLOPS: 100},
		{Name: "gptq-update-768x2048", GFLOPS: 50},
		{Name: "inverse-factor-2048", GFLOPS: 40},
	}}
	if r, ok := rep.Result("hessian"); !ok || r.GFLOPS != 100 {
		t.Errorf("Result(hessian) = %+v, %v", r, ok)
	}
	if _, ok := rep.Result("nope"); ok {
		t.Error("Result(nope) found")
	}
	if got, want := rep.HessianSeconds(1000, 10), 1000*10*11/100e9; math.Abs(got-want) > 1e-15 {
		t.Errorf("HessianSeconds = %g, want %g", got, want)
	}
	want := 2*2048.0*2048*2048/3/40e9 + GPTQUpdateFLOPs(768, 2048, 128)/50e9
	if got := rep.GPTQSolveSeconds(768, 2048, 128); math.Abs(got-want) > 1e-12*want {
		t.Errorf("GPTQSolveSeconds = %g, want %g", got, want)
	}
	if got := (&BenchReport{}).HessianSeconds(1, 1); !math.IsInf(got, 1) {
		t.Errorf("no measurement: %g, want +Inf", got)
	}
}
