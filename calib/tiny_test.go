package calib

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/safetensors"
)

// tinyFixture is the built-in tiny model and its synthetic calibration
// store, generated once per test binary into a temporary directory.
type tinyFixture struct {
	once  sync.Once
	dir   string
	cfg   *model.Config
	model *safetensors.Model
	store *Store
	err   error
}

var tinyFixtures [4]tinyFixture

func TestMain(m *testing.M) {
	code := m.Run()
	for i := range tinyFixtures {
		if f := &tinyFixtures[i]; f.dir != "" {
			if f.model != nil {
				f.model.Close()
			}
			os.RemoveAll(f.dir)
		}
	}
	os.Exit(code)
}

// tinyModel returns the tiny model in variant v and its synthetic store
// (shared by all tests: do not modify).
func tinyModel(t testing.TB, v testmodel.Variant) (*safetensors.Model, *model.Config, *Store) {
	t.Helper()
	f := &tinyFixtures[v]
	f.once.Do(func() {
		if f.dir, f.err = os.MkdirTemp("", "calib-tiny-"); f.err != nil {
			return
		}
		mdir := filepath.Join(f.dir, "model")
		if f.err = testmodel.Write(mdir, testmodel.Tiny(), v); f.err != nil {
			return
		}
		if f.cfg, f.err = model.ReadConfig(mdir); f.err != nil {
			return
		}
		if f.model, f.err = safetensors.OpenModel(mdir); f.err != nil {
			return
		}
		f.store, f.err = SynthesizeStore(filepath.Join(f.dir, "store"), f.cfg, SynthStoreOptions{Model: "tiny"})
	})
	if f.err != nil {
		t.Fatal(f.err)
	}
	return f.model, f.cfg, f.store
}

// TestSynthStoreIsMarked: a store of synthetic activations says so in its
// index, and the mark survives reopening.
func TestSynthStoreIsMarked(t *testing.T) {
	_, cfg, _ := tinyModel(t, testmodel.Default)
	dir := filepath.Join(t.TempDir(), "store")
	st, err := SynthesizeStore(dir, cfg, SynthStoreOptions{Sequences: 2, SeqLen: 8})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Provenance().Synthetic {
		t.Fatal("SynthesizeStore's provenance is not marked synthetic")
	}
	raw, err := os.ReadFile(filepath.Join(dir, StoreIndexName))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"synthetic": true`) {
		t.Errorf("the store index does not record synthetic: %s", raw[:min(len(raw), 400)])
	}
}

func TestTinyConfig(t *testing.T) {
	_, cfg, st := tinyModel(t, testmodel.Default)
	tc := testmodel.Tiny()
	want := model.MoEConfig{Hidden: tc.Hidden, Experts: tc.Experts, TopK: tc.TopK, ExpertInter: tc.MoEIntermediate,
		SharedInter: tc.SharedIntermediate, NormTopK: true}
	if cfg.MoE() != want || cfg.Layers != tc.Layers || cfg.MTPLayers != 1 || cfg.Prefix != "model.language_model." {
		t.Errorf("config %+v, want MoE %+v", cfg, want)
	}
	if p := cfg.LayerPrefix(tc.Layers); p != "mtp.layers.0." {
		t.Errorf("prefix of layer %d (MTP): %q", tc.Layers, p)
	}
	if p := cfg.LayerPrefix(1); p != "model.language_model.layers.1." {
		t.Errorf("prefix of layer 1: %q", p)
	}
	if p := st.Provenance(); p.Tokens != 16*256 || p.Sequences != 16 {
		t.Errorf("synthetic store provenance %+v", p)
	}
	// Layer 3 is full attention, the others linear attention.
	if _, ok := st.Site(3, SiteOProj); !ok {
		t.Error("no o_proj site for the full-attention layer")
	}
	if _, ok := st.Site(0, SiteOutProj); !ok {
		t.Error("no out_proj site for a linear-attention layer")
	}
	// The MTP layer follows the trunk layers and has full attention.
	if _, ok := st.Site(tc.Layers, SiteMoE); !ok {
		t.Error("no MoE site for the MTP layer")
	}
	if _, ok := st.Site(tc.Layers, SiteOProj); !ok {
		t.Error("no o_proj site for the MTP layer")
	}
	if _, ok := st.Site(tc.Layers+1, SiteMoE); ok {
		t.Error("a MoE site beyond the MTP layer")
	}
	if _, err := st.TokenIDs(); err != nil {
		t.Error(err)
	}
}

// TestTinyFusedAndPerExpert checks that both expert layouts load the same
// experts.
func TestTinyFusedAndPerExpert(t *testing.T) {
	mf, cfg, _ := tinyModel(t, testmodel.Default)
	mp, _, _ := tinyModel(t, testmodel.PerExpert)
	lf, err := LoadMoELayer(mf, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	lp, err := LoadMoELayer(mp, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []int{0, 5, 15} {
		a, err := lf.Experts.Expert(e)
		if err != nil {
			t.Fatal(err)
		}
		b, err := lp.Experts.Expert(e)
		if err != nil {
			t.Fatal(err)
		}
		for i, pair := range [][2][]float32{{a.Gate, b.Gate}, {a.Up, b.Up}, {a.Down, b.Down}} {
			for j := range pair[0] {
				if pair[0][j] != pair[1][j] {
					t.Fatalf("expert %d matrix %d value %d: fused %g, per-expert %g", e, i, j, pair[0][j], pair[1][j])
				}
			}
		}
	}
	if _, err := lf.Experts.Expert(16); err == nil {
		t.Error("expert 16 of 16 read")
	}
}

// TestTinyGPTQBeatsRTN is the acceptance check: per-expert GPTQ (BFP4) on
// the tiny model with its synthetic calibration gives at most 0.8× the
// held-out MoE-block output MSE of RTN.
func TestTinyGPTQBeatsRTN(t *testing.T) {
	m, cfg, st := tinyModel(t, testmodel.Default)
	// Layer 0 (a trunk layer) and layer 4 (the MTP layer, read from
	// "mtp.layers.0."): the MoE blocks of all layers have the same
	// structure, whatever their attention kind; `ttquant calib quantize`
	// and the demo report every layer. Each layer costs about 25 s in a
	// -tags purego build, so the test keeps to two.
	for _, layer := range []int{0, 4} {
		l, err := LoadMoELayer(m, cfg, layer)
		if err != nil {
			t.Fatal(err)
		}
		cal, held, err := st.LoadActivations(layer, SiteMoE, 2)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := QuantizeMoELayer(context.Background(), l, cal, held, LayerOptions{Workers: 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		h := rep.HeldOut
		t.Logf("layer %d: %d calibration / %d held-out tokens, starved %v: held-out MSE GPTQ %.4g, RTN %.4g, ratio %.3f",
			layer, rep.Tokens, h.Tokens, rep.Starved, h.MSE, h.RTNMSE, h.Ratio)
		if h.Ratio > 0.8 || h.MSE <= 0 {
			t.Errorf("layer %d: GPTQ/RTN held-out MSE ratio %.3f, want <= 0.8", layer, h.Ratio)
		}
	}
}

func TestTinyStoreStats(t *testing.T) {
	m, cfg, st := tinyModel(t, testmodel.Default)
	plain, err := ComputeStoreStats(st, nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Four trunk layers and the MTP layer (index 4, full attention), each
	// with the MoE input, the attention input and the o_proj/out_proj input.
	if len(plain.Sites) != 15 || plain.Routing != nil || plain.Sites[0].Bytes <= 4096*256*2 {
		t.Fatalf("stats without model: %+v", plain)
	}
	if si := plain.Sites[13]; si.Layer != 4 || si.Site != SiteMoE || si.Cols != 256 {
		t.Errorf("MTP layer MoE site: %+v", si)
	}
	full, err := ComputeStoreStats(st, m, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(full.Routing) != 5 {
		t.Fatalf("%d routed layers", len(full.Routing))
	}
	for _, rs := range full.Routing {
		// Cross-check with routing all tokens at once.
		l, _ := LoadMoELayer(m, cfg, rs.Layer)
		x, _ := st.ReadRows(rs.Layer, SiteMoE, 0, 4096)
		r, _ := ffn.Route(x, 4096, l.Router, cfg.MoE())
		var sum int64
		for e, c := range r.Counts() {
			if rs.Counts[e] != int64(c) {
				t.Fatalf("layer %d expert %d: chunked count %d, whole %d", rs.Layer, e, rs.Counts[e], c)
			}
			sum += int64(c)
		}
		if sum != 4096*4 || rs.MinTokens != 21 {
			t.Errorf("layer %d: %d routed tokens, min %d", rs.Layer, sum, rs.MinTokens)
		}
	}
}
