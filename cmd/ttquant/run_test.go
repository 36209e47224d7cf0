package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
	"github.com/ttquant/ttquant/safetensors"
)

// The first tokens of eval-dev record 0; the trained model continues them
// with the record's own next tokens.
const runPrompt = "283,1607,220,17,15,17,18,545"

func TestRunTrainedModel(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	dir := t.TempDir()
	lp, yp := filepath.Join(dir, "logits.safetensors"), filepath.Join(dir, "layers.safetensors")
	code, out, errs := runCLI(t, "run", "--model", model, "--tokens", runPrompt, "--generate", "4",
		"--dump-logits", lp, "--mtp", "--dump-layers", yp)
	if code != exitOK {
		t.Fatalf("status %d, stderr %s", code, errs)
	}
	for _, want := range []string{"qwen3.5-moe", "rank", "1257", "greedy continuation: 1257,1821,13,1543"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	f, err := safetensors.Open(lp)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, shape := range map[string][]int64{"logits": {8, 4096}, "mtp_logits": {7, 4096}} {
		ti, ok := f.Lookup(name)
		if !ok || ti.DType != safetensors.F32 || len(ti.Shape) != 2 || ti.Shape[0] != shape[0] || ti.Shape[1] != shape[1] {
			t.Errorf("%s: %+v, want F32 %v", name, ti, shape)
		}
	}
	lg, err := f.Float32s("logits")
	if err != nil {
		t.Fatal(err)
	}
	best := 0
	for i, v := range lg[7*4096 : 8*4096] {
		if v > lg[7*4096+best] {
			best = i
		}
	}
	if best != 1257 {
		t.Errorf("dumped logits' last-row argmax %d, the printed prediction is 1257", best)
	}
	g, err := safetensors.Open(yp)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if names := strings.Join(g.Names(), " "); names != "embed layer.0 layer.1 layer.2 layer.3" {
		t.Errorf("layer dump tensors %q", names)
	}

	code, out, errs = runCLI(t, "run", "--model", model, "--tokens", runPrompt, "--json", "--top", "2", "--generate", "1")
	if code != exitOK {
		t.Fatalf("--json: status %d, stderr %s", code, errs)
	}
	var doc runDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if doc.SchemaVersion != schemaVersion || len(doc.Top) != 2 || doc.Top[0].ID != 1257 || len(doc.Continuation) != 1 || doc.Continuation[0] != 1257 {
		t.Errorf("--json document %+v", doc)
	}
}

func TestRunUsageErrors(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tokens", "1,2"}, "--model"},
		{[]string{"--model", model}, "--tokens"},
		{[]string{"--model", model, "--text", "hello", "--tokens", "1"}, "--text"},
		{[]string{"--model", model, "--text", ""}, "--text"},
		{[]string{"--model", model, "--tokens", "1,x"}, "--tokens"},
		{[]string{"--model", model, "--tokens", "1,-3"}, "--tokens"},
		{[]string{"--model", model, "--tokens", "1,4096"}, "vocabulary"},
		{[]string{"--model", model, "--tokens", "1", "--top", "0"}, "--top"},
		{[]string{"--model", model, "--tokens", "1", "--generate", "-1"}, "--generate"},
		{[]string{"--model", model, "--tokens", "1", "--mtp"}, "--mtp"},
	} {
		code, _, errs := runCLI(t, append([]string{"run"}, c.args...)...)
		if code != exitUsage || !strings.Contains(errs, c.want) {
			t.Errorf("run %v: status %d, stderr %q; want usage error naming %s", c.args, code, errs, c.want)
		}
	}
	code, _, errs := runCLI(t, "run", "--model", t.TempDir(), "--tokens", "1")
	if code != exitError || !strings.Contains(errs, "config.json") {
		t.Errorf("missing model: status %d, stderr %q", code, errs)
	}
}

// TestRunNativeCheckpoint: --checkpoint substitutes a native checkpoint's
// decoded weights: the logits move (BFP rounding) but the prediction holds.
func TestRunNativeCheckpoint(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	dir := t.TempDir()
	native := filepath.Join(dir, "native")
	if code, _, errs := runCLI(t, "convert", "--model", model, "--out", native, "--quiet"); code != exitOK {
		t.Fatalf("convert: status %d, stderr %s", code, errs)
	}
	ref, got := filepath.Join(dir, "ref.safetensors"), filepath.Join(dir, "native.safetensors")
	for _, c := range [][]string{{"--dump-logits", ref}, {"--dump-logits", got, "--checkpoint", native}} {
		args := append([]string{"run", "--model", model, "--tokens", runPrompt, "--generate", "2"}, c...)
		code, out, errs := runCLI(t, args...)
		if code != exitOK {
			t.Fatalf("%v: status %d, stderr %s", args, code, errs)
		}
		if !strings.Contains(out, "greedy continuation: 1257,1821") {
			t.Errorf("%v: output %s", args, out)
		}
	}
	read := func(p string) []float32 {
		f, err := safetensors.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		v, err := f.Float32s("logits")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	a, b := read(ref), read(got)
	var diff float64
	for i := range a {
		diff = max(diff, math.Abs(float64(a[i]-b[i])))
	}
	// BFP4 experts and BFP8 attention on this small model move a logit by
	// about 1 at most.
	if diff == 0 || diff > 3 {
		t.Errorf("native weights moved the logits by up to %g; want a non-zero change below 3", diff)
	}
	if code, _, errs := runCLI(t, "run", "--model", model, "--tokens", "1", "--checkpoint", filepath.Join(dir, "none")); code != exitError || errs == "" {
		t.Errorf("missing native checkpoint: status %d, stderr %q", code, errs)
	}
	// A checkpoint built from another model is refused, not overlaid: here
	// the same weights with a config.json whose bytes differ.
	other := filepath.Join(dir, "other")
	if err := os.CopyFS(other, os.DirFS(model)); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(other, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "config.json"), append(cfg, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI(t, "run", "--model", other, "--tokens", "1", "--checkpoint", native); code != exitError || !strings.Contains(errs, "config.json") {
		t.Errorf("checkpoint of another model: status %d, stderr %q", code, errs)
	}
}

// TestRunText tokenizes --text with the model's own tokenizer: the prompt the
// forward pass sees is exactly the tokenizer's encoding, and the greedy
// continuation is also shown as text.
func TestRunText(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	const prompt = "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt."
	code, out, errs := runCLI(t, "run", "--model", model, "--text", prompt, "--generate", "4", "--json")
	if code != exitOK {
		t.Fatalf("status %d, stderr %s", code, errs)
	}
	var doc struct {
		Tokens       []int `json:"tokens"`
		Continuation []int `json:"continuation"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	tok, err := tokenizer.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	if want := tok.Encode(prompt); !slices.Equal(doc.Tokens, want) {
		t.Errorf("prompt ids %v, tokenizer gives %v", doc.Tokens, want)
	}
	if len(doc.Continuation) != 4 {
		t.Errorf("continuation %v, want 4 tokens", doc.Continuation)
	}
	code, out, errs = runCLI(t, "run", "--model", model, "--text", prompt, "--generate", "4")
	if code != exitOK || !strings.Contains(out, "as text: ") {
		t.Errorf("status %d, stdout %q, stderr %s", code, out, errs)
	}
}
