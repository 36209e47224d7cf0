package build

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
)

// TestGPTQMixedExpertFormats builds a checkpoint whose plan stores the
// routed experts' gate_up in BFP8_b and their down projection in BFP4_b. Each
// stored matrix must carry its own format and verify against the source,
// which checks that every GPTQ value is exactly representable in the format
// of the file it is in and that the recorded error is the true one.
func TestGPTQMixedExpertFormats(t *testing.T) {
	opt := gptq1Opts(t, filepath.Join(t.TempDir(), "mixed"), 2)
	base := preset(t)
	mixed := &plan.Plan{Name: "mixed", Rules: append([]plan.Rule{
		{Pattern: "*.mlp.experts.*.gate_up_proj", Format: manifest.StoreBFP8, Method: manifest.MethodGPTQ},
	}, base.Rules...)}
	opt.Plan = mixed
	if _, err := GPTQ(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	rep := mustVerify(t, opt.Out, VerifyOptions{Source: opt.Source, Workers: 2})
	if !rep.OK {
		t.Fatalf("%v", rep.Failures)
	}
	c, err := manifest.OpenCheckpoint(opt.Out)
	if err != nil {
		t.Fatal(err)
	}
	gateUp, down := 0, 0
	for _, te := range c.Manifest().Tensors {
		if !strings.Contains(te.Name, ".layers.1.mlp.experts.") || te.Method != manifest.MethodGPTQ {
			continue
		}
		switch {
		case strings.HasSuffix(te.Name, "gate_up_proj"):
			gateUp++
			if !strings.EqualFold(te.Format, "BFP8_b") {
				t.Errorf("%s stored as %s, want BFP8_b", te.Name, te.Format)
			}
		case strings.HasSuffix(te.Name, "down_proj"):
			down++
			if !strings.EqualFold(te.Format, "BFP4_b") {
				t.Errorf("%s stored as %s, want BFP4_b", te.Name, te.Format)
			}
		}
	}
	if gateUp == 0 || down == 0 {
		t.Fatalf("layer 1: %d GPTQ gate_up and %d GPTQ down tensors", gateUp, down)
	}
}

// TestNoProxyLoss: skipping the proxy losses stores the same tensors,
// records the option and zero losses, and verifies.
func TestNoProxyLoss(t *testing.T) {
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	if _, err := GPTQ(context.Background(), gptq1Opts(t, a, 2)); err != nil {
		t.Fatal(err)
	}
	opt := gptq1Opts(t, b, 2)
	g := gptq.DefaultOptions()
	g.NoProxyLoss = true
	opt.GPTQOptions = &g
	res, err := GPTQ(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Manifest.TTQuant.Options.NoProxyLoss {
		t.Error("the manifest does not record gptq_no_proxy_loss")
	}
	gptqd := 0
	for _, ms := range res.Manifest.TTQuant.Matrices {
		if ms.Method == manifest.MethodGPTQ {
			gptqd++
			if ms.ProxyLoss != 0 || ms.RTNProxyLoss != 0 {
				t.Errorf("%s: proxy losses %g, %g: want 0", ms.Tensor, ms.ProxyLoss, ms.RTNProxyLoss)
			}
		}
	}
	if gptqd == 0 {
		t.Fatal("no GPTQ matrix")
	}
	ta, tb := readTree(t, a), readTree(t, b)
	for n, x := range ta {
		if n == manifest.ManifestName {
			continue
		}
		if !bytes.Equal(x, tb[n]) {
			t.Errorf("%s differs without the proxy losses", n)
		}
	}
	if rep := mustVerify(t, b, VerifyOptions{}); !rep.OK {
		t.Errorf("does not verify: %v", rep.Failures)
	}
}
