package build

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/manifest/plan"
)

// TestOptionsRefused: out-of-range options are errors from Convert and
// GPTQ before anything is read or written, never a quiet fallback (a
// negative damping once became RTN for every matrix).
func TestOptionsRefused(t *testing.T) {
	p, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	base := BuildOptions{Source: filepath.Join(dir, "no-model"), Out: out, Plan: p, Calib: filepath.Join(dir, "no-store")}
	withGPTQ := func(f func(*gptq.Options)) BuildOptions {
		o := base
		g := gptq.DefaultOptions()
		f(&g)
		o.GPTQOptions = &g
		return o
	}
	cases := map[string]BuildOptions{
		"percdamp -1":   withGPTQ(func(g *gptq.Options) { g.PercDamp = -1 }),
		"block size -5": withGPTQ(func(g *gptq.Options) { g.BlockSize = -5 }),
		"workers -3":    func() BuildOptions { o := base; o.Workers = -3; return o }(),
		"per file -1":   func() BuildOptions { o := base; o.ExpertsPerFile = -1; return o }(),
		"shard -1":      func() BuildOptions { o := base; o.DenseShardBytes = -1; return o }(),
		"held out -1":   func() BuildOptions { o := base; o.HeldOutSequences = -1; return o }(),
		"bad layers":    func() BuildOptions { o := base; o.Layers = "re(("; return o }(),
		"bad parent":    func() BuildOptions { o := base; o.Parent = "abc"; return o }(),
		"no plan":       func() BuildOptions { o := base; o.Plan = nil; return o }(),
	}
	for name, o := range cases {
		if o.Validate() == nil {
			t.Errorf("%s: Validate accepted", name)
		}
		if _, err := GPTQ(context.Background(), o); err == nil || errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: GPTQ = %v, want an option error before opening the source", name, err)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("%s: the output directory was created", name)
		}
	}
	if _, err := GPTQ(context.Background(), cases["percdamp -1"]); !errors.Is(err, gptq.ErrOptions) {
		t.Errorf("percdamp -1: %v, want gptq.ErrOptions", err)
	}
	if err := base.Validate(); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
	if err := (VerifyOptions{Workers: -1}).Validate(); err == nil {
		t.Error("verify workers -1 accepted")
	}
}
