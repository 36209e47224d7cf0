package textcalib

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/shard"
)

// TestSplitBuildByteIdentical: a store built by 2, 3 and 7 workers (run
// one after the other here; the command's tests run them at once) and
// assembled is the single process's, byte for byte, when the shard files
// are not aligned with the workers' units: 20-row shards of a 128-wide
// site over sequences of 32 tokens, and the MTP layer's 31 rows a
// sequence. Of 7 workers over 5 sequences, two have none.
func TestSplitBuildByteIdentical(t *testing.T) {
	opts := func(out string) Options {
		opt := trainedOptions(t, out, 5, 32)
		opt.Store.ShardBytes = 20 * 128 * 4
		return opt
	}
	whole := filepath.Join(t.TempDir(), "whole")
	res, err := Build(context.Background(), opts(whole))
	if err != nil {
		t.Fatal(err)
	}
	if res.MTPLayers != 1 {
		t.Fatalf("the trained model's store has %d MTP layers with sites, want 1", res.MTPLayers)
	}
	crossing := false
	for _, si := range res.Store.Sites() {
		ro := res.Store.RowOffsets(si)
		for _, sh := range si.Shards {
			for _, r := range ro {
				crossing = crossing || (sh.FirstToken < r && r < sh.FirstToken+sh.Tokens)
			}
		}
	}
	if !crossing {
		t.Fatal("no shard crosses a sequence boundary: the test checks nothing the units make hard")
	}
	want := tree(t, whole)
	for _, n := range []int{2, 3, 7} {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("split-%d", n))
		for i := range n {
			opt := opts(dir)
			opt.Shard = shard.Spec{Index: i, Count: n}
			r, err := Build(context.Background(), opt)
			if err != nil {
				t.Fatalf("worker %d/%d: %v", i, n, err)
			}
			if r.Store != nil || r.Split == nil || r.Split.Units != 5 {
				t.Fatalf("worker %d/%d: result %+v, want a share of 5 units and no store", i, n, r)
			}
			// With 7 workers, two have no sequence: they only record that.
			if idle := i >= 5; idle != (r.Split.Sequences == 0) {
				t.Errorf("worker %d/%d has %d sequences", i, n, r.Split.Sequences)
			}
		}
		a, err := calib.AssembleStore(context.Background(), calib.StoreAssembleOptions{Dir: dir})
		if err != nil {
			t.Fatalf("assemble of %d workers: %v", n, err)
		}
		if a.Workers != n || a.Units != 5 {
			t.Errorf("assembled %d workers, %d units; want %d, 5", a.Workers, a.Units, n)
		}
		sameTree(t, fmt.Sprintf("%d workers", n), tree(t, dir), want)
	}
}
