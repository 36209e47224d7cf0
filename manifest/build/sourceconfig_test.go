package build

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

// TestBuildRefusesBadConfig: a missing, malformed or contradicting
// config.json stops convert (and a dry run) before anything is written.
func TestBuildRefusesBadConfig(t *testing.T) {
	src, _ := tinyFixture(t)
	good, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(p string)
		want string
	}{
		{"missing", func(p string) { os.Remove(p) }, "no such file"},
		{"malformed", func(p string) { os.WriteFile(p, good[:len(good)/2], 0o644) }, "config.json"},
		{"model_type not in the table", func(p string) { os.WriteFile(p, []byte(`{"model_type": "llama", "hidden_size": 64}`), 0o644) }, `model_type "llama" is not supported`},
		{"dense config over MoE tensors", func(p string) {
			d := strings.Replace(string(good), `"model_type": "qwen3_5_moe_text"`, `"model_type": "qwen3_5_text", "intermediate_size": 512`, 1)
			os.WriteFile(p, []byte(d), 0o644)
		}, "the checkpoint has the MoE tensor model.language_model.layers.0.mlp.gate.weight"},
		{"wrong experts", func(p string) {
			os.WriteFile(p, []byte(strings.Replace(string(good), `"num_experts": 16`, `"num_experts": 32`, 1)), 0o644)
		}, "mlp.gate.weight"},
	}
	for _, c := range cases {
		if !strings.Contains(string(good), `"num_experts": 16`) || !strings.Contains(string(good), `"model_type": "qwen3_5_moe_text"`) {
			t.Fatalf("the fixture's config.json does not say \"num_experts\": 16 and \"model_type\": \"qwen3_5_moe_text\"")
		}
		dir := filepath.Join(t.TempDir(), "model")
		copyTree(t, src, dir)
		c.edit(filepath.Join(dir, "config.json"))
		out := filepath.Join(t.TempDir(), "out")
		_, err := Convert(context.Background(), srcOpts(t, out, dir))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "config.json") {
			t.Errorf("%s: %v, want an error about config.json mentioning %q", c.name, err, c.want)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s: the refused build left %s (%v)", c.name, out, err)
		}
		o := srcOpts(t, "", dir)
		o.DryRun = true
		if _, err := Convert(context.Background(), o); err == nil {
			t.Errorf("%s: the dry run accepted it", c.name)
		}
	}
}

func srcOpts(t *testing.T, out, src string) BuildOptions {
	o := convertOpts(t, out, 1)
	o.Source = src
	return o
}

// TestBuildRefusesMoEConfigOverDenseTensors: the reverse of the dense case
// above, and a dense MLP of the wrong width, on the dense test model.
func TestBuildRefusesMoEConfigOverDenseTensors(t *testing.T) {
	src := filepath.Join(t.TempDir(), "dense")
	if err := testmodel.Write(src, testmodel.DenseTiny(), testmodel.SingleFile); err != nil {
		t.Fatal(err)
	}
	moe, err := testmodel.Tiny().ConfigJSON(false)
	if err != nil {
		t.Fatal(err)
	}
	dense, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	wide := strings.Replace(string(dense), `"intermediate_size": 512`, `"intermediate_size": 544`, 1)
	if wide == string(dense) {
		t.Fatal("the dense config.json does not say \"intermediate_size\": 512")
	}
	for _, c := range []struct {
		name, config, want string
	}{
		{"MoE config", string(moe), "the checkpoint has the dense MLP tensor model.language_model.layers.0.mlp.gate_proj.weight"},
		{"wrong width", wide, "tensor model.language_model.layers.0.mlp.gate_proj.weight has shape [512 256]; config.json (intermediate_size, hidden_size) implies [544 256]"},
	} {
		dir := filepath.Join(t.TempDir(), "model")
		copyTree(t, src, dir)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(c.config), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "out")
		o := srcOpts(t, out, dir)
		o.Plan = densePreset(t)
		if _, err := Convert(context.Background(), o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s: the refused build left %s (%v)", c.name, out, err)
		}
	}
}
