package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
)

type refRecord struct {
	Corpus string  `json:"corpus"`
	IDs    []int32 `json:"ids"`
	Scored int     `json:"scored"`
	NLLSum float64 `json:"nll_sum"`
}

func readReference(t *testing.T, dir string) []refRecord {
	f, err := os.Open(filepath.Join(dir, "reference-dev.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []refRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var r refRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	return recs
}

// perRecord is the convention of the trained model's reference numbers:
// every record of eval-dev tokenized alone and scored as one window from
// empty state.
func perRecord(t *testing.T, file string, n int) (*dataset.Spec, dataset.Options) {
	spec, err := dataset.ParseSpec(file)
	if err != nil {
		t.Fatal(err)
	}
	return spec, dataset.Options{EvalFraction: 1, Seed: 1,
		Evaluation: dataset.SetOptions{Sequences: n, SeqLen: 8192, Mode: dataset.ModeRecord, Short: dataset.ShortKeep}}
}

// TestReferenceAndSelf runs the BF16 source as reference and as its own
// candidate over records of eval-dev with the per-record convention: the
// candidate must agree exactly (ΔPPL 0, top-1 1, KL 0 — the lockstep
// scoring of identical logits), and the reference's per-corpus NLL must be
// the sum of reference-dev.jsonl's per-record NLL (an independent float32
// forward) over the same records, within 1e-4 relative. A few records keep
// it fast; the model README's corpus perplexities (code
// 30.44, prose 43.74, all 36.21) are reproduced over all 80 records by
// `ttquant eval` (docs/evaluation.md).
func TestReferenceAndSelf(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	// The shortest code and prose records (418 and 386 tokens), and under
	// the full run (not -short) also eval-dev's first code and prose records.
	pick := []int{20, 44}
	if !testing.Short() {
		pick = append(pick, 0, 40)
	}
	lines := strings.SplitAfter(string(must(os.ReadFile(filepath.Join(dir, "eval-dev.jsonl")))), "\n")
	var sub strings.Builder
	for _, i := range pick {
		sub.WriteString(lines[i])
	}
	file := filepath.Join(t.TempDir(), "eval-dev-subset.jsonl")
	if err := os.WriteFile(file, []byte(sub.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, dopt := perRecord(t, file, len(pick))
	rep, err := Run(context.Background(), Options{Model: dir, Self: true, Data: spec, DataOptions: dopt, Window: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Candidates) != 1 || rep.Candidates[0].Label != "self" {
		t.Fatalf("candidates %+v", rep.Candidates)
	}
	rows := rep.Candidates[0].Rows
	if got := []string{rows[0].Corpus, rows[1].Corpus, rows[2].Corpus}; !slices.Equal(got, []string{"code", "prose", "all"}) && !slices.Equal(got, []string{"prose", "code", "all"}) {
		t.Fatalf("corpus rows %q", got)
	}
	for _, r := range rows {
		if r.DeltaPPLPercent != 0 || r.Top1 != 1 || r.MeanKL != 0 || r.P99KL != 0 || r.RefPPL != r.CandPPL {
			t.Errorf("%s: self against self gives ΔPPL %v, top-1 %v, mean KL %v, p99 KL %v", r.Corpus, r.DeltaPPLPercent, r.Top1, r.MeanKL, r.P99KL)
		}
	}

	// The same records, identified by their token ids.
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	dopt.Workers = 1
	ds, err := dataset.Build(spec, tok, dopt)
	if err != nil {
		t.Fatal(err)
	}
	refs := readReference(t, dir)
	want := map[string]float64{}
	scored := map[string]int64{}
	for _, s := range ds.Evaluation.Sequences {
		i := slices.IndexFunc(refs, func(r refRecord) bool { return slices.Equal(r.IDs, s.IDs) })
		if i < 0 {
			t.Fatalf("%s sequence %v: no reference-dev record has its token ids", s.Label, s.Records)
		}
		for _, c := range []string{s.Label, eval.AllCorpus} {
			want[c] += refs[i].NLLSum
			scored[c] += int64(refs[i].Scored)
		}
	}
	for _, r := range rows {
		if r.PPLTokens != scored[r.Corpus] || r.Tokens != scored[r.Corpus] {
			t.Errorf("%s: %d scored tokens, reference-dev %d", r.Corpus, r.PPLTokens, scored[r.Corpus])
		}
		got := math.Log(r.RefPPL) * float64(r.PPLTokens)
		if rel := math.Abs(got-want[r.Corpus]) / want[r.Corpus]; rel > 1e-4 {
			t.Errorf("%s: reference NLL %.6f, reference-dev %.6f (rel %.2g)", r.Corpus, got, want[r.Corpus], rel)
		}
	}
	info := rep.Data.(DataInfo)
	if info.Windows != len(pick) || info.Split != 0 || info.Provenance.Evaluation == nil || info.Overlap.Checked {
		t.Errorf("data info %+v", info)
	}
}

// TestOverlapRefused: evaluation text of which more than the allowed
// share is calibration text is refused before anything runs, or allowed
// with a warning naming who allowed it (the run then stops at once on the
// cancelled context).
func TestOverlapRefused(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	spec, dopt := perRecord(t, filepath.Join(dir, "eval-dev.jsonl"), 80)
	// A calibration set cut from the same file: every record of it is
	// also an evaluation record.
	copt := dataset.Options{EvalFraction: 0.5, Seed: 3, Calibration: dataset.SetOptions{Sequences: 8, SeqLen: 256}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	opt := Options{Model: dir, Self: true, Data: spec, DataOptions: dopt, Calib: spec, CalibOptions: copt, Window: 8192}
	_, err := Run(ctx, opt)
	var oe *OverlapError
	if !errors.As(err, &oe) || oe.Info.Windows == 0 || len(oe.Info.First) == 0 || oe.Info.Share <= DefaultMaxOverlap {
		t.Fatalf("overlapping calibration text: error %v, want an OverlapError", err)
	}
	// 8 × 256 calibration tokens are all in the evaluation text; the
	// sampled runs find most of them (not the ends of each record's part,
	// nor parts shorter than two runs).
	if oe.Info.SharedTokens < 1024 || oe.Info.SharedTokens > 2048 {
		t.Errorf("%d shared tokens, want most of the 2048 calibration tokens", oe.Info.SharedTokens)
	}
	if !strings.Contains(err.Error(), "% of the scored tokens") || !strings.Contains(err.Error(), "the calibration data given") {
		t.Errorf("message %q does not say the share and where the fingerprint came from", err)
	}
	opt.AllowOverlap, opt.AllowedBy = true, "--allow-overlap"
	var logged []string
	opt.Log = func(s string) { logged = append(logged, s) }
	if _, err := Run(ctx, opt); !errors.Is(err, context.Canceled) {
		t.Fatalf("with AllowOverlap: error %v, want the cancelled context", err)
	}
	found := false
	for _, l := range logged {
		found = found || strings.HasPrefix(l, "warning:") && strings.Contains(l, "allowed by --allow-overlap")
	}
	if !found {
		t.Errorf("with AllowOverlap no warning names who allowed it: %q", logged)
	}
	// A larger maximum lets it pass.
	opt.AllowOverlap, opt.MaxOverlap = false, 0.5
	if _, err := Run(ctx, opt); !errors.Is(err, context.Canceled) {
		t.Fatalf("with MaxOverlap 0.5: error %v, want the cancelled context", err)
	}
}

// TestNoOverlapOnDisjointText: the trained model's calibration text
// (calib.jsonl, as the demo builds it) against its evaluation file, and
// against other Go files (this repository's), is not refused and draws no
// warning: the licence headers and boilerplate they have in common occur
// in many documents and do not count. The one text eval-dev really shares
// with calib.jsonl is a Debian changelog shipped identically by two
// packages (libdrm-amdgpu1 in calib.jsonl, libdrm-nouveau2 in
// eval-dev.jsonl line 51): about 0.6% of the scored tokens, and nothing
// else.
func TestNoOverlapOnDisjointText(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	cspec := must(dataset.ParseSpec("calib=" + filepath.Join(dir, "calib.jsonl")))
	copt := dataset.Options{Seed: 1, Calibration: dataset.SetOptions{Sequences: 48, SeqLen: 512}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		data    string
		records int
		where   string // the one record allowed to share text
	}{
		{filepath.Join(dir, "eval-dev.jsonl"), 80, "eval-dev.jsonl:51"},
		{"code=dir:" + filepath.Join(testdata.RepoRoot(), "emulator"), 40, ""},
	} {
		spec := must(dataset.ParseSpec(c.data))
		dopt := dataset.Options{EvalFraction: 1, Seed: 1, Evaluation: dataset.SetOptions{Sequences: c.records, SeqLen: 8192, Mode: dataset.ModeRecord, Short: dataset.ShortKeep}}
		var logged []string
		opt := Options{Model: dir, Self: true, Data: spec, DataOptions: dopt, Calib: cspec, CalibOptions: copt, Window: 8192,
			Log: func(s string) { logged = append(logged, s) }}
		_, err := Run(ctx, opt)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: error %v, want the cancelled context", c.data, err)
		}
		for _, l := range logged {
			if strings.HasPrefix(l, "warning:") {
				t.Errorf("%s: %s", c.data, l)
			}
			if strings.HasPrefix(l, "overlap:") {
				t.Logf("%s: %s", filepath.Base(c.data), l)
			}
		}
		// The first shared windows, from the check's record.
		tok := must(tokenizer.Load(dir))
		data := must(dataset.Build(spec, tok, dopt))
		fp := must(dataset.NewFingerprint(must(dataset.Build(cspec, tok, copt)).Calibration, 0))
		idx := must(fp.Index())
		var shared, total int
		for i, m := range idx.Shared(data.Evaluation) {
			for _, b := range m {
				total++
				if !b {
					continue
				}
				shared++
				if w := data.Evaluation.Sequences[i].Records[0].Where; c.where == "" || !strings.HasSuffix(w, c.where) {
					t.Fatalf("%s: text shared with the calibration text in %s", c.data, w)
				}
			}
		}
		if float64(shared) > 0.01*float64(total) {
			t.Errorf("%s: %d of %d tokens shared", c.data, shared, total)
		}
	}
}

func TestOptionsRefused(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	spec, dopt := perRecord(t, filepath.Join(dir, "eval-dev.jsonl"), 2)
	base := Options{Model: dir, Self: true, Data: spec, DataOptions: dopt}
	for name, mod := range map[string]func(*Options){
		"fidelity": func(o *Options) {
			d := must(ParseNumerics("device:HiFi4", "")).Device
			d.Fidelity = 99
			o.Numerics = Numerics{Device: d}
		},
		"no candidate": func(o *Options) { o.Self = false },
		"labels":       func(o *Options) { o.Labels = []string{"x"} },
		"no data":      func(o *Options) { o.Data = nil },
		"no sequences": func(o *Options) { o.DataOptions.Evaluation.Sequences = 0 },
		"window":       func(o *Options) { o.Window = 1 },
		"missing ckpt": func(o *Options) { o.Checkpoints = []string{filepath.Join(t.TempDir(), "none")} },
	} {
		o := base
		mod(&o)
		if _, err := Run(context.Background(), o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestSplitOptionsRefused: each rule of a split evaluation's options is
// refused by Run before anything is read, with a *SplitError naming the
// rule; its message names the options, or the names a caller gives.
func TestSplitOptionsRefused(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	spec, dopt := perRecord(t, filepath.Join(dir, "eval-dev.jsonl"), 2)
	parts := t.TempDir()
	for _, c := range []struct {
		shard           shard.Spec
		parts, assemble string
		rule            SplitRule
		want, flags     string
	}{
		{shard.Spec{Index: 3, Count: 3}, parts, "", SplitBadShard, "harness: Shard 3/3 names no worker", "--shard 3/3 names no worker"},
		{shard.Spec{Index: 0, Count: 3}, "", "", SplitNoParts, "harness: Shard 0/3 needs Parts,", "--shard 0/3 needs --parts,"},
		{shard.Spec{}, parts, "", SplitPartsAlone, "harness: Parts is for the workers of a split evaluation (Shard i/N)", "--parts is for the workers of a split evaluation (--shard i/N)"},
		{shard.Spec{Index: 1, Count: 3}, parts, parts, SplitWorkerMerges, "harness: Assemble merges the workers' parts; give it without Shard", "--assemble merges the workers' parts; give it without --shard"},
	} {
		o := Options{Model: filepath.Join(t.TempDir(), "none"), Self: true, Data: spec, DataOptions: dopt, Shard: c.shard, Parts: c.parts, Assemble: c.assemble}
		_, err := Run(context.Background(), o)
		var se *SplitError
		if !errors.As(err, &se) || se.Rule != c.rule || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%+v: %v, want rule %d: %q", c.shard, err, c.rule, c.want)
			continue
		}
		if got := se.Message(SplitNames{Shard: "--shard", Parts: "--parts", Assemble: "--assemble"}); !strings.HasPrefix(got, c.flags) {
			t.Errorf("%+v: message %q, want %q", c.shard, got, c.flags)
		}
	}
	for _, ok := range []Options{{}, {Shard: shard.Spec{Index: 0, Count: 1}}, {Shard: shard.Spec{Index: 2, Count: 3}, Parts: parts}, {Assemble: parts}} {
		if err := CheckSplit(ok.Shard, ok.Parts, ok.Assemble); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestOverlapFromManifest evaluates a sequential GPTQ checkpoint on text
// that repeats part of its calibration text, without giving the
// calibration text: the fingerprint the manifest records is enough to
// refuse.
func TestOverlapFromManifest(t *testing.T) {
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	lines := strings.SplitAfter(string(must(os.ReadFile(filepath.Join(dir, "eval-dev.jsonl")))), "\n")
	file := filepath.Join(t.TempDir(), "text.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines[:12], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	cspec := must(dataset.ParseSpec("text=" + file))
	p := must(plan.Preset(plan.PresetQwen36MoE))
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	_, err := build.GPTQ(context.Background(), build.BuildOptions{Source: dir, Out: ckpt, Plan: p, Data: cspec,
		DataOptions: dataset.Options{EvalFraction: 0.5, Seed: 3, Calibration: dataset.SetOptions{Sequences: 6, SeqLen: 256}},
		Layers:      `layers\.0\.mlp\.experts\..*`})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(t.TempDir(), "moved.jsonl")
	if err := os.WriteFile(moved, []byte(strings.Join(lines[:12], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, dopt := perRecord(t, moved, 12)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	opt := Options{Model: dir, Checkpoints: []string{ckpt}, Data: spec, DataOptions: dopt, Window: 8192}
	var oe *OverlapError
	if _, err := Run(ctx, opt); !errors.As(err, &oe) || oe.Info.SharedTokens == 0 || !strings.Contains(err.Error(), "the manifest of ckpt") {
		t.Fatalf("evaluation on the calibration text: error %v, want an OverlapError naming the manifest", err)
	}
}

// TestRunnerLogitBlocks: the runner computes logits a block of
// forward.LogitChunk positions at a time and serves requests from it;
// requests of every size and alignment (within a block, across blocks, at
// the window's end, longer than a block, repeated after a jump back) get
// the bits of the model's own Logits over the window, window after window.
func TestRunnerLogitBlocks(t *testing.T) {
	m, err := forward.Open(testdata.Dir(t, "models", "tiny-qwen36-trained"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	V := m.Config.Vocab
	r := newRunner(m)
	for _, n := range []int{150, 40} {
		tokens := make([]int32, n)
		for i := range tokens {
			tokens[i] = int32((i*37 + n) % V)
		}
		wl, err := r.Forward(context.Background(), tokens)
		if err != nil {
			t.Fatal(err)
		}
		r.wait()
		want := make([]float32, 0, n*V)
		if err := m.Logits(r.hf, func(_, rows int, lg []float32) error {
			want = append(want, lg[:rows*V]...)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, c := range [][2]int{{0, 16}, {16, 17}, {17, 60}, {60, 70}, {5, 9}, {70, n}, {0, n}, {n - 1, n}, {0, 1}} {
			lo, hi := min(c[0], n), min(c[1], n)
			dst := make([]float32, (hi-lo)*V)
			if err := wl.Logits(dst, lo, hi); err != nil {
				t.Fatal(err)
			}
			for i, v := range dst {
				if math.Float32bits(v) != math.Float32bits(want[lo*V+i]) {
					t.Fatalf("window of %d, positions [%d,%d): value %d is %g, want %g", n, lo, hi, i, v, want[lo*V+i])
				}
			}
		}
	}
}
