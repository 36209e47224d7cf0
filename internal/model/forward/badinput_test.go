package forward

import (
	"errors"
	"github.com/ttquant/ttquant/internal/model"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/safetensors"
)

// loadMap reads every tensor of the checkpoint in dir into a Map.
func loadMap(tb testing.TB, dir string) Map {
	tb.Helper()
	sm, err := safetensors.OpenModel(dir)
	if err != nil {
		tb.Fatal(err)
	}
	defer sm.Close()
	m := Map{}
	for _, n := range sm.Names() {
		v, err := sm.Float32s(n)
		if err != nil {
			tb.Fatal(err)
		}
		_, ti, _ := sm.Lookup(n)
		m[n] = Tensor{Shape: ti.Shape, Values: v}
	}
	return m
}

func TestConfigErrors(t *testing.T) {
	dir := writeModel(t, testmodel.Micro(), testmodel.SingleFile)
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	good := string(raw)
	if _, err := model.ParseConfig(raw, "config.json"); err != nil {
		t.Fatalf("the fixture's config is refused: %v", err)
	}
	for _, c := range []struct {
		name, from, to, want string
	}{
		{"model_type", `"model_type": "qwen3_5_moe_text"`, `"model_type": "llama"`, "model_type"},
		{"layer_types", `"full_attention"`, `"sliding_attention"`, "layer_types"},
		{"rope type", `"rope_type": "default"`, `"rope_type": "yarn"`, "yarn"},
		{"hidden", `"hidden_size": 64`, `"hidden_size": -4`, "hidden_size"},
		{"top-k", `"num_experts_per_tok": 2`, `"num_experts_per_tok": 99`, "num_experts_per_tok"},
	} {
		bad := strings.Replace(good, c.from, c.to, 1)
		if bad == good {
			t.Fatalf("%s: %q not found in the fixture config", c.name, c.from)
		}
		_, err := model.ParseConfig([]byte(bad), "config.json")
		var ce *model.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want a ConfigError naming %q", c.name, err, c.want)
		}
	}
	// Top-level model_type without text_config, unknown.
	if _, err := model.ParseConfig([]byte(`{"model_type":"mamba"}`), "x"); err == nil || !strings.Contains(err.Error(), "mamba") {
		t.Errorf("unknown flat model_type: %v", err)
	}
	// rope_scaling with YaRN (older configs).
	yarn := strings.Replace(good, `"rope_parameters"`, `"rope_scaling": {"type": "yarn", "factor": 4}, "rope_parameters_x"`, 1)
	if _, err := model.ParseConfig([]byte(yarn), "c"); err == nil || !strings.Contains(err.Error(), "yarn") {
		t.Errorf("rope_scaling yarn: %v", err)
	}
}

func TestWeightErrorsNameTheTensor(t *testing.T) {
	dir := writeModel(t, testmodel.Micro(), testmodel.SingleFile)
	cfg, err := model.ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	base := loadMap(t, dir)
	victim := "model.language_model.layers.2.linear_attn.in_proj_z.weight"
	expert := "model.language_model.layers.1.mlp.experts.gate_up_proj"

	missing := Map{}
	for k, v := range base {
		if k != victim {
			missing[k] = v
		}
	}
	if _, err := New(cfg, missing); err == nil || !strings.Contains(err.Error(), victim) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing tensor: %v", err)
	}

	wrong := Map{victim: Tensor{Shape: []int64{3, 64}, Values: make([]float32, 192)}}
	if _, err := New(cfg, Overlay{wrong, base}); err == nil || !strings.Contains(err.Error(), victim) || !strings.Contains(err.Error(), "shape") {
		t.Errorf("wrong shape: %v", err)
	}

	for _, name := range []string{victim, expert, "lm_head.weight"} {
		v := append([]float32(nil), base[name].Values...)
		v[len(v)/2] = float32(math.NaN())
		m, err := New(cfg, Overlay{Map{name: Tensor{Shape: base[name].Shape, Values: v}}, base})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.CheckFinite(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("NaN in %s: CheckFinite says %v", name, err)
		}
		// The forward itself refuses it too, naming the tensor.
		ids := testIDs(80, cfg.Vocab, 1)
		x, _ := m.Embed(ids)
		b := &Batch{Lens: []int{len(ids)}, X: x}
		err = m.Trunk(b, nil, nil)
		if err == nil {
			var hf []float32
			if hf, err = m.FinalNorm(b.X); err == nil {
				err = m.Logits(hf, func(int, int, []float32) error { return nil })
			}
		}
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("NaN in %s: forward says %v", name, err)
		}
	}

	if _, err := (&Model{Config: cfg, Src: base, layers: map[int]*Layer{}}).Embed([]int32{int32(cfg.Vocab)}); err == nil {
		t.Error("a token id outside the vocabulary was accepted")
	}
}

// TestOverlaySubstitutesWeights: substituting a layer's tensors through an
// Overlay changes the result, and substituting identical values does not.
func TestOverlaySubstitutesWeights(t *testing.T) {
	dir := writeModel(t, testmodel.Micro(), testmodel.SingleFile)
	m := openModel(t, dir)
	ids := testIDs(40, m.Config.Vocab, 3)
	ref := logitsOf(t, m, ids)[0]
	base := loadMap(t, dir)
	name := "model.language_model.layers.3.self_attn.o_proj.weight"
	same, err := New(m.Config, Overlay{Map{name: base[name]}, m.Src})
	if err != nil {
		t.Fatal(err)
	}
	if i, ok := bitsEqual(logitsOf(t, same, ids)[0], ref); !ok {
		t.Errorf("identical substitute changed logit %d", i)
	}
	v := append([]float32(nil), base[name].Values...)
	for i := range v {
		v[i] *= 0.5
	}
	// A single per-expert substitute over the fused tensors.
	e := "model.language_model.layers.0.mlp.experts.2."
	I, H := int64(m.Config.ExpertInter), int64(m.Config.Hidden)
	sub := Map{name: {Shape: base[name].Shape, Values: v},
		e + "gate_proj.weight": {Shape: []int64{I, H}, Values: make([]float32, I*H)},
		e + "up_proj.weight":   {Shape: []int64{I, H}, Values: make([]float32, I*H)},
		e + "down_proj.weight": {Shape: []int64{H, I}, Values: make([]float32, I*H)}}
	diff, err := New(m.Config, Overlay{sub, m.Src})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := bitsEqual(logitsOf(t, diff, ids)[0], ref); ok {
		t.Error("substituted weights left every logit unchanged")
	}
}
