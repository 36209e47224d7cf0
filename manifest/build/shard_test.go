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
