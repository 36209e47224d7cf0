package forward

import (
	"encoding/json"
	"github.com/ttquant/ttquant/internal/model"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

// randMatrix returns rows×cols values of scale about 1/sqrt(cols).
func randMatrix(seed uint64, rows, cols int) []float32 {
	r := rand.New(rand.NewPCG(seed, 11))
	v := make([]float32, rows*cols)
	s := 1 / float32(cols)
	for i := range v {
		v[i] = float32(r.NormFloat64()) * s * 8
	}
	return v
}

// denseLayer replaces layer prefix p's MoE tensors in src by a dense
// SwiGLU MLP of width inter.
func denseLayer(src Map, p string, h, inter int, seed uint64) {
	for k := range src {
		if strings.HasPrefix(k, p+"mlp.") {
			delete(src, k)
		}
	}
	I, H := int64(inter), int64(h)
	src[p+"mlp.gate_proj.weight"] = Tensor{Shape: []int64{I, H}, Values: randMatrix(seed, inter, h)}
	src[p+"mlp.up_proj.weight"] = Tensor{Shape: []int64{I, H}, Values: randMatrix(seed+1, inter, h)}
	src[p+"mlp.down_proj.weight"] = Tensor{Shape: []int64{H, I}, Values: randMatrix(seed+2, h, inter)}
}

// checkConsistent runs prefix and cached-decoding checks on a model.
func checkConsistent(t *testing.T, m *Model, what string) {
	t.Helper()
	V := m.Config.Vocab
	ids := testIDs(80, V, 21)
	full := logitsOf(t, m, ids)[0]
	for _, v := range full {
		if v != v {
			t.Fatalf("%s: NaN logit", what)
		}
	}
	if i, ok := bitsEqual(logitsOf(t, m, ids[:50])[0], full[:50*V]); !ok {
		t.Errorf("%s: prefix logit %d differs", what, i)
	}
	d := m.NewDecoder()
	var got []float32
	for _, n := range []int{60, 1, 1, 18} {
		pos := d.Pos()
		if err := d.Feed(ids[pos:pos+n], func(_, _ int, lg []float32) error { got = append(got, lg...); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if diff := maxAbsDiff(got, full); diff > 1e-4 {
		t.Errorf("%s: decoding differs from the full forward by %g", what, diff)
	}
}

func editConfig(tb testing.TB, dir string, edit func(tc map[string]any)) *model.Config {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(raw, &top); err != nil {
		tb.Fatal(err)
	}
	tc := top
	if t, ok := top["text_config"].(map[string]any); ok {
		tc = t
	}
	edit(tc)
	b, _ := json.Marshal(top)
	cfg, err := model.ParseConfig(b, "edited config.json")
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// TestDenseQwen35: every layer (and the MTP layer) with a dense SwiGLU MLP.
func TestDenseQwen35(t *testing.T) {
	mc := testmodel.Micro()
	dir := writeModel(t, mc, testmodel.SingleFile)
	cfg := editConfig(t, dir, func(tc map[string]any) {
		tc["model_type"] = "qwen3_5_text"
		tc["intermediate_size"] = 96
		for _, k := range []string{"num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"} {
			delete(tc, k)
		}
	})
	if cfg.Arch != model.ArchQwen35Dense || cfg.IsMoE(0) || cfg.IsMoE(cfg.Layers) {
		t.Fatalf("config %+v", cfg)
	}
	src := loadMap(t, dir)
	for i := 0; i < cfg.NumLayers(); i++ {
		denseLayer(src, cfg.LayerPrefix(i), mc.Hidden, 96, uint64(10*i))
	}
	m, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, m, "dense")
	// The dense MLP's sites reach the hook.
	seen := map[Site]int{}
	x, _ := m.Embed(testIDs(10, cfg.Vocab, 1))
	l, _ := m.Layer(0)
	if err := l.Forward(&Batch{Lens: []int{10}, X: x}, func(a *Activations) error { seen[a.Site] = a.Cols; return nil }); err != nil {
		t.Fatal(err)
	}
	if seen[SiteMLPDownIn] != 96 || seen[SiteMLPIn] != mc.Hidden {
		t.Errorf("sites seen %v", seen)
	}
	// A missing dense tensor is named.
	delete(src, cfg.LayerPrefix(2)+"mlp.up_proj.weight")
	if _, err := New(cfg, src); err == nil || !strings.Contains(err.Error(), "layers.2.mlp.up_proj.weight") {
		t.Errorf("missing dense tensor: %v", err)
	}
}

// TestQwen3NextSparseStep: decoder_sparse_step and mlp_only_layers decide
// which Qwen3-Next layers are MoE.
func TestQwen3NextSparseStep(t *testing.T) {
	mc := testmodel.Micro()
	dir := toQwen3Next(t, writeModel(t, mc, testmodel.PerExpert), mc)
	cfg := editConfig(t, dir, func(tc map[string]any) {
		tc["decoder_sparse_step"] = 2
		tc["mlp_only_layers"] = []int{3}
		tc["intermediate_size"] = 80
	})
	want := []bool{false, true, false, false, true} // layers 0..3, then MTP
	for i, w := range want {
		if cfg.IsMoE(i) != w {
			t.Errorf("layer %d: MoE %v, want %v", i, cfg.IsMoE(i), w)
		}
	}
	src := loadMap(t, dir)
	for i := 0; i < cfg.Layers; i++ {
		if !want[i] {
			denseLayer(src, cfg.LayerPrefix(i), mc.Hidden, 80, uint64(i))
		}
	}
	m, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, m, "qwen3-next sparse step")
}

// TestTiedEmbeddings: with tie_word_embeddings and no lm_head.weight the
// LM head is embed_tokens, bit for bit.
func TestTiedEmbeddings(t *testing.T) {
	mc := testmodel.Micro()
	dir := writeModel(t, mc, testmodel.SingleFile)
	src := loadMap(t, dir)
	emb := src["model.language_model.embed_tokens.weight"]
	untied, err := New(editConfig(t, dir, func(map[string]any) {}), Overlay{Map{"lm_head.weight": emb}, src})
	if err != nil {
		t.Fatal(err)
	}
	delete(src, "lm_head.weight")
	cfg := editConfig(t, dir, func(tc map[string]any) { tc["tie_word_embeddings"] = true })
	tied, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	ids := testIDs(30, mc.Vocab, 2)
	if i, ok := bitsEqual(logitsOf(t, tied, ids)[0], logitsOf(t, untied, ids)[0]); !ok {
		t.Errorf("tied head: logit %d differs", i)
	}
}

// TestHookSites: a layer shows every calibration site with the right
// shapes; the expert rows are the routed (token, expert) pairs.
func TestHookSites(t *testing.T) {
	mc := testmodel.Micro()
	m := openModel(t, writeModel(t, mc, testmodel.SingleFile))
	lens := []int{7, 12}
	x, err := m.Embed(testIDs(19, mc.Vocab, 3))
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 3} {
		l, err := m.Layer(i)
		if err != nil {
			t.Fatal(err)
		}
		sites := map[string]int{}
		expertRows := 0
		var attnOut []float32
		err = l.Forward(&Batch{Lens: lens, X: append([]float32(nil), x...)}, func(a *Activations) error {
			if a.Layer != i || len(a.X) != a.Rows*a.Cols {
				t.Errorf("layer %d site %v: layer %d, %d values for %d×%d", i, a.Site, a.Layer, len(a.X), a.Rows, a.Cols)
			}
			if a.Site == SiteExpertIn {
				expertRows += a.Rows
				if len(a.Tokens) != a.Rows || len(a.Weights) != a.Rows {
					t.Errorf("expert %d: %d tokens, %d weights for %d rows", a.Expert, len(a.Tokens), len(a.Weights), a.Rows)
				}
				return nil
			}
			if a.Rows != 19 {
				t.Errorf("site %v: %d rows", a.Site, a.Rows)
			}
			if a.Site == SiteAttnOut {
				attnOut = append([]float32(nil), a.X...)
			}
			sites[a.Site.String()+":"+strconv.Itoa(a.Cols)]++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		inner := mc.LinearValueHeads * mc.LinearValueHeadDim
		if l.Kind == model.FullAttention {
			inner = mc.Heads * mc.HeadDim
		}
		for _, want := range []string{"attn_in:64", "attn_out:" + strconv.Itoa(inner), "mlp_in:64"} {
			if sites[want] != 1 {
				t.Errorf("layer %d: site %s seen %d times (%v)", i, want, sites[want], sites)
			}
		}
		if expertRows != 19*mc.TopK {
			t.Errorf("layer %d: %d expert rows, want %d", i, expertRows, 19*mc.TopK)
		}
		if len(attnOut) == 0 {
			t.Errorf("layer %d: no attention output", i)
		}
	}
}
