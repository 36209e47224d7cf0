package build

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/internal/text/dataset"
)

// TestShardBalanceOn35BReplica: on the dry run of the 35B replica's store
// GPTQ (routed and shared experts; and with every matrix), the largest of 8
// and of 64 workers has at most 10% more estimated work than the mean, and
// every worker computes the same partition. The figures are in
// docs/distributed.md.
func TestShardBalanceOn35BReplica(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "replica")
	if err := testmodel.WriteReplica35B(dir); err != nil {
		t.Fatal(err)
	}
	for _, layers := range []string{"experts", "all"} {
		for _, n := range []int{8, 64} {
			var first *ShardWork
			for _, i := range []int{0, n - 1} {
				res, err := GPTQ(context.Background(), BuildOptions{Source: dir, Plan: preset(t), Layers: layers, DryRun: true, Shard: shard.Spec{Index: i, Count: n}})
				if err != nil {
					t.Fatal(err)
				}
				sw := res.Work.Shards
				if sw == nil || sw.Workers != n || sw.Worker != i {
					t.Fatalf("--layers %s, worker %d/%d: shards %+v", layers, i, n, sw)
				}
				t.Logf("--layers %s, %d workers: %d units, largest worker %.1f s, mean %.1f s (%+.1f%%), largest unit %.1f s",
					layers, n, sw.Units, sw.MaxSeconds, sw.MeanSeconds, 100*(sw.MaxSeconds/sw.MeanSeconds-1), sw.MaxUnitSeconds)
				if sw.MaxSeconds > 1.10*sw.MeanSeconds {
					t.Errorf("--layers %s, %d workers: the largest worker has %.1f s, the mean %.1f s: more than 10%% over", layers, n, sw.MaxSeconds, sw.MeanSeconds)
				}
				if first == nil {
					first = sw
				} else if fmt.Sprint(first.Loads) != fmt.Sprint(sw.Loads) {
					t.Errorf("--layers %s: workers 0 and %d of %d compute different partitions", layers, i, n)
				}
			}
		}
	}
}

// TestShardOptions: a shard that names no worker, a split sequential build
// and a split build from a Hessian source are refused before any I/O.
func TestShardOptions(t *testing.T) {
	base := BuildOptions{Source: "src", Out: "out", Plan: preset(t)}
	for _, c := range []struct {
		name string
		edit func(*BuildOptions)
		want string
	}{
		{"index out of range", func(o *BuildOptions) { o.Shard = shard.Spec{Index: 3, Count: 3} }, "names no worker"},
		{"no count", func(o *BuildOptions) { o.Shard = shard.Spec{Index: 1} }, "names no worker"},
		{"sequential", func(o *BuildOptions) {
			o.Shard = shard.Spec{Index: 0, Count: 2}
			o.Data = &dataset.Spec{}
		}, "sequential build"},
		{"hessian source", func(o *BuildOptions) {
			o.Shard = shard.Spec{Index: 0, Count: 2}
			o.Hessians = zeroHessians{}
		}, "Hessian source"},
	} {
		o := base
		c.edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	o := base
	o.Shard = shard.Spec{Index: 1, Count: 2}
	if err := o.Validate(); err != nil {
		t.Errorf("worker 1/2: %v", err)
	}
}

// TestAssembleEmptyDirectory: assemble of a directory without records is
// an error of kind ErrAssemble.
func TestAssembleEmptyDirectory(t *testing.T) {
	if _, err := Assemble(context.Background(), AssembleOptions{Dir: t.TempDir()}); !errors.Is(err, ErrAssemble) {
		t.Errorf("empty directory: %v", err)
	}
}

// TestShardMemoryEstimate: the dry run of a split store GPTQ of the 35B
// replica reports each worker's memory: for a worker whose largest unit is
// an expert group, the layer's MoE-input rows (262,144 × 2,048 float32 =
// 2 GiB), the fixed 642 MiB and 8,192 routed rows × 22.3 KiB per expert in
// flight (docs/projections.md) — about 3.0 GiB with 2 in flight, 8.2 GiB
// with 32 — the same for 8 and 64 workers while a unit has at least as
// many experts as are in flight, and less when it has fewer (64 workers:
// 16 experts a unit). Every worker reports the same largest need.
func TestShardMemoryEstimate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "replica")
	if err := testmodel.WriteReplica35B(dir); err != nil {
		t.Fatal(err)
	}
	moe := func(inflight int64) int64 { return 262144*2048*4 + 642<<20 + inflight*8192*22835 }
	for _, c := range []struct {
		n, workers int
		want       int64
	}{
		{8, 2, moe(2)}, {64, 2, moe(2)}, {8, 32, moe(32)}, {64, 32, moe(16)},
	} {
		var maxAll int64
		for _, i := range []int{0, c.n - 1} {
			res, err := GPTQ(context.Background(), BuildOptions{Source: dir, Plan: preset(t), DryRun: true, Workers: c.workers, Shard: shard.Spec{Index: i, Count: c.n}})
			if err != nil {
				t.Fatal(err)
			}
			sw := res.Work.Shards
			t.Logf("%d workers, --workers %d: worker %d needs %.2f GiB (%s), every worker at most %.2f GiB",
				c.n, c.workers, i, float64(sw.WorkerBytes)/(1<<30), sw.WorkerBytesUnit, float64(sw.MaxWorkerBytes)/(1<<30))
			if !strings.Contains(sw.WorkerBytesUnit, "expert group") {
				t.Errorf("%d workers, worker %d: the largest unit is %s, want an expert group", c.n, i, sw.WorkerBytesUnit)
			}
			if sw.WorkerBytes != c.want {
				t.Errorf("%d workers, --workers %d, worker %d: %d bytes, want %d", c.n, c.workers, i, sw.WorkerBytes, c.want)
			}
			if sw.MaxWorkerBytes < sw.WorkerBytes || (maxAll != 0 && sw.MaxWorkerBytes != maxAll) {
				t.Errorf("%d workers, worker %d: largest need %d, its own %d, worker 0's largest %d", c.n, i, sw.MaxWorkerBytes, sw.WorkerBytes, maxAll)
			}
			maxAll = sw.MaxWorkerBytes
		}
	}
}
