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
