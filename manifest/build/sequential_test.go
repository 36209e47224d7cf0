package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/manifest"
)

// The trained tiny model with its calibration text: six sequences of 96
// tokens, the last two held out.
const (
	seqSequences = 6
	seqLen       = 96
	seqHeldOut   = 2
)

func seqOpts(t testing.TB, out string, workers int) BuildOptions {
	t.Helper()
	m := testdata.Dir(t, "models", "tiny-qwen36-trained")
	spec, err := dataset.ParseSpec("calib=" + filepath.Join(m, "calib.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	dopt := dataset.Options{Calibration: dataset.SetOptions{Sequences: seqSequences, SeqLen: seqLen}, EvalFraction: dataset.DefaultEvalFraction, Seed: 1}
	return BuildOptions{Source: m, Out: out, Plan: preset(t), Workers: workers, Data: spec, DataOptions: dopt, Layers: "experts", HeldOutSequences: seqHeldOut}
}

var seqFixture struct {
	once sync.Once
	dir  string
	res  *BuildResult
	err  error
}

// seqReference builds the sequential checkpoint once, with one worker.
func seqReference(t *testing.T) (string, *BuildResult) {
	t.Helper()
	seqFixture.once.Do(func() {
		d, err := os.MkdirTemp("", "ttquant-seq-ref-")
		if err != nil {
			seqFixture.err = err
			return
		}
		seqFixture.dir = filepath.Join(d, "out")
		seqFixture.res, seqFixture.err = GPTQ(context.Background(), seqOpts(t, seqFixture.dir, 1))
	})
	if seqFixture.err != nil {
		t.Fatal(seqFixture.err)
	}
	return seqFixture.dir, seqFixture.res
}

func TestSequentialBuild(t *testing.T) {
	dir, res := seqReference(t)
	rep := mustVerify(t, dir, VerifyOptions{})
	if !rep.OK {
		t.Fatalf("the sequential checkpoint does not verify: %v", rep.Failures)
	}
	m := res.Manifest
	c := m.TTQuant.Calibration
	if c == nil || c.Mode != manifest.CalibModeSequential || c.TokenIDsSHA256 == "" || len(c.Data) == 0 {
		t.Fatalf("calibration section %+v: want mode sequential with the token-id hash and the data's provenance", c)
	}
	if c.Sequences != seqSequences || c.Tokens != seqSequences*seqLen || c.HeldOutSequences != seqHeldOut {
		t.Errorf("calibration %d sequences, %d tokens, %d held out; want %d, %d, %d", c.Sequences, c.Tokens, c.HeldOutSequences, seqSequences, seqSequences*seqLen, seqHeldOut)
	}
	// The source file by its hash, never by the path it was read from
	// (the identity does not depend on the directory the build ran in).
	if strings.Contains(string(c.Data), "calib.jsonl") || !strings.Contains(string(c.Data), `"sha256"`) {
		t.Errorf("data provenance %s names the source file's path or not its hash", c.Data)
	}
	// Four trunk layers and the MTP layer (4): every one GPTQ'd with
	// held-out and stream statistics. The MTP layer has one row fewer per
	// sequence: its last token has no next token.
	if len(m.TTQuant.Layers) != 5 {
		t.Fatalf("%d layer statistics, want 5", len(m.TTQuant.Layers))
	}
	for _, ls := range m.TTQuant.Layers {
		rows := int64(seqLen)
		if ls.Layer == 4 {
			rows--
		}
		if ls.CalibTokens != (seqSequences-seqHeldOut)*rows || ls.HeldOutTokens != seqHeldOut*rows {
			t.Errorf("layer %d: %d calibration and %d held-out rows, want %d and %d", ls.Layer, ls.CalibTokens, ls.HeldOutTokens, (seqSequences-seqHeldOut)*rows, seqHeldOut*rows)
		}
		if !(ls.ResidualMeanSquare > 0) || !(ls.HeldOutStreamRelMSE > 0) || ls.HeldOutStreamRelMSE > 0.05 {
			t.Errorf("layer %d: stream mean square %g, held-out drift %g: want both positive, the drift small", ls.Layer, ls.ResidualMeanSquare, ls.HeldOutStreamRelMSE)
		}
		if !(ls.HeldOutMSE > 0 && ls.HeldOutMSE < ls.HeldOutRTNMSE) {
			t.Errorf("layer %d: held-out error %g with GPTQ, %g with rounding: GPTQ should win on the trained model", ls.Layer, ls.HeldOutMSE, ls.HeldOutRTNMSE)
		}
	}
	// The shared expert is GPTQ'd with the routed ones (--layers experts).
	shared := 0
	for _, ms := range m.TTQuant.Matrices {
		if strings.Contains(ms.Tensor, "shared_expert.") {
			shared++
			if ms.Method != manifest.MethodGPTQ || ms.Fallback != "" {
				t.Errorf("%s: method %s (%s), want GPTQ", ms.Tensor, ms.Method, ms.Fallback)
			}
		}
	}
	if shared != 15 {
		t.Errorf("%d shared expert matrices with statistics, want 3 × 5 layers", shared)
	}
	// Nothing of the pass is left behind.
	if _, err := os.Stat(filepath.Join(dir, manifest.PartialDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the bookkeeping directory is left: %v", err)
	}
}

func TestSequentialSameBytesForAnyWorkerCount(t *testing.T) {
	ref, _ := seqReference(t)
	out := filepath.Join(t.TempDir(), "out")
	if _, err := GPTQ(context.Background(), seqOpts(t, out, 4)); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "4 workers against 1", ref, out)
	// A rerun over the finished checkpoint keeps it and does not run the
	// pass again.
	res, err := GPTQ(context.Background(), seqOpts(t, out, 2))
	if err != nil {
		t.Fatal(err)
	}
	if !res.AlreadyComplete {
		t.Errorf("rerun over a finished checkpoint: kept %d files, not complete", res.Kept)
	}
	sameTree(t, "rerun", ref, out)
}

// TestSequentialInterruptAndResume stops the build inside the pass (in the
// middle of layer 1's expert files), between layers (after layer 2's
// record) and after the pass (while the dense file is written), and checks
// that a resumed run writes the same bytes as an uninterrupted one.
func TestSequentialInterruptAndResume(t *testing.T) {
	ref, _ := seqReference(t)
	points := []struct {
		name string
		stop func(file, tensor string) bool
	}{
		{"inside layer 1's experts", func(file, tensor string) bool {
			return strings.HasPrefix(file, "experts-l001-") && tensor != ""
		}},
		{"after layer 2", func(file, tensor string) bool { return file == seqDir && tensor == "layer 2" }},
		{"writing the dense file", func(file, tensor string) bool {
			return strings.HasPrefix(file, "dense-") && tensor != ""
		}},
	}
	for _, p := range points {
		t.Run(strings.ReplaceAll(p.name, " ", "_"), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			opt := seqOpts(t, out, 2)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var once sync.Once
			hit := false
			opt.testHook = func(file, tensor string) {
				if p.stop(file, tensor) {
					once.Do(func() { hit = true; cancel() })
				}
			}
			_, err := GPTQ(ctx, opt)
			if !hit {
				t.Fatalf("the build never reached the interruption point (err %v)", err)
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("interrupted build: %v", err)
			}
			expectIncomplete(t, p.name, out)
			// Resume with another worker count.
			opt = seqOpts(t, out, 3)
			var ran []string
			opt.testHook = func(file, tensor string) {
				if file == seqDir {
					ran = append(ran, tensor)
				}
			}
			res, err := GPTQ(context.Background(), opt)
			if err != nil {
				t.Fatalf("resume: %v", err)
			}
			if strings.HasPrefix(p.name, "writing") && len(ran) > 0 {
				t.Errorf("resumed after the pass, the build ran %v again", ran)
			}
			if res.Kept == 0 {
				t.Errorf("the resumed build kept no file")
			}
			sameTree(t, p.name+", resumed", ref, out)
		})
	}
}

// TestSequentialResumeSkipsFinishedLayers checks that the pass starts at
// the first unfinished layer: with the records of layers 0-2 kept, the
// resumed run quantizes only layers 3 and 4.
func TestSequentialResumeSkipsFinishedLayers(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	opt := seqOpts(t, out, 2)
	interruptAfterLayer(t, opt, 2)
	var layers []string
	opt = seqOpts(t, out, 2)
	opt.testHook = func(file, tensor string) {
		if file == seqDir {
			layers = append(layers, tensor)
		}
	}
	var last ProgressEvent
	opt.Progress = func(ev ProgressEvent) { last = ev }
	if _, err := GPTQ(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(layers); got != "[layer 3 layer 4]" {
		t.Errorf("the resumed pass ran %s, want layers 3 and 4 only", got)
	}
	// Five layers of two expert files and the rest of the pass: three of
	// them were kept, and the rate counts the other two only.
	if last.Kind != "done" || last.WorkTotal != 15 || last.Work != 15 || last.WorkKept != 9 {
		t.Errorf("last progress event of the resumed build %+v: want work 15 of 15, 9 kept", last)
	}
}

// interruptAfterLayer runs the build and cancels it once layer l's record
// is written; the build must stop with context.Canceled.
func interruptAfterLayer(t *testing.T, opt BuildOptions, l int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	hook := opt.testHook
	opt.testHook = func(file, tensor string) {
		if hook != nil {
			hook(file, tensor)
		}
		if file == seqDir && tensor == fmt.Sprintf("layer %d", l) {
			once.Do(cancel)
		}
	}
	if _, err := GPTQ(ctx, opt); !errors.Is(err, context.Canceled) {
		t.Fatalf("build interrupted after layer %d: %v", l, err)
	}
}

func TestSequentialRefusals(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	// Text and a store at once.
	o := seqOpts(t, out, 1)
	o.Calib = "somewhere"
	if err := o.Validate(); err == nil {
		t.Error("data and a calibration store together were accepted")
	}
	// More text asked for than there is: refused before anything is
	// written.
	o = seqOpts(t, out, 1)
	o.DataOptions.Calibration.Sequences = 100000
	if _, err := GPTQ(context.Background(), o); !errors.Is(err, dataset.ErrShortText) || !strings.Contains(err.Error(), "100000 sequences × 96 tokens") {
		t.Errorf("too little text: %v, want ErrShortText naming the numbers", err)
	}
	// Every sequence held out.
	o = seqOpts(t, out, 1)
	o.HeldOutSequences = seqSequences
	if _, err := GPTQ(context.Background(), o); err == nil || !strings.Contains(err.Error(), "held-out") {
		t.Errorf("every sequence held out: %v", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) > 1 {
		t.Errorf("refused builds wrote %d entries into the output directory", len(ents))
	}
}

// TestSequentialAllLayers quantizes every matrix the plan quantizes with
// GPTQ: the attention and Gated DeltaNet projections take their inputs from
// the stages before them in the layer, and matrices without calibration
// inputs (the LM head, the MTP fc, the small b/a projections) are rounded,
// with the reason recorded.
func TestSequentialAllLayers(t *testing.T) {
	if purego {
		t.Skip("one more full GPTQ build; the portable kernels make it slow")
	}
	out := filepath.Join(t.TempDir(), "out")
	opt := seqOpts(t, out, 2)
	opt.Layers = "all"
	res, err := GPTQ(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if rep := mustVerify(t, out, VerifyOptions{}); !rep.OK {
		t.Fatalf("does not verify: %v", rep.Failures)
	}
	gptqBy := map[string]int{}
	for _, ms := range res.Manifest.TTQuant.Matrices {
		for _, k := range []string{"q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj"} {
			if strings.Contains(ms.Tensor, "."+k+".") {
				if ms.Method != manifest.MethodGPTQ || ms.Fallback != "" {
					t.Errorf("%s: method %s (%s), want GPTQ", ms.Tensor, ms.Method, ms.Fallback)
				}
				gptqBy[k]++
			}
		}
		if strings.Contains(ms.Tensor, "lm_head") && (ms.Method != manifest.MethodRTN || ms.Fallback == "") {
			t.Errorf("%s: method %s, fallback %q: want RTN with the reason", ms.Tensor, ms.Method, ms.Fallback)
		}
	}
	// Three Gated DeltaNet layers and the full-attention layer plus the
	// MTP layer (full attention).
	for k, want := range map[string]int{"q_proj": 2, "o_proj": 2, "in_proj_qkv": 3, "out_proj": 3} {
		if gptqBy[k] != want {
			t.Errorf("%d %s matrices quantized with GPTQ, want %d", gptqBy[k], k, want)
		}
	}
}

// TestSequentialDiskFull fills the disk in the middle of the pass (layer
// 2's records) and while the dense file is written: the build fails naming
// the error, leaves nothing that verifies, and once space is freed a rerun
// finishes with the bytes of an uninterrupted build.
func TestSequentialDiskFull(t *testing.T) {
	ref, _ := seqReference(t)
	for _, at := range []string{"layer-002", "dense-"} {
		t.Run(at, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			opt := seqOpts(t, out, 2)
			opt.Faults = func(path string, w io.Writer) io.Writer {
				if strings.Contains(filepath.Base(path), at) || strings.Contains(path, string(filepath.Separator)+at) {
					return fullDisk{}
				}
				return w
			}
			_, err := GPTQ(context.Background(), opt)
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("build on a full disk: %v, want ENOSPC", err)
			}
			expectIncomplete(t, "disk full at "+at, out)
			if _, err := GPTQ(context.Background(), seqOpts(t, out, 2)); err != nil {
				t.Fatalf("rerun after space was freed: %v", err)
			}
			sameTree(t, "rerun after a full disk at "+at, ref, out)
		})
	}
}

// TestSequentialUnsupportedConfig: a config the forward pass does not run
// (scaled RoPE) is refused with the key named, before any weight is read
// or anything written.
func TestSequentialUnsupportedConfig(t *testing.T) {
	src := testdata.Dir(t, "models", "tiny-qwen36-trained")
	dir := filepath.Join(t.TempDir(), "model")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"} {
		data, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			t.Fatal(err)
		}
		if n == "config.json" {
			data = []byte(strings.Replace(string(data), `"rope_type": "default"`, `"rope_type": "yarn"`, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, n), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "out")
	opt := seqOpts(t, out, 1)
	opt.Source = dir
	_, err := GPTQ(context.Background(), opt)
	if err == nil || !strings.Contains(err.Error(), "rope_type") {
		t.Fatalf("scaled RoPE: %v, want a refusal naming rope_type", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) > 1 {
		t.Errorf("the refused build wrote %d entries", len(ents))
	}
}

// TestSequentialDamagedStream: when the recorded stream a resumed pass
// would start from does not check, the pass starts over at layer 0 and
// still writes the bytes of an uninterrupted build.
func TestSequentialDamagedStream(t *testing.T) {
	ref, _ := seqReference(t)
	out := filepath.Join(t.TempDir(), "out")
	opt := seqOpts(t, out, 2)
	interruptAfterLayer(t, opt, 2)
	stream := filepath.Join(out, manifest.PartialDir, seqDir, "stream-002.f32")
	data, err := os.ReadFile(stream)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	if err := os.WriteFile(stream, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var layers []string
	opt = seqOpts(t, out, 2)
	opt.testHook = func(file, tensor string) {
		if file == seqDir {
			layers = append(layers, tensor)
		}
	}
	if _, err := GPTQ(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	if len(layers) != 5 {
		t.Errorf("the pass ran %v after a damaged stream, want every layer again", layers)
	}
	sameTree(t, "resumed from a damaged stream", ref, out)
}

// TestStoreFromAnotherModel: a store that records another model's identity
// is refused before anything is written; one that records this model's is
// accepted.
func TestStoreFromAnotherModel(t *testing.T) {
	src, _ := tinyFixture(t)
	mc, err := model.ReadConfig(src)
	if err != nil {
		t.Fatal(err)
	}
	id, err := calib.ModelIdentity(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		revision string
		refused  bool
	}{{"sha256:" + strings.Repeat("0", 64), true}, {id, false}} {
		store := filepath.Join(t.TempDir(), "store")
		if _, err := calib.SynthesizeStore(store, mc, calib.SynthStoreOptions{Sequences: 3, SeqLen: 16, Revision: c.revision}); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "out")
		opt := gptq1Opts(t, out, 2)
		opt.Calib = store
		opt.HeldOutSequences = 0
		_, err := GPTQ(context.Background(), opt)
		if c.refused {
			if !errors.Is(err, ErrStoreModel) {
				t.Errorf("store of another model: %v, want ErrStoreModel", err)
			}
			if ents, _ := os.ReadDir(out); len(ents) > 1 {
				t.Errorf("the refused build wrote %d entries", len(ents))
			}
		} else if err != nil {
			t.Errorf("store of this model: %v", err)
		}
	}
}

// TestSequentialProgress: a sequential build reports its progress in one
// measure with one total, from the first event to the last, and the
// measure advances inside a layer, per expert group file, before the
// layer is reported done; a resumed build counts what it kept apart, so
// that the rate (and the ETA) is this run's.
func TestSequentialProgress(t *testing.T) {
	opt := seqOpts(t, filepath.Join(t.TempDir(), "out"), 2)
	opt.ExpertsPerFile = 4 // 4 groups × (gate_up, down) per layer
	var mu sync.Mutex
	var evs []ProgressEvent
	opt.Progress = func(ev ProgressEvent) {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
	}
	if _, err := GPTQ(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	if len(evs) < 2 || evs[0].Kind != "start" || evs[len(evs)-1].Kind != "done" {
		t.Fatalf("events %+v", evs)
	}
	total := evs[0].WorkTotal
	if total <= 0 {
		t.Fatalf("start event %+v: no work total", evs[0])
	}
	var last int64
	layerDone := map[int]bool{}
	inside := map[int]int{} // per layer, the expert-group events with the work advancing before the layer ends
	for _, ev := range evs {
		if ev.WorkTotal != total || ev.Work < last || ev.Work > total || ev.WorkKept != 0 {
			t.Fatalf("event %+v: work %d after %d, total %d (want one total, a non-decreasing measure, nothing kept)", ev, ev.Work, last, total)
		}
		switch ev.Kind {
		case "file":
			if ev.Layer >= 0 && !layerDone[ev.Layer] && ev.Work > last && ev.LayerWork < ev.LayerWorkTotal {
				inside[ev.Layer]++
			}
		case "layer":
			if layerDone[ev.Layer] {
				t.Errorf("layer %d reported done twice", ev.Layer)
			}
			layerDone[ev.Layer] = true
			if ev.LayerWork != ev.LayerWorkTotal {
				t.Errorf("layer %d done at %d of its %d", ev.Layer, ev.LayerWork, ev.LayerWorkTotal)
			}
		}
		last = ev.Work
	}
	if last != total {
		t.Errorf("the build ended at %d of %d", last, total)
	}
	for l := range 5 {
		if !layerDone[l] || inside[l] < 7 {
			t.Errorf("layer %d: done %v, %d expert-group events advancing inside it (want 7 of its 8 files before it ends)", l, layerDone[l], inside[l])
		}
	}
	mid := evs[len(evs)/2]
	if eta, ok := mid.ETA(); !ok || eta < 0 {
		t.Errorf("ETA of %+v: %v %v", mid, eta, ok)
	}
}

// fullDisk fails every write as a full disk does.
type fullDisk struct{}

func (fullDisk) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// TestSequentialResumeRefusesChangedText: an interrupted sequential build
// resumed with other calibration text (another seed, shorter sequences) is
// refused before anything is touched, the walk's record naming what
// changed; the same build then resumes to the bytes of an uninterrupted
// one.
func TestSequentialResumeRefusesChangedText(t *testing.T) {
	ref, _ := seqReference(t)
	out := filepath.Join(t.TempDir(), "out")
	interruptAfterLayer(t, seqOpts(t, out, 2), 1)
	before := filepath.Join(t.TempDir(), "before")
	if err := snapshotTree(out, before); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(o *BuildOptions)
		want []string
	}{
		{"seed", func(o *BuildOptions) { o.DataOptions.Seed = 2 }, []string{"calibration (sha256", "calibration walk (token ids sha256 was"}},
		{"sequence length", func(o *BuildOptions) { o.DataOptions.Calibration.SeqLen = seqLen / 2 },
			[]string{fmt.Sprintf("tokens was %d, now %d", seqSequences*seqLen, seqSequences*seqLen/2), "the data provenance differs in calibration, options"}},
	} {
		o := seqOpts(t, out, 2)
		c.edit(&o)
		_, err := GPTQ(context.Background(), o)
		if !errors.Is(err, ErrResumeMismatch) {
			t.Fatalf("%s: %v, want a refusal", c.name, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", c.name, err, w)
			}
		}
		sameTree(t, c.name+" refusal", before, out)
	}
	if _, err := GPTQ(context.Background(), seqOpts(t, out, 2)); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "resumed after refusals", ref, out)
}
