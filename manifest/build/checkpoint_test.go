package build

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

// fixture is the tiny source model and a small synthetic calibration
// store, written once per test binary.
var fixture struct {
	once  sync.Once
	dir   string
	src   string
	store string
	err   error
}

func TestMain(m *testing.M) {
	atomicfile.Durable = false
	code := m.Run()
	if fixture.dir != "" {
		os.RemoveAll(fixture.dir)
	}
	os.Exit(code)
}

func tinyFixture(t testing.TB) (src, store string) {
	t.Helper()
	fixture.once.Do(func() {
		fixture.dir, fixture.err = os.MkdirTemp("", "manifest-test-")
		if fixture.err != nil {
			return
		}
		fixture.src = filepath.Join(fixture.dir, "model")
		if fixture.err = testmodel.Write(fixture.src, testmodel.Tiny(), testmodel.Default); fixture.err != nil {
			return
		}
		mc, err := model.ReadConfig(fixture.src)
		if err != nil {
			fixture.err = err
			return
		}
		fixture.store = filepath.Join(fixture.dir, "calib")
		_, fixture.err = calib.SynthesizeStore(fixture.store, mc, calib.SynthStoreOptions{Sequences: 4, SeqLen: 48})
	})
	if fixture.err != nil {
		t.Fatal(fixture.err)
	}
	return fixture.src, fixture.store
}

func preset(t testing.TB) *plan.Plan {
	t.Helper()
	p, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func convertOpts(t testing.TB, out string, workers int) BuildOptions {
	src, _ := tinyFixture(t)
	return BuildOptions{Source: src, Out: out, Plan: preset(t), Workers: workers}
}

func gptqOpts(t testing.TB, out string, workers int) BuildOptions {
	src, store := tinyFixture(t)
	return BuildOptions{Source: src, Out: out, Plan: preset(t), Workers: workers, Calib: store, AllowSyntheticCalibration: true, Layers: "experts", HeldOutSequences: 1}
}

// gptq1Opts selects the routed experts of layer 1 only: a GPTQ build that
// exercises every code path at a quarter of the solver work, for the tests
// that build many times.
func gptq1Opts(t testing.TB, out string, workers int) BuildOptions {
	o := gptqOpts(t, out, workers)
	o.Layers = `model\.language_model\.layers\.1\.mlp\.experts\..*`
	return o
}

// readTree returns every file under dir by relative path.
func readTree(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		out[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t testing.TB, what, a, b string) {
	t.Helper()
	ta, tb := readTree(t, a), readTree(t, b)
	var names []string
	for n := range ta {
		names = append(names, n)
	}
	for n := range tb {
		if _, ok := ta[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		x, okx := ta[n]
		y, oky := tb[n]
		switch {
		case !okx || !oky:
			t.Errorf("%s: file %s present in only one of the two directories", what, n)
		case !bytes.Equal(x, y):
			t.Errorf("%s: file %s differs (%d and %d bytes)", what, n, len(x), len(y))
		}
	}
}

func copyTree(t testing.TB, from, to string) {
	t.Helper()
	for n, b := range readTree(t, from) {
		p := filepath.Join(to, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func mustVerify(t testing.TB, dir string, opt VerifyOptions) *manifest.VerifyReport {
	t.Helper()
	rep, err := Verify(context.Background(), dir, opt)
	if err != nil {
		t.Fatalf("verify %s: %v", dir, err)
	}
	return rep
}

// reference builds (once per test binary) an uninterrupted checkpoint.
var refs sync.Map

func reference(t testing.TB, kind string) string {
	t.Helper()
	if v, ok := refs.Load(kind); ok {
		return v.(string)
	}
	src, _ := tinyFixture(t)
	out := filepath.Join(filepath.Dir(src), "ref-"+kind)
	var err error
	switch kind {
	case "gptq":
		_, err = GPTQ(context.Background(), gptqOpts(t, out, 4))
	case "gptq1":
		_, err = GPTQ(context.Background(), gptq1Opts(t, out, 4))
	default:
		_, err = Convert(context.Background(), convertOpts(t, out, 4))
	}
	if err != nil {
		t.Fatal(err)
	}
	refs.Store(kind, out)
	return out
}

func TestConvertVerifyAndRead(t *testing.T) {
	src, _ := tinyFixture(t)
	out := reference(t, "convert")
	rep := mustVerify(t, out, VerifyOptions{Source: src, Workers: 2})
	if !rep.OK || rep.Incomplete || !rep.SourceChecked {
		t.Fatalf("verify: %+v", rep)
	}
	c, err := manifest.OpenCheckpoint(out)
	if err != nil {
		t.Fatal(err)
	}
	if c.Identity() != rep.Identity || c.CacheKey() != rep.Identity[:16] {
		t.Errorf("identity %s / cache key %s, verify says %s", c.Identity(), c.CacheKey(), rep.Identity)
	}
	// The stored bytes of an RTN tensor are bfp.Pack of the source values,
	// transposed to [in, out] (the preset's output axis), and Float32s
	// decodes them back to the logical [out, in] orientation.
	name := "model.language_model.layers.1.mlp.experts.5.down_proj"
	ti, err := c.TensorInfo(name)
	if err != nil {
		t.Fatal(err)
	}
	if ti.Format != "BFP4_b" || ti.Method != manifest.MethodRTN || ti.DType != "U8" || ti.Orientation != manifest.OrientTransposed || ti.Tile != "32x32" {
		t.Fatalf("entry %+v", ti)
	}
	if ti.File != "experts-l001-down-g000.safetensors" || *ti.Expert != 5 || *ti.Layer != 1 {
		t.Errorf("expert 5 of layer 1 stored in %s (expert %v layer %v)", ti.File, *ti.Expert, *ti.Layer)
	}
	cfg := testmodel.Tiny()
	srcVals, err := testmodel.Values(cfg, testmodel.ExpertsFused, "model.language_model.layers.1.mlp.experts.down_proj")
	if err != nil {
		t.Fatal(err)
	}
	per := cfg.Hidden * cfg.MoEIntermediate
	w := srcVals[5*per : 6*per] // [Hidden, MoEIntermediate]
	wt := make([]float32, per)  // its transpose, [MoEIntermediate, Hidden]
	for r := 0; r < cfg.Hidden; r++ {
		for c := 0; c < cfg.MoEIntermediate; c++ {
			wt[c*cfg.Hidden+r] = w[r*cfg.MoEIntermediate+c]
		}
	}
	want, err := bfp.Pack(bfp.BFP4, bfp.Tile32x32, wt, cfg.MoEIntermediate, cfg.Hidden)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.ReadPacked(name)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("stored bytes of %s differ from bfp.Pack of the source", name)
	}
	vals, err := c.Float32s(name)
	if err != nil {
		t.Fatal(err)
	}
	dec, _ := bfp.Unpack(bfp.BFP4, bfp.Tile32x32, want, cfg.MoEIntermediate, cfg.Hidden)
	for i := range vals {
		r, c := i/cfg.MoEIntermediate, i%cfg.MoEIntermediate
		if vals[i] != dec[c*cfg.Hidden+r] {
			t.Fatalf("Float32s[%d] = %g, bfp.Unpack gives %g", i, vals[i], dec[c*cfg.Hidden+r])
		}
	}
	if _, err := c.TensorInfo("no.such.tensor"); !errors.Is(err, manifest.ErrNoTensor) {
		t.Errorf("unknown tensor: %v", err)
	}
	// Lossless tensors are the source bytes.
	if ti, _ := c.TensorInfo("model.language_model.layers.0.linear_attn.A_log"); ti.DType != "F32" || ti.Method != manifest.MethodNone {
		t.Errorf("A_log stored as %+v", ti)
	}
}

// TestSHA256SUMS checks the checksum file against the files themselves, and
// with sha256sum when it is installed.
func TestSHA256SUMS(t *testing.T) {
	out := reference(t, "convert")
	data, err := os.ReadFile(filepath.Join(out, manifest.SumsName))
	if err != nil {
		t.Fatal(err)
	}
	tree := readTree(t, out)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != len(tree)-2 {
		t.Errorf("%d lines for %d files (all but the manifest and the list itself)", len(lines), len(tree)-2)
	}
	for _, l := range lines {
		sum, name, ok := strings.Cut(l, "  ")
		if !ok || !hexRe.MatchString(sum) {
			t.Fatalf("bad line %q", l)
		}
		if b, ok := tree[name]; !ok || manifest.SHA256Hex(b) != sum {
			t.Errorf("line %q does not match the file", l)
		}
	}
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "--strict", "-c", manifest.SumsName)
		cmd.Dir = out
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sha256sum -c: %v\n%s", err, b)
		}
	}
}

func TestGPTQBuildVerifies(t *testing.T) {
	src, store := tinyFixture(t)
	out := reference(t, "gptq")
	rep := mustVerify(t, out, VerifyOptions{Source: src, Workers: 2})
	if !rep.OK {
		t.Fatalf("%v", rep.Failures)
	}
	c, err := manifest.OpenCheckpoint(out)
	if err != nil {
		t.Fatal(err)
	}
	m := c.Manifest()
	gptqCount, fallbacks := 0, 0
	for _, ms := range m.TTQuant.Matrices {
		switch {
		case ms.Method == manifest.MethodGPTQ:
			gptqCount++
			// Layer 0 expert 3 has all-zero gate rows, so its down_proj
			// sees zero inputs and both losses are 0.
			if ms.Tokens <= 0 || ms.Damp <= 0 || ms.ProxyLoss < 0 || ms.RTNProxyLoss < 0 {
				t.Errorf("GPTQ statistics of %s: %+v", ms.Tensor, ms)
			}
		case ms.Fallback != "":
			fallbacks++
		default:
			t.Errorf("RTN matrix %s without a fallback reason", ms.Tensor)
		}
	}
	// 5 layers (4 trunk, 1 MTP) × (16 routed experts × 2 tensors + the
	// shared expert's gate, up and down). Experts that too few calibration
	// tokens reach fall back to RTN, as does a layer without inputs in the
	// store.
	if gptqCount+fallbacks != 5*(16*2+3) || gptqCount < 100 {
		t.Errorf("%d GPTQ matrices and %d fallbacks, want %d in all", gptqCount, fallbacks, 5*(16*2+3))
	}
	// --layers experts covers the shared expert: every layer's shared
	// gate, up and down are GPTQ'd over all calibration tokens (4
	// sequences of 48, one held out), in the statistics and in the tensor
	// entries.
	shared := map[string]bool{}
	for _, ms := range m.TTQuant.Matrices {
		if strings.Contains(ms.Tensor, ".shared_expert.") {
			shared[ms.Tensor] = true
			if ms.Method != manifest.MethodGPTQ || ms.Tokens != 144 {
				t.Errorf("shared expert %s: method %s, %d tokens (fallback %q), want gptq over 144", ms.Tensor, ms.Method, ms.Tokens, ms.Fallback)
			}
		}
	}
	if len(shared) != 5*3 {
		t.Errorf("%d shared-expert matrices in the statistics, want %d: %v", len(shared), 5*3, shared)
	}
	for _, te := range m.Tensors {
		if shared[te.Name] && te.Method != manifest.MethodGPTQ {
			t.Errorf("tensor entry %s records %s, want gptq", te.Name, te.Method)
		}
	}
	if m.TTQuant.Calibration == nil || m.TTQuant.Calibration.Sequences != 4 || m.TTQuant.Calibration.HeldOutSequences != 1 {
		t.Errorf("calibration %+v", m.TTQuant.Calibration)
	}
	held := 0
	for _, l := range m.TTQuant.Layers {
		if l.HeldOutTokens > 0 {
			held++
			if l.HeldOutMSE <= 0 || l.HeldOutRTNMSE <= 0 {
				t.Errorf("layer %d held-out errors %+v", l.Layer, l)
			}
		}
	}
	st, err := calib.OpenStore(store)
	if err != nil {
		t.Fatal(err)
	}
	withInputs := 0
	for l := 0; l < 5; l++ {
		if _, ok := st.Site(l, calib.SiteMoE); ok {
			withInputs++
		}
	}
	if held != withInputs || held < 4 {
		t.Errorf("%d layers with held-out statistics, want the %d with MoE inputs in the store", held, withInputs)
	}
	// Editing a GPTQ error in the manifest (with a valid integrity hash)
	// is caught only against the source.
	dir := t.TempDir()
	copyTree(t, out, dir)
	for i := range m.TTQuant.Matrices {
		if m.TTQuant.Matrices[i].Method == manifest.MethodGPTQ {
			m.TTQuant.Matrices[i].Error *= 1.5
			break
		}
	}
	rewriteManifest(t, dir, m)
	if rep := mustVerify(t, dir, VerifyOptions{}); !rep.OK {
		t.Fatalf("a statistics edit fails without the source: %v", rep.Failures)
	}
	if rep := mustVerify(t, dir, VerifyOptions{Source: src}); rep.OK || !strings.Contains(fmt.Sprint(rep.Failures), "error against the source") {
		t.Fatalf("an edited GPTQ error passes against the source: %v", rep.Failures)
	}
}

func rewriteManifest(t testing.TB, dir string, m *manifest.Manifest) {
	t.Helper()
	data, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifest.ManifestName), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSameBytesForAnyWorkerCountAndRerun(t *testing.T) {
	ref := reference(t, "convert")
	out1 := filepath.Join(t.TempDir(), "w1")
	res, err := Convert(context.Background(), convertOpts(t, out1, 1))
	if err != nil {
		t.Fatal(err)
	}
	sameTree(t, "convert, 1 vs 4 workers", ref, out1)
	// A second run on a finished directory keeps every file and rewrites
	// the same manifest.
	again, err := Convert(context.Background(), convertOpts(t, out1, 3))
	if err != nil {
		t.Fatal(err)
	}
	if !again.AlreadyComplete || again.Identity != res.Identity {
		t.Errorf("second run: complete=%v identity %s, first %s", again.AlreadyComplete, again.Identity, res.Identity)
	}
	sameTree(t, "convert, second run", ref, out1)
	if purego {
		t.Log("GPTQ worker-count check skipped with the portable kernels (see purego_on_test.go)")
		return
	}

	g1 := filepath.Join(t.TempDir(), "g1")
	if _, err := GPTQ(context.Background(), gptq1Opts(t, g1, 1)); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "gptq, 1 vs 4 workers", reference(t, "gptq1"), g1)
}

// TestCorruption damages a GPTQ checkpoint in every file and checks that
// verify fails naming the file.
func TestCorruption(t *testing.T) {
	ref := reference(t, "gptq1")
	dir := t.TempDir()
	copyTree(t, ref, dir)
	names := make([]string, 0)
	for n := range readTree(t, dir) {
		names = append(names, n)
	}
	sort.Strings(names)
	rng := rand.New(rand.NewSource(7))
	expectFail := func(what, file string) {
		t.Helper()
		rep := mustVerify(t, dir, VerifyOptions{})
		if rep.OK {
			t.Errorf("%s: verify passes", what)
			return
		}
		for _, f := range rep.Failures {
			if f.File == file {
				return
			}
		}
		t.Errorf("%s: no failure names %s: %v", what, file, rep.Failures)
	}
	for _, n := range names {
		p := filepath.Join(dir, filepath.FromSlash(n))
		orig, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		flips := 1
		if len(orig) > 64<<10 {
			flips = 4
		}
		for k := 0; k < flips; k++ {
			// Spread the places over the file: header, middle, end.
			lo := len(orig) * k / flips
			hi := len(orig) * (k + 1) / flips
			at := lo + rng.Intn(hi-lo)
			bit := byte(1) << rng.Intn(8)
			bad := append([]byte(nil), orig...)
			bad[at] ^= bit
			if err := os.WriteFile(p, bad, 0o644); err != nil {
				t.Fatal(err)
			}
			expectFail(fmt.Sprintf("bit %#x of byte %d of %s flipped", bit, at, n), n)
		}
		// Truncation by one byte.
		if err := os.WriteFile(p, orig[:len(orig)-1], 0o644); err != nil {
			t.Fatal(err)
		}
		expectFail("truncated "+n, n)
		// Deletion.
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if n == manifest.ManifestName {
			if rep := mustVerify(t, dir, VerifyOptions{}); rep.OK || !rep.Incomplete {
				t.Errorf("without the manifest: %+v", rep)
			}
		} else {
			expectFail("deleted "+n, n)
		}
		if err := os.WriteFile(p, orig, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if rep := mustVerify(t, dir, VerifyOptions{}); !rep.OK {
		t.Fatalf("restored checkpoint fails: %v", rep.Failures)
	}
	// An added file.
	extra := filepath.Join(dir, "stray.safetensors")
	if err := os.WriteFile(extra, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	expectFail("added file", "stray.safetensors")
	os.Remove(extra)

	// Edited manifests with a recomputed integrity hash: the edits are
	// caught by the file checks.
	c, err := manifest.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := os.ReadFile(filepath.Join(dir, manifest.ManifestName))
	edits := []struct {
		name string
		edit func(m *manifest.Manifest) string // returns the file expected in a failure
	}{
		{"tensor offset", func(m *manifest.Manifest) string { m.Tensors[3].Offset += 2; return m.Tensors[3].File }},
		// A stored-as-is tensor: its shape is in the file header. (A BFP
		// tensor's rows may double within its padded tiles unnoticed
		// without the source.)
		{"tensor shape", func(m *manifest.Manifest) string {
			for i := 7; i < len(m.Tensors); i++ {
				if !manifest.StoredFormat(m.Tensors[i].Format).IsBFP() {
					m.Tensors[i].Shape[0] *= 2
					return m.Tensors[i].File
				}
			}
			return ""
		}},
		{"file hash", func(m *manifest.Manifest) string {
			m.Files[0].SHA256 = strings.Repeat("ab", 32)
			return m.Files[0].Name
		}},
		{"file dropped", func(m *manifest.Manifest) string {
			for i, f := range m.Files {
				if f.Role == manifest.FileConfig {
					m.Files = append(m.Files[:i], m.Files[i+1:]...)
					return f.Name
				}
			}
			return ""
		}},
		{"tensor moved to another expert", func(m *manifest.Manifest) string {
			for i := range m.Tensors {
				if m.Tensors[i].Expert != nil && *m.Tensors[i].Expert == 3 {
					m.Tensors[i].Expert = intPtr(30)
					return m.Tensors[i].File
				}
			}
			return ""
		}},
	}
	for _, e := range edits {
		m, err := manifest.DecodeManifest(mb)
		if err != nil {
			t.Fatal(err)
		}
		file := e.edit(m)
		rewriteManifest(t, dir, m)
		expectFail("edited manifest: "+e.name, file)
	}
	_ = c
	// A manifest edited by hand without a new integrity hash.
	edited := bytes.Replace(mb, []byte(`"experts_per_file": 16`), []byte(`"experts_per_file": 8`), 1)
	if bytes.Equal(edited, mb) {
		t.Fatal("edit did not apply")
	}
	os.WriteFile(filepath.Join(dir, manifest.ManifestName), edited, 0o644)
	expectFail("hand-edited manifest", manifest.ManifestName)
}

// interruptAt runs build with a hook that cancels the run at the n-th hook
// call (tensor written or file committed); when snapshot is set, it first
// copies the output directory as a crash at that instant would leave it.
func interruptAt(t *testing.T, opt BuildOptions, kind string, n int64, snapshot string) (at string, _ error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int64
	var once sync.Once
	var snapErr error
	opt.testHook = func(file, tensor string) {
		if calls.Add(1) == n {
			once.Do(func() {
				at = file + ":" + tensor
				if snapshot != "" {
					snapErr = snapshotTree(opt.Out, snapshot)
				}
				cancel()
			})
		}
	}
	var err error
	if kind == "convert" {
		_, err = Convert(ctx, opt)
	} else {
		_, err = GPTQ(ctx, opt)
	}
	if snapErr != nil {
		t.Fatalf("snapshot: %v", snapErr)
	}
	return at, err
}

// snapshotTree copies dir as a crash at this instant would leave it, while
// other workers go on writing: files that vanish (renamed or removed)
// between listing and reading are skipped. It runs on a worker goroutine,
// so it returns errors instead of failing the test.
func snapshotTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
}

func expectIncomplete(t *testing.T, what, dir string) {
	t.Helper()
	rep := mustVerify(t, dir, VerifyOptions{})
	if rep.OK || !rep.Incomplete {
		t.Fatalf("%s: verify %+v", what, rep)
	}
	for _, f := range rep.Failures {
		if !strings.Contains(f.What, "incomplete") {
			t.Errorf("%s: failure %q is not about an unfinished build", what, f)
		}
	}
	if _, err := manifest.OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Errorf("%s: OpenCheckpoint: %v", what, err)
	}
}

func TestInterruptAndResume(t *testing.T) {
	kinds := []string{"convert", "gptq1"}
	if purego {
		kinds = kinds[:1]
	}
	for _, kind := range kinds {
		ref := reference(t, kind)
		c, err := manifest.OpenCheckpoint(ref)
		if err != nil {
			t.Fatal(err)
		}
		// Hook calls of a full run: one per tensor written and one per
		// data file committed.
		total := int64(len(c.Manifest().Tensors))
		for _, f := range c.Manifest().Files {
			if f.Role == manifest.FileExperts || f.Role == manifest.FileDense {
				total++
			}
		}
		points := []int64{1, 2, total / 3, total / 2, total - 1, total}
		if kind == "gptq1" {
			// The GPTQ layer's two files are written last, 16 tensors and
			// a commit each: stop in the middle of the first one, after
			// the other files (the between-files and before-manifest
			// cases are covered by convert).
			points = []int64{total - 20}
		}
		for _, n := range points {
			base := t.TempDir()
			out := filepath.Join(base, "out")
			snap := filepath.Join(base, "crash")
			var opt BuildOptions
			if kind == "gptq1" {
				opt = gptq1Opts(t, out, 2)
			} else {
				opt = convertOpts(t, out, 2)
			}
			at, err := interruptAt(t, opt, kind, n, snap)
			if kind == "gptq1" && !strings.HasPrefix(at, "experts-l001-") {
				t.Errorf("interruption point %d is in %s, not in the GPTQ layer's files", n, at)
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%s interrupted at %d of %d: %v", kind, n, total, err)
			}
			what := fmt.Sprintf("%s cancelled at hook %d of %d", kind, n, total)
			expectIncomplete(t, what, out)
			expectIncomplete(t, what+" (crash snapshot)", snap)
			for _, dir := range []string{out, snap} {
				o := opt
				o.Out = dir
				o.Workers = 3
				res, err := build(context.Background(), map[string]buildKind{"gptq1": kindGPTQ, "convert": kindConvert}[kind], o)
				if err != nil {
					t.Fatalf("%s: resume: %v", what, err)
				}
				if res.Kept == 0 && n > 2 {
					t.Errorf("%s: resume kept no file", what)
				}
				sameTree(t, what+", resumed", ref, dir)
			}
		}
	}
}

func TestResumeRefusesDifferentBuild(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	if _, err := interruptAt(t, convertOpts(t, out, 1), "convert", 3, ""); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	o := convertOpts(t, out, 1)
	o.ExpertsPerFile = 8
	_, err := Convert(context.Background(), o)
	if !errors.Is(err, ErrResumeMismatch) || !strings.Contains(err.Error(), "experts_per_file") {
		t.Errorf("different layout: %v", err)
	}
	o = convertOpts(t, out, 1)
	o.Exponent = gptq.ExpTTMetal
	_, err = Convert(context.Background(), o)
	if !errors.Is(err, ErrResumeMismatch) || !strings.Contains(err.Error(), "bfp_exponent") {
		t.Errorf("different exponent rule: %v", err)
	}
	o = convertOpts(t, out, 1)
	o.Plan.Rules[len(o.Plan.Rules)-2].Format = manifest.StoreBFP4
	_, err = Convert(context.Background(), o)
	if !errors.Is(err, ErrResumeMismatch) || !strings.Contains(err.Error(), "plan") {
		t.Errorf("different plan: %v", err)
	}
	_, err = GPTQ(context.Background(), gptqOpts(t, out, 1))
	if !errors.Is(err, ErrResumeMismatch) || !strings.Contains(err.Error(), "command") {
		t.Errorf("different command: %v", err)
	}
	// A different source: a copy of the model with one byte changed.
	src, _ := tinyFixture(t)
	src2 := filepath.Join(t.TempDir(), "model")
	copyTree(t, src, src2)
	p := filepath.Join(src2, "model-00002-of-00003.safetensors")
	b, _ := os.ReadFile(p)
	b[len(b)-1] ^= 1
	os.WriteFile(p, b, 0o644)
	o = convertOpts(t, out, 1)
	o.Source = src2
	_, err = Convert(context.Background(), o)
	if !errors.Is(err, ErrResumeMismatch) || !strings.Contains(err.Error(), "source") {
		t.Errorf("different source: %v", err)
	}
	// Verify against the changed source names the changed file.
	ref := reference(t, "convert")
	rep := mustVerify(t, ref, VerifyOptions{Source: src2})
	if rep.OK || !strings.Contains(fmt.Sprint(rep.Failures), "model-00002-of-00003.safetensors") {
		t.Errorf("verify against a changed source: %v", rep.Failures)
	}
	// An unrelated non-empty directory is refused.
	junk := t.TempDir()
	os.WriteFile(filepath.Join(junk, "notes.txt"), []byte("x"), 0o644)
	if _, err := Convert(context.Background(), convertOpts(t, junk, 1)); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("non-empty directory: %v", err)
	}
}

func TestVerifyErrors(t *testing.T) {
	if _, err := Verify(context.Background(), filepath.Join(t.TempDir(), "none"), VerifyOptions{}); !errors.Is(err, manifest.ErrNotCheckpoint) {
		t.Errorf("missing directory: %v", err)
	}
	if _, err := Verify(context.Background(), t.TempDir(), VerifyOptions{}); !errors.Is(err, manifest.ErrNotCheckpoint) {
		t.Errorf("empty directory: %v", err)
	}
}

func TestDryRunOn35BReplica(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "replica")
	if err := testmodel.WriteReplica35B(dir); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "never")
	res, err := GPTQ(context.Background(), BuildOptions{Source: dir, Out: out, Plan: preset(t), Layers: "experts", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	w := res.Work
	// 40 trunk layers and the MTP layer, 256 experts in groups of 16, one
	// gate_up and one down file per group; GPTQ for the routed experts'
	// gate_up and down and the shared expert's gate, up and down.
	if w.ExpertFiles != 41*16*2 || w.GPTQMatrices != 41*(256*2+3) || len(w.Layers) != 41 {
		t.Errorf("work %+v", w)
	}
	if w.OutputBytes <= 0 || w.OutputBytes >= w.SourceBytes || w.GPTQFlops <= 0 {
		t.Errorf("sizes %+v", w)
	}
	if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dry run created the output directory: %v", err)
	}
}

func TestManifestEncodingIsCanonical(t *testing.T) {
	out := reference(t, "convert")
	data, err := os.ReadFile(filepath.Join(out, manifest.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.DecodeManifest(data)
	if err != nil {
		t.Fatal(err)
	}
	again, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, data) {
		t.Error("decoding and re-encoding the manifest changes its bytes")
	}
	// Unknown fields and other format versions are refused.
	var raw map[string]any
	json.Unmarshal(data, &raw)
	raw["surprise"] = 1
	b, _ := json.Marshal(raw)
	if _, err := manifest.DecodeManifest(b); err == nil {
		t.Error("unknown field accepted")
	}
	raw["format_version"] = 99
	delete(raw, "surprise")
	b, _ = json.Marshal(raw)
	if _, err := manifest.DecodeManifest(b); err == nil || !strings.Contains(err.Error(), "format_version") {
		t.Errorf("format_version 99: %v", err)
	}
	for _, s := range []string{"time", "date", "host"} {
		if bytes.Contains(data, []byte(`"`+s)) {
			t.Errorf("manifest has a %q field", s)
		}
	}
}

// TestRerunRepairsDamage re-runs a build on a finished checkpoint with one
// damaged file: only that file is produced again and the result is the
// undamaged checkpoint.
func TestRerunRepairsDamage(t *testing.T) {
	ref := reference(t, "convert")
	dir := filepath.Join(t.TempDir(), "out")
	copyTree(t, ref, dir)
	p := filepath.Join(dir, "experts-l002-gate_up-g000.safetensors")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-5] ^= 0x40
	os.WriteFile(p, b, 0o644)
	if rep := mustVerify(t, dir, VerifyOptions{}); rep.OK {
		t.Fatal("damage not detected")
	}
	res, err := Convert(context.Background(), convertOpts(t, dir, 2))
	if err != nil {
		t.Fatal(err)
	}
	if want := res.Work.Files - 1; res.Kept != want || res.AlreadyComplete {
		t.Errorf("kept %d files (complete=%v), want %d", res.Kept, res.AlreadyComplete, want)
	}
	sameTree(t, "repaired", ref, dir)
}

// TestGPTQDenseSelection quantizes dense matrices chosen by a pattern with
// Hessians from the store's sites; matrices without stored inputs fall
// back to RTN with a reason.
func TestGPTQDenseSelection(t *testing.T) {
	src, _ := tinyFixture(t)
	out := filepath.Join(t.TempDir(), "out")
	opt := gptqOpts(t, out, 2)
	opt.Layers = `model\.language_model\.layers\.[01]\.(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|out_proj)|mlp\.shared_expert\.(up|down)_proj).*`
	res, err := GPTQ(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]string{}
	for _, ms := range res.Manifest.TTQuant.Matrices {
		methods[ms.Tensor] = string(ms.Method) + "|" + ms.Fallback
		if ms.Method == manifest.MethodGPTQ && ms.Tokens != 144 {
			t.Errorf("%s: %d tokens, want the 144 calibration tokens", ms.Tensor, ms.Tokens)
		}
	}
	for name, want := range map[string]string{
		"model.language_model.layers.0.linear_attn.in_proj_qkv.weight":     "gptq|",
		"model.language_model.layers.1.linear_attn.out_proj.weight":        "gptq|",
		"model.language_model.layers.0.mlp.shared_expert.up_proj.weight":   "gptq|",
		"model.language_model.layers.0.mlp.shared_expert.down_proj.weight": "gptq|",
	} {
		if methods[name] != want {
			t.Errorf("%s: %q, want %q", name, methods[name], want)
		}
	}
	// Layers 0 and 1 are linear-attention layers: in_proj_qkv, out_proj
	// and the shared expert's up and down projections each.
	if len(methods) != 8 {
		t.Errorf("%d matrices selected, want 8: %v", len(methods), methods)
	}
	for _, te := range res.Manifest.Tensors {
		if te.Method == manifest.MethodGPTQ && te.Expert != nil {
			t.Errorf("expert tensor %s quantized with GPTQ though not selected", te.Name)
		}
	}
	if rep := mustVerify(t, out, VerifyOptions{Source: src}); !rep.OK {
		t.Fatalf("%v", rep.Failures)
	}
}

// TestVerifyReappliesPlan edits the rule a tensor claims to come from:
// only re-resolving the plan against the source can tell.
func TestVerifyReappliesPlan(t *testing.T) {
	src, _ := tinyFixture(t)
	dir := t.TempDir()
	copyTree(t, reference(t, "convert"), dir)
	c, err := manifest.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := c.Manifest()
	name := "model.language_model.layers.3.self_attn.q_proj.weight"
	for i := range m.Tensors {
		if m.Tensors[i].Name == name {
			m.Tensors[i].Rule = 0
		}
	}
	rewriteManifest(t, dir, m)
	if rep := mustVerify(t, dir, VerifyOptions{}); !rep.OK {
		t.Fatalf("without the source: %v", rep.Failures)
	}
	rep := mustVerify(t, dir, VerifyOptions{Source: src})
	if rep.OK || len(rep.Failures) != 1 || rep.Failures[0].Tensor != name || !strings.Contains(rep.Failures[0].What, "the plan gives") {
		t.Fatalf("against the source: %v", rep.Failures)
	}
}

func TestGPTQSelectionMustMatch(t *testing.T) {
	opt := gptqOpts(t, filepath.Join(t.TempDir(), "out"), 1)
	opt.Layers = `no\.such\.tensor`
	if _, err := GPTQ(context.Background(), opt); err == nil || !strings.Contains(err.Error(), "selects no matrix") {
		t.Errorf("empty selection: %v", err)
	}
	opt.Layers = `(`
	if _, err := GPTQ(context.Background(), opt); err == nil || !strings.Contains(err.Error(), "regular expression") {
		t.Errorf("bad pattern: %v", err)
	}
}

func TestVerifyForeignDirectory(t *testing.T) {
	src, _ := tinyFixture(t)
	if _, err := Verify(context.Background(), src, VerifyOptions{}); !errors.Is(err, manifest.ErrNotCheckpoint) {
		t.Errorf("a Hugging Face directory: %v", err)
	}
}

func TestProgressEvents(t *testing.T) {
	opt := convertOpts(t, filepath.Join(t.TempDir(), "out"), 3)
	var mu sync.Mutex
	var evs []ProgressEvent
	opt.Progress = func(ev ProgressEvent) {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
	}
	res, err := Convert(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < 2 || evs[0].Kind != "start" || evs[len(evs)-1].Kind != "done" {
		t.Fatalf("events %+v", evs)
	}
	files, layers := 0, map[int]bool{}
	var last int64
	for _, ev := range evs {
		switch ev.Kind {
		case "file":
			files++
			if ev.BytesDone < last || ev.BytesDone > ev.BytesTotal || ev.FilesDone != files {
				t.Errorf("event %+v after %d bytes, %d files", ev, last, files)
			}
			last = ev.BytesDone
		case "layer":
			if layers[ev.Layer] {
				t.Errorf("layer %d reported twice", ev.Layer)
			}
			layers[ev.Layer] = true
		}
	}
	if files != res.Work.Files || len(layers) != 5 {
		t.Errorf("%d file events for %d files, layers %v", files, res.Work.Files, layers)
	}
}

// TestFusedAndPerExpertSourcesGiveSameFiles converts the tiny model in its
// fused (Qwen3.5/3.6) and per-expert (one tensor per expert and projection)
// layouts: every data file is byte-identical; only the manifest's source
// records differ.
func TestFusedAndPerExpertSourcesGiveSameFiles(t *testing.T) {
	per := filepath.Join(t.TempDir(), "per-expert")
	if err := testmodel.Write(per, testmodel.Tiny(), testmodel.PerExpert); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	o := convertOpts(t, out, 2)
	o.Source = per
	if _, err := Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	ref := readTree(t, reference(t, "convert"))
	got := readTree(t, out)
	n := 0
	for name, b := range ref {
		if !strings.HasSuffix(name, ".safetensors") {
			continue
		}
		n++
		if !bytes.Equal(got[name], b) {
			t.Errorf("%s differs between the fused and the per-expert source", name)
		}
	}
	if n != 11 {
		t.Errorf("compared %d data files, want 11", n)
	}
	if rep := mustVerify(t, out, VerifyOptions{Source: per}); !rep.OK {
		t.Fatalf("%v", rep.Failures)
	}
}

// TestSharedDownFitsQuantizedGateUp: the shared expert's down projection
// is GPTQ'd against the Hessian of the SwiGLU output of the gate and up
// projections as the checkpoint stores them (quantized), not as the source
// holds them: quantizing the source down_proj with that Hessian gives the
// stored values exactly, and the source gate/up's Hessian gives others.
func TestSharedDownFitsQuantizedGateUp(t *testing.T) {
	src, store := tinyFixture(t)
	c, err := manifest.OpenCheckpoint(reference(t, "gptq"))
	if err != nil {
		t.Fatal(err)
	}
	sm, err := safetensors.OpenModel(src)
	if err != nil {
		t.Fatal(err)
	}
	st, err := calib.OpenStore(store)
	if err != nil {
		t.Fatal(err)
	}
	offs := st.SequenceOffsets()
	calibTokens := offs[len(offs)-2] // one held-out sequence
	const layer = 2
	name := func(p string) string {
		return fmt.Sprintf("model.language_model.layers.%d.mlp.shared_expert.%s.weight", layer, p)
	}
	read := func(from func(string) ([]float32, error), n string) []float32 {
		v, err := from(n)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		return v
	}
	source := func(n string) ([]float32, error) {
		f, _, ok := sm.Lookup(n)
		if !ok {
			return nil, fmt.Errorf("not in the source")
		}
		return f.Float32s(n)
	}
	te, err := c.TensorInfo(name("down_proj"))
	if err != nil {
		t.Fatal(err)
	}
	if te.Method != manifest.MethodGPTQ {
		t.Fatalf("%s: method %s", te.Name, te.Method)
	}
	f, ok := manifest.ParseBFP(te.Format)
	if !ok {
		t.Fatalf("%s: format %q", te.Name, te.Format)
	}
	axis := bfp.AxisInput
	if c.Manifest().Plan.Rules[te.Rule].Axis == bfp.AxisOutput {
		axis = bfp.AxisOutput
	}
	rows, cols := int(te.Shape[0]), int(te.Shape[1])
	w := read(source, te.Name)
	stored := read(c.Float32s, te.Name)
	quantize := func(g, u []float32) []float32 {
		h, err := st.SwiGLUHessian(context.Background(), layer, calib.SiteMoE, calibTokens, g, u, cols)
		if err != nil {
			t.Fatal(err)
		}
		res, err := gptq.Quantize(w, rows, cols, h.Matrix(), gptq.NewBFPGrid(f, axis), gptq.DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		return res.Q
	}
	differs := func(a, b []float32) int {
		n := 0
		for i := range a {
			if a[i] != b[i] {
				n++
			}
		}
		return n
	}
	q := quantize(read(c.Float32s, name("gate_proj")), read(c.Float32s, name("up_proj")))
	if n := differs(q, stored); n != 0 {
		t.Errorf("%d of %d stored down_proj values differ from GPTQ on the quantized gate/up's outputs", n, len(q))
	}
	qs := quantize(read(source, name("gate_proj")), read(source, name("up_proj")))
	if differs(qs, stored) == 0 {
		t.Errorf("the source gate/up's Hessian gives the same down_proj: the test cannot tell them apart")
	}
}
