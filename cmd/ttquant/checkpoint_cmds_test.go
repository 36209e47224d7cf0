package main

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

// TestDemoThenVerify is the README's main job end to end: the demo builds
// a sequential GPTQ and a round-to-nearest checkpoint of the built-in
// model, verifies them and evaluates both; verify accepts the GPTQ one on
// its own, then rejects it once a byte is changed.
func TestDemoThenVerify(t *testing.T) {
	root := filepath.Join(t.TempDir(), "demo")
	// At its defaults the demo's table ranks GPTQ above RTN on mean KL
	// with error bars that do not overlap; under -short, smaller
	// calibration and evaluation sets keep the test quick.
	args := []string{"demo", "--out", root, "--json", "--quiet", "--workers", "2"}
	if testing.Short() {
		args = append(args, "--sequences", "10", "--seq-len", "128", "--held-out", "2", "--eval-sequences", "4", "--eval-seq-len", "64")
	}
	code, out, errs := runCLI(t, args...)
	if code != exitOK {
		t.Fatalf("demo: status %d\n%s\n%s", code, out, errs)
	}
	var rep struct {
		SchemaVersion int    `json:"schema_version"`
		Model         string `json:"model"`
		Checkpoints   []struct {
			Label    string `json:"label"`
			Dir      string `json:"dir"`
			Identity string `json:"identity"`
			CacheKey string `json:"cache_key"`
			Verify   struct {
				OK bool `json:"ok"`
			} `json:"verify"`
		} `json:"checkpoints"`
		Layers []struct {
			Layer        int     `json:"layer"`
			GPTQRelErr   float64 `json:"gptq_rel_mse"`
			RTNRelErr    float64 `json:"rtn_rel_mse"`
			StreamRelMSE float64 `json:"held_out_stream_rel_mse"`
		} `json:"layers"`
		Eval struct {
			Candidates []json.RawMessage `json:"candidates"`
		} `json:"eval"`
		Reading  string   `json:"reading"`
		Ranked   bool     `json:"ranked"`
		Pictures []string `json:"pictures"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("demo --json: %v\n%s", err, out)
	}
	if rep.SchemaVersion != schemaVersion || rep.Model != "tiny-qwen36-trained" || len(rep.Checkpoints) != 2 {
		t.Fatalf("demo report %+v", rep)
	}
	for _, c := range rep.Checkpoints {
		if len(c.Identity) != 64 || c.CacheKey != c.Identity[:16] || !c.Verify.OK || c.Dir == "" {
			t.Errorf("checkpoint %+v", c)
		}
	}
	// The four trunk layers and the MTP layer.
	if len(rep.Layers) != 5 {
		t.Fatalf("%d layers in the table, want 5", len(rep.Layers))
	}
	for _, l := range rep.Layers {
		if l.GPTQRelErr <= 0 || l.RTNRelErr <= 0 || l.StreamRelMSE <= 0 {
			t.Errorf("layer %d: errors %g / %g, drift %g", l.Layer, l.GPTQRelErr, l.RTNRelErr, l.StreamRelMSE)
		}
		if l.GPTQRelErr >= l.RTNRelErr {
			t.Errorf("layer %d: GPTQ's held-out error %g is not below RTN's %g on the trained model", l.Layer, l.GPTQRelErr, l.RTNRelErr)
		}
	}
	if len(rep.Pictures) != 2 {
		t.Errorf("pictures %q, want layers.svg and eval.svg", rep.Pictures)
	}
	for _, p := range rep.Pictures {
		checkSVG(t, p, "polyline")
	}
	if !strings.Contains(rep.Reading, "Read mean KL") {
		t.Errorf("the demo does not say which metric it reads: %q", rep.Reading)
	}
	if !testing.Short() && !rep.Ranked {
		t.Errorf("at its defaults the demo does not rank GPTQ above RTN outside the error bars: %s", rep.Reading)
	}
	if !strings.Contains(out, `"label":"RTN"`) && !strings.Contains(out, `"label": "RTN"`) {
		t.Errorf("the evaluation does not list the RTN candidate:\n%.2000s", out)
	}
	dir := filepath.Join(root, "gptq")
	id := rep.Checkpoints[1].Identity

	code, out, _ = runCLI(t, "verify", dir)
	if code != exitOK || !strings.Contains(out, id) {
		t.Fatalf("verify: status %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "verify", dir, "--json")
	var vr struct {
		SchemaVersion int  `json:"schema_version"`
		OK            bool `json:"ok"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &vr) != nil || !vr.OK || vr.SchemaVersion != schemaVersion {
		t.Fatalf("verify --json: status %d\n%s", code, out)
	}

	p := filepath.Join(dir, "experts-l002-down-g000.safetensors")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	os.WriteFile(p, b, 0o644)
	code, out, _ = runCLI(t, "verify", dir)
	if code != exitVerifyKO || !strings.Contains(out, "experts-l002-down-g000.safetensors") {
		t.Fatalf("verify of a damaged checkpoint: status %d\n%s", code, out)
	}

	os.Remove(filepath.Join(dir, "native_manifest.json"))
	code, out, _ = runCLI(t, "verify", dir)
	if code != exitVerifyKO || !strings.Contains(out, "INCOMPLETE") {
		t.Fatalf("verify without a manifest: status %d\n%s", code, out)
	}
	if code, _, errs := runCLI(t, "verify", filepath.Join(dir, "nope")); code != exitError || errs == "" {
		t.Errorf("verify of a missing directory: status %d", code)
	}
}

func TestConvertCommand(t *testing.T) {
	src := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Write(src, testmodel.Tiny(), testmodel.SingleFile); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "native")
	code, stdout, errs := runCLI(t, "convert", "--model", src, "--out", out, "--workers", "2")
	if code != exitOK || !strings.Contains(stdout, "identity") {
		t.Fatalf("convert: status %d\n%s\n%s", code, stdout, errs)
	}
	// Not a terminal: one progress line per layer, then a summary.
	if !strings.Contains(errs, "layer 0 done") || !strings.Contains(errs, "done ") {
		t.Errorf("progress on stderr:\n%s", errs)
	}
	code, stdout, errs = runCLI(t, "convert", "--model", src, "--out", out, "--json", "--quiet")
	var r struct {
		AlreadyComplete bool   `json:"already_complete"`
		Identity        string `json:"identity"`
	}
	if code != exitOK || json.Unmarshal([]byte(stdout), &r) != nil || !r.AlreadyComplete || errs != "" {
		t.Fatalf("second convert: status %d\n%s\n%s", code, stdout, errs)
	}
	if code, stdout, _ := runCLI(t, "verify", out, "--source", src); code != exitOK || !strings.Contains(stdout, "against the source") {
		t.Errorf("verify --source: status %d\n%s", code, stdout)
	}
	// A different plan on the same directory is refused with the reason.
	code, _, errs = runCLI(t, "convert", "--model", src, "--out", out, "--preset", "qwen3-9b-dense", "--quiet")
	if code != exitError || !strings.Contains(errs, "plan") {
		t.Errorf("convert with another plan: status %d\n%s", code, errs)
	}
	for _, args := range [][]string{
		{"convert", "--out", out},
		{"convert", "--model", src},
		{"convert", "--model", src, "--out", out, "--preset", "x", "--plan", "y"},
		{"gptq", "--model", src, "--out", out},
		{"verify"},
		{"verify", "a", "b"},
	} {
		if code, _, _ := runCLI(t, args...); code != exitUsage {
			t.Errorf("%v: status %d, want %d", args, code, exitUsage)
		}
	}
}

func TestGPTQDryRunOnReplica(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "replica")
	if err := testmodel.WriteReplica35B(dir); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "gptq", "--model", dir, "--layers", "experts", "--dry-run", "--estimate", "0")
	if code != exitOK {
		t.Fatalf("status %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{"plan qwen36-35b-a3b", "*.mlp.experts.*", "1312 expert groups", "GPTQ matrices    21115", "dry run"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runCLI(t, "gptq", "--model", dir, "--dry-run", "--json", "--estimate", "0")
	var r struct {
		DryRun bool `json:"dry_run"`
		Work   struct {
			ExpertFiles int `json:"expert_files"`
		} `json:"work"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &r) != nil || !r.DryRun || r.Work.ExpertFiles != 1312 {
		t.Errorf("dry run --json: status %d\n%s", code, out)
	}
}

// checkSVG parses an SVG file as XML and wants an svg root holding the
// element named.
func checkSVG(t *testing.T, path, want string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := xml.NewDecoder(f)
	root, found := "", false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: not XML: %v", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			found = found || se.Name.Local == want
		}
	}
	if root != "svg" || !found {
		t.Errorf("%s: root %q, %s found: %v", path, root, want, found)
	}
}
