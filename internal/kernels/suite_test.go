package kernels

import (
	"context"
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
