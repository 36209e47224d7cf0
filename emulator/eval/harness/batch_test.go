package harness

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
)

// TestBatchedEvaluationSameTable: running consecutive windows as one
// forward batch (each layer over all of them) gives the table of one
// window at a time, bit for bit — with CPU and device numerics, a BFP8
// key-value cache, and weights streamed from the checkpoint — whether the
// batch holds every window or cuts them into uneven groups.
func TestBatchedEvaluationSameTable(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	p, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(t.TempDir(), "rtn")
	if _, err := build.Convert(context.Background(), build.BuildOptions{Source: dir, Out: ckpt, Plan: p}); err != nil {
		t.Fatal(err)
	}
	spec, err := dataset.ParseSpec("eval=" + filepath.Join(dir, "eval-dev.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// Seven windows: six of 96 tokens and the 40-token rest of the
	// packed text, so that 250-token batches hold two windows and then
	// one.
	dopt := dataset.Options{EvalFraction: 1, Seed: 1, Evaluation: dataset.SetOptions{Sequences: 2, SeqLen: 328, Mode: dataset.ModePack}}
	table := func(num Numerics, stream bool, batch int) []byte {
		t.Helper()
		rep, err := Run(context.Background(), Options{Model: dir, Checkpoints: []string{ckpt}, Self: true,
			Data: spec, DataOptions: dopt, Window: 96, Numerics: num, Stream: stream, BatchTokens: batch, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Data.(DataInfo).Windows < 6 {
			t.Fatalf("%d windows: the test needs several per batch", rep.Data.(DataInfo).Windows)
		}
		var b bytes.Buffer
		if err := rep.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	device, err := ParseNumerics("device:LoFi", "bfp8")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		num    Numerics
		stream bool
	}{{"cpu", Numerics{}, false}, {"cpu streamed", Numerics{}, true}, {"device LoFi, BFP8 cache", device, false}} {
		one := table(c.num, c.stream, 1)
		for _, batch := range []int{250, 0} {
			if got := table(c.num, c.stream, batch); !bytes.Equal(got, one) {
				t.Errorf("%s: batches of %d tokens give another table than one window at a time:\n%s\nwant\n%s", c.name, batch, got, one)
			}
		}
	}
}
