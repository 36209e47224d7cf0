package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/safetensors"
)

// TestConfigMatchesGeneratedModels: the config.json of every generated
// model agrees with its tensors, in every layout.
func TestConfigMatchesGeneratedModels(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  testmodel.Config
		v    testmodel.Variant
	}{
		{"tiny", testmodel.Tiny(), testmodel.Default},
		{"tiny per expert", testmodel.Tiny(), testmodel.PerExpert},
		{"tiny single file", testmodel.Tiny(), testmodel.SingleFile},
		{"micro", testmodel.Micro(), testmodel.Default},
		{"qwen3-next tiny", testmodel.Qwen3NextTiny(), testmodel.Default},
		{"dense tiny", testmodel.DenseTiny(), testmodel.Default},
	} {
		dir := filepath.Join(t.TempDir(), "m")
		if err := testmodel.Write(dir, c.cfg, c.v); err != nil {
			t.Fatal(err)
		}
		cfg, err := ReadConfig(dir)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		m, err := safetensors.OpenModel(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.CheckTensors(m); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		m.Close()
	}
}

// TestConfigDisagreeingWithTensors: each field that shapes the tensors,
// changed in config.json, is caught with the tensor that disagrees.
func TestConfigDisagreeingWithTensors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := testmodel.Write(dir, testmodel.Tiny(), testmodel.Default); err != nil {
		t.Fatal(err)
	}
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		field string
		delta int
		want  string
	}{
		{"hidden_size", 64, "embed_tokens.weight"},
		{"num_hidden_layers", 1, "num_hidden_layers"},
		{"num_experts", -8, "mlp.gate.weight"},
		{"moe_intermediate_size", 16, "experts.gate_up_proj"},
		{"shared_expert_intermediate_size", 16, "shared_expert.gate_proj"},
		{"mtp_num_hidden_layers", 1, "mtp_num_hidden_layers"},
		{"vocab_size", 1, "vocab_size"},
	} {
		var doc map[string]any
		json.Unmarshal(raw, &doc)
		tc := doc["text_config"].(map[string]any)
		v, ok := tc[c.field].(float64)
		if !ok {
			t.Fatalf("config.json has no text_config.%s", c.field)
		}
		tc[c.field] = v + float64(c.delta)
		if c.field == "num_hidden_layers" {
			lt := tc["layer_types"].([]any)
			tc["layer_types"] = append(lt, lt[len(lt)-1])
		}
		b, _ := json.Marshal(doc)
		p := filepath.Join(t.TempDir(), "config.json")
		os.WriteFile(p, b, 0o644)
		cfg, err := ReadConfig(p)
		if err != nil {
			t.Fatalf("%s: %v", c.field, err)
		}
		if err := cfg.CheckTensors(m); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %+d: %v, want an error naming %s", c.field, c.delta, err, c.want)
		}
	}
}

// withConfig writes body as the config.json of a fresh directory and reads
// it.
func withConfig(t *testing.T, body string) *Config {
	t.Helper()
	cfg, err := ReadConfig(writeConfig(t, body))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestDenseConfigAgainstTensors: a dense config over an MoE checkpoint,
// an MoE config over a dense one, a dense MLP tensor of the wrong shape
// and a missing one are each one error naming the tensor.
func TestDenseConfigAgainstTensors(t *testing.T) {
	open := func(dir string) *safetensors.Model {
		m, err := safetensors.OpenModel(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	moeDir, denseDir := filepath.Join(t.TempDir(), "moe"), filepath.Join(t.TempDir(), "dense")
	if err := testmodel.Write(moeDir, testmodel.Tiny(), testmodel.SingleFile); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.Write(denseDir, testmodel.DenseTiny(), testmodel.SingleFile); err != nil {
		t.Fatal(err)
	}
	moeM, denseM := open(moeDir), open(denseDir)
	denseCfg := withConfig(t, configJSON(t, testmodel.DenseTiny(), nil))
	moeCfg := withConfig(t, configJSON(t, testmodel.Tiny(), nil))
	wide := withConfig(t, configJSON(t, testmodel.DenseTiny(), func(tc map[string]any) { tc["intermediate_size"] = 544 }))

	// A copy of the dense checkpoint without one MLP tensor.
	victim := "model.language_model.layers.2.mlp.down_proj.weight"
	holeDir := filepath.Join(t.TempDir(), "hole")
	if err := os.MkdirAll(holeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := safetensors.Create(filepath.Join(holeDir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range denseM.Names() {
		f, ti, _ := denseM.Lookup(n)
		if n == victim {
			continue
		}
		data := make([]byte, ti.Size())
		if err := f.ReadTensorAt(n, data, 0); err != nil {
			t.Fatal(err)
		}
		if err := w.Add(n, ti.DType, ti.Shape, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	holeM := open(holeDir)

	for _, c := range []struct {
		name string
		cfg  *Config
		m    *safetensors.Model
		want []string
	}{
		{"dense config, MoE tensors", denseCfg, moeM, []string{"layers.0.mlp.gate.weight", "MoE tensor", "dense MLP"}},
		{"MoE config, dense tensors", moeCfg, denseM, []string{"layers.0.mlp.gate_proj.weight", "dense MLP tensor", "MoE block"}},
		{"wrong intermediate_size", wide, denseM, []string{"layers.0.mlp.gate_proj.weight", "[512 256]", "intermediate_size", "[544 256]"}},
		{"missing dense tensor", denseCfg, holeM, []string{victim, "no tensor", "intermediate_size"}},
	} {
		err := c.cfg.CheckTensors(c.m)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", c.name, err, w)
			}
		}
	}
}
