package build

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		{"not MoE", func(p string) { os.WriteFile(p, []byte(`{"model_type": "llama", "hidden_size": 64}`), 0o644) }, "num_hidden_layers"},
		{"wrong experts", func(p string) {
			os.WriteFile(p, []byte(strings.Replace(string(good), `"num_experts": 16`, `"num_experts": 32`, 1)), 0o644)
		}, "mlp.gate.weight"},
	}
	for _, c := range cases {
		if c.name == "wrong experts" && !strings.Contains(string(good), `"num_experts": 16`) {
			t.Fatalf("the fixture's config.json does not say \"num_experts\": 16")
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
