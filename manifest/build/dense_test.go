package build

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
)

func densePreset(t testing.TB) *plan.Plan {
	t.Helper()
	p, err := plan.Preset(plan.PresetDense27B)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// countingFamily is model.Qwen3 counting its config.json reads.
type countingFamily struct {
	model.Family
	reads *atomic.Int32
}

func (f countingFamily) ReadConfig(path string) (*model.Config, error) {
	f.reads.Add(1)
	return f.Family.ReadConfig(path)
}

// denseSeqOpts is the sequential build of the trained dense model with the
// qwen3-27b-dense preset (its dense MLPs BFP4_b with GPTQ, the default
// --layers experts selecting them): six sequences of 96 tokens, the last
// two held out.
func denseSeqOpts(t testing.TB, out string, workers int) BuildOptions {
	t.Helper()
	m := testdata.Dir(t, "models", "tiny-qwen35-dense-trained")
	spec, err := dataset.ParseSpec("calib=" + filepath.Join(m, "calib.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	dopt := dataset.Options{Calibration: dataset.SetOptions{Sequences: seqSequences, SeqLen: seqLen}, EvalFraction: dataset.DefaultEvalFraction, Seed: 1}
	return BuildOptions{Source: m, Out: out, Plan: densePreset(t), Workers: workers, Data: spec, DataOptions: dopt, HeldOutSequences: seqHeldOut}
}

var denseFixture struct {
	once  sync.Once
	dir   string
	res   *BuildResult
	reads int32
	err   error
}

// denseReference builds the dense sequential checkpoint once, counting the
// reads of config.json.
func denseReference(t *testing.T) (string, *BuildResult) {
	t.Helper()
	denseFixture.once.Do(func() {
		d, err := os.MkdirTemp("", "ttquant-dense-ref-")
		if err != nil {
			denseFixture.err = err
			return
		}
		denseFixture.dir = filepath.Join(d, "out")
		var n atomic.Int32
		opt := denseSeqOpts(t, denseFixture.dir, 2)
		opt.Family = countingFamily{model.Qwen3, &n}
		denseFixture.res, denseFixture.err = GPTQ(context.Background(), opt)
		denseFixture.reads = n.Load()
	})
	if denseFixture.err != nil {
		t.Fatal(denseFixture.err)
	}
	return denseFixture.dir, denseFixture.res
}

// TestDenseSequentialBuild: the trained dense Qwen3.5 builds sequentially
// with the 27B preset, reading config.json once; every dense MLP matrix
// (four trunk layers and the MTP layer) is GPTQ'd, the gate and up from
// the post-attention norm's rows and down from their SwiGLU, with a lower
// proxy loss than rounding; the checkpoint verifies against the source.
func TestDenseSequentialBuild(t *testing.T) {
	dir, res := denseReference(t)
	if denseFixture.reads != 1 {
		t.Errorf("the sequential build read config.json %d times, want once", denseFixture.reads)
	}
	if rep := mustVerify(t, dir, VerifyOptions{}); !rep.OK {
		t.Fatalf("the dense checkpoint does not verify: %v", rep.Failures)
	}
	m := res.Manifest
	if c := m.TTQuant.Calibration; c == nil || c.Mode != manifest.CalibModeSequential {
		t.Fatalf("calibration section %+v: want mode sequential", c)
	}
	if len(m.TTQuant.Layers) != 5 {
		t.Errorf("%d layer statistics, want 5", len(m.TTQuant.Layers))
	}
	mlp := map[string]int{}
	for _, ms := range m.TTQuant.Matrices {
		for _, k := range []string{"gate_proj", "up_proj", "down_proj"} {
			if !strings.HasSuffix(ms.Tensor, ".mlp."+k+".weight") {
				continue
			}
			mlp[k]++
			if ms.Method != manifest.MethodGPTQ || ms.Fallback != "" {
				t.Errorf("%s: %s (%s), want GPTQ", ms.Tensor, ms.Method, ms.Fallback)
			}
			if !(ms.ProxyLoss > 0 && ms.ProxyLoss < ms.RTNProxyLoss) {
				t.Errorf("%s: proxy loss %g with GPTQ, %g with rounding: GPTQ should win on the trained model", ms.Tensor, ms.ProxyLoss, ms.RTNProxyLoss)
			}
		}
	}
	for _, k := range []string{"gate_proj", "up_proj", "down_proj"} {
		if mlp[k] != 5 {
			t.Errorf("%d %s matrices with statistics, want 5 (four layers and MTP)", mlp[k], k)
		}
	}
}

// TestDenseSequentialResume interrupts the dense build after layer 2 and
// checks that the resumed run (other worker count) writes the same bytes.
func TestDenseSequentialResume(t *testing.T) {
	ref, _ := denseReference(t)
	out := filepath.Join(t.TempDir(), "out")
	interruptAfterLayer(t, denseSeqOpts(t, out, 2), 2)
	expectIncomplete(t, "after layer 2", out)
	res, err := GPTQ(context.Background(), denseSeqOpts(t, out, 1))
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if res.AlreadyComplete {
		t.Error("the interrupted build was taken for a finished one")
	}
	sameTree(t, "dense, resumed after layer 2", ref, out)
}
