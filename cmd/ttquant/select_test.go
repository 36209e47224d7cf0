package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/manifest"
)

// selectStore builds a small calibration store of the trained MoE model.
func selectStore(t *testing.T, model string, sequences string) string {
	t.Helper()
	store := filepath.Join(t.TempDir(), "store")
	if code, _, errs := runCLI(t, "calib", "build", "--model", model, "--data", filepath.Join(model, "calib.jsonl"),
		"--out", store, "--sequences", sequences, "--seq-len", "32", "--quiet"); code != exitOK {
		t.Fatalf("calib build: status %d\n%s", code, errs)
	}
	return store
}

func emptyDir(t *testing.T, dir string) {
	t.Helper()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("a refused run wrote %v", names)
	}
}

// TestSelect: refusals before any work with nothing written; a selection
// that fits its budget, builds with gptq --layers plan and verifies; the
// same inputs give the same bytes for any worker count; a re-run reads
// the sensitivity file instead of measuring; a file from other data is
// refused.
func TestSelect(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	store := selectStore(t, model, "3")
	dir := t.TempDir()
	out := filepath.Join(dir, "p.json")
	base := []string{"select", "--model", model, "--calib", store, "--out", out, "--quiet"}
	split := filepath.Join(t.TempDir(), "split.json")
	os.WriteFile(split, []byte(`{"name":"split","rules":[{"pattern":"*.layers.0.mlp.experts.3.gate_up_proj","format":"BFP8_b"}]}`), 0o644)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--budget", "1MB"}, exitError, "below the smallest achievable"},
		{[]string{"--budget", "100MB"}, exitError, "above the largest achievable"},
		{[]string{"--bpw", "3"}, exitError, "below the smallest achievable"},
		{[]string{"--budget", "5MB", "--candidates", "BFP3_b:gptq"}, exitUsage, "BFP3_b"},
		{[]string{"--budget", "5MB", "--candidates", "BFP8_b"}, exitUsage, "needs a method"},
		{[]string{}, exitUsage, "exactly one of"},
		{[]string{"--budget", "5MB", "--bpw", "6"}, exitUsage, "exactly one of"},
		{[]string{"--budget", "5MB", "--override", split}, exitError, "must share one format"},
	} {
		code, _, errs := runCLI(t, append(append([]string(nil), base...), c.args...)...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("%v: status %d, stderr %q; want %d and %q", c.args, code, errs, c.code, c.want)
		}
		emptyDir(t, dir)
	}

	code, stdout, errs := runCLI(t, append(base, "--budget", "5MB", "--json", "--workers", "2")...)
	if code != exitOK {
		t.Fatalf("select: status %d\n%s", code, errs)
	}
	var rep struct {
		SchemaVersion int  `json:"schema_version"`
		Measured      bool `json:"measured"`
		Result        struct {
			Selected struct {
				StoredBytes    int64   `json:"stored_bytes"`
				PredictedError float64 `json:"predicted_error"`
			} `json:"selected"`
			Exact bool `json:"exact"`
			Units []struct {
				Name   string `json:"name"`
				Choice struct {
					Format, Method string
				} `json:"choice"`
			} `json:"units"`
			References []struct {
				Name           string  `json:"name"`
				StoredBytes    int64   `json:"stored_bytes"`
				PredictedError float64 `json:"predicted_error"`
			} `json:"references"`
			Curve []json.RawMessage `json:"curve"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	r := rep.Result
	if rep.SchemaVersion != 1 || !rep.Measured || !r.Exact || r.Selected.StoredBytes > 5e6 || len(r.Units) == 0 || len(r.Curve) < 2 {
		t.Fatalf("select --json: %s", stdout)
	}
	formats := map[string]bool{}
	for _, u := range r.Units {
		formats[u.Choice.Format] = true
	}
	if len(formats) < 2 {
		t.Errorf("a budget between the extremes chose one format for every unit: %v", formats)
	}
	// No reference plan of no more bytes has a smaller predicted error.
	for _, ref := range r.References {
		if ref.StoredBytes <= r.Selected.StoredBytes && ref.PredictedError < r.Selected.PredictedError-1e-12 {
			t.Errorf("reference %s (%d bytes, error %g) beats the selection (%d bytes, error %g)", ref.Name, ref.StoredBytes, ref.PredictedError, r.Selected.StoredBytes, r.Selected.PredictedError)
		}
	}
	for _, f := range []string{"p.json", "p.sensitivity.json", "p.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Errorf("select left %d entries (scratch builds not removed?)", len(ents))
	}
	planBytes, _ := os.ReadFile(out)
	sensBytes, _ := os.ReadFile(filepath.Join(dir, "p.sensitivity.json"))

	// The plan builds as is and its size is the predicted one.
	dst := filepath.Join(t.TempDir(), "native")
	if code, _, errs := runCLI(t, "gptq", "--model", model, "--calib", store, "--plan", out, "--layers", "plan", "--out", dst, "--quiet"); code != exitOK {
		t.Fatalf("gptq --layers plan: status %d\n%s", code, errs)
	}
	if code, out, errs := runCLI(t, "verify", dst, "--source", model); code != exitOK {
		t.Fatalf("verify: status %d\n%s\n%s", code, out, errs)
	}
	ck, err := manifest.OpenCheckpoint(dst)
	if err != nil {
		t.Fatal(err)
	}
	var stored int64
	for _, te := range ck.Manifest().Tensors {
		stored += te.Length
	}
	if stored != r.Selected.StoredBytes {
		t.Errorf("built %d tensor bytes, predicted %d", stored, r.Selected.StoredBytes)
	}
	for _, u := range r.Units {
		if !strings.Contains(u.Name, ".experts.") {
			for _, te := range ck.Manifest().Tensors {
				if te.Name == u.Name && (string(te.Format) != u.Choice.Format || string(te.Method) != u.Choice.Method) {
					t.Errorf("%s built as %s/%s, selected %s/%s", u.Name, te.Format, te.Method, u.Choice.Format, u.Choice.Method)
				}
			}
		}
	}

	// One worker: the same sensitivity file and plan.
	dir1 := t.TempDir()
	if code, _, errs := runCLI(t, "select", "--model", model, "--calib", store, "--out", filepath.Join(dir1, "p.json"), "--quiet", "--budget", "5MB", "--workers", "1"); code != exitOK {
		t.Fatalf("select --workers 1: status %d\n%s", code, errs)
	}
	p1, _ := os.ReadFile(filepath.Join(dir1, "p.json"))
	s1, _ := os.ReadFile(filepath.Join(dir1, "p.sensitivity.json"))
	if !bytes.Equal(p1, planBytes) || !bytes.Equal(s1, sensBytes) {
		t.Error("the plan or the sensitivity file depends on the worker count")
	}

	// Another budget from the saved sensitivities: no measurement.
	code, stdout, errs = runCLI(t, append(base, "--budget", "4.8MB", "--json")...)
	if code != exitOK || !strings.Contains(stdout, `"measured": false`) {
		t.Fatalf("re-run: status %d\n%s\n%s", code, stdout, errs)
	}

	// Sensitivities of other calibration data are refused, nothing written.
	other := selectStore(t, model, "2")
	dir2 := t.TempDir()
	code, _, errs = runCLI(t, "select", "--model", model, "--calib", other, "--sensitivity", filepath.Join(dir, "p.sensitivity.json"),
		"--out", filepath.Join(dir2, "p.json"), "--budget", "5MB", "--quiet")
	if code != exitError || !strings.Contains(errs, "calibration store") {
		t.Errorf("other store: status %d, %s", code, errs)
	}
	emptyDir(t, dir2)
}

// TestSelectWeightsMeasure: --weights measure measures one weight per
// class and layer (the KL of the single change over its predicted loss),
// keeps them in the sensitivity file and uses them; another budget reads
// them without measuring; another mode measures again; the held-out flags
// without measure are a usage error.
func TestSelectWeightsMeasure(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	store := selectStore(t, model, "3")
	dir := t.TempDir()
	out := filepath.Join(dir, "p.json")
	base := []string{"select", "--model", model, "--calib", store, "--out", out, "--quiet", "--weights", "measure", "--eval-sequences", "2", "--eval-seq-len", "48"}
	if code, _, errs := runCLI(t, "select", "--model", model, "--calib", store, "--out", out, "--budget", "5MB", "--eval-sequences", "2"); code != exitUsage || !strings.Contains(errs, "--weights measure only") {
		t.Errorf("--eval-sequences without measure: status %d, %s", code, errs)
	}
	emptyDir(t, dir)
	code, stdout, errs := runCLI(t, append(base, "--budget", "5MB", "--json")...)
	if code != exitOK || !strings.Contains(stdout, `"measured": true`) {
		t.Fatalf("select --weights measure: status %d\n%s", code, errs)
	}
	var sens struct {
		KL struct {
			Mode      string `json:"mode"`
			Candidate string `json:"candidate"`
			Scored    int64  `json:"scored_tokens"`
			Changes   []struct {
				Key          string
				Tensors      int
				Loss, Weight float64
				KL           float64 `json:"mean_kl"`
			} `json:"changes"`
		} `json:"kl_weights"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "p.sensitivity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &sens); err != nil {
		t.Fatal(err)
	}
	k := sens.KL
	// Four layers × four classes; every window's positions but the last
	// (which has no next token) are scored.
	if k.Mode != "class_layer" || k.Candidate != "BFP4_b:gptq" || k.Scored != 2*47 || len(k.Changes) != 16 {
		t.Fatalf("kl_weights %+v", k)
	}
	var rep struct {
		Result struct {
			Weights map[string]float64 `json:"weights"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	for _, c := range k.Changes {
		if !(c.KL > 0) || !(c.Loss > 0) || c.Tensors == 0 || c.Weight != c.KL/c.Loss || rep.Result.Weights[c.Key] != c.Weight {
			t.Errorf("change %+v (used weight %v)", c, rep.Result.Weights[c.Key])
		}
	}
	code, stdout, errs = runCLI(t, append(base, "--budget", "4.8MB", "--json")...)
	if code != exitOK || !strings.Contains(stdout, `"measured": false`) {
		t.Fatalf("another budget: status %d\n%s", code, errs)
	}
	// One worker: the same weights and plan.
	dir1 := t.TempDir()
	one := append([]string(nil), base...)
	one[6] = filepath.Join(dir1, "p.json")
	if code, _, errs := runCLI(t, append(one, "--budget", "4.8MB", "--workers", "1")...); code != exitOK {
		t.Fatalf("--workers 1: status %d\n%s", code, errs)
	}
	for _, f := range []string{"p.json", "p.sensitivity.json"} {
		a, _ := os.ReadFile(filepath.Join(dir, f))
		b, _ := os.ReadFile(filepath.Join(dir1, f))
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Errorf("%s depends on the worker count", f)
		}
	}
	base[len(base)-5] = "measure:class"
	code, stdout, errs = runCLI(t, append(base, "--budget", "4.8MB", "--json")...)
	if code != exitOK || !strings.Contains(stdout, `"measured": true`) {
		t.Fatalf("measure:class: status %d\n%s", code, errs)
	}

	// A store whose calibration text has changed since: refused before the
	// measurement builds, nothing written.
	text := filepath.Join(t.TempDir(), "calib.jsonl")
	orig, err := os.ReadFile(filepath.Join(model, "calib.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(text, orig, 0o644)
	moved := filepath.Join(t.TempDir(), "store")
	if code, _, errs := runCLI(t, "calib", "build", "--model", model, "--data", text, "--out", moved, "--sequences", "3", "--seq-len", "32", "--quiet"); code != exitOK {
		t.Fatalf("calib build: status %d\n%s", code, errs)
	}
	os.WriteFile(text, append(orig, orig[:strings.Index(string(orig), "\n")+1]...), 0o644)
	dir3 := t.TempDir()
	code, _, errs = runCLI(t, "select", "--model", model, "--calib", moved, "--out", filepath.Join(dir3, "p.json"), "--quiet", "--weights", "measure", "--budget", "5MB")
	if code != exitError || !strings.Contains(errs, "has changed") {
		t.Errorf("changed calibration text: status %d, %s", code, errs)
	}
	emptyDir(t, dir3)
}

// TestSelectFromText: --data measures by sequential builds of the
// calibration text (recorded as such), a re-run tokenizes the text to
// check the saved sensitivities instead of measuring, another calibration
// set is refused, and --calib with --data is a usage error.
func TestSelectFromText(t *testing.T) {
	model := testdata.Dir(t, "models", "tiny-qwen36-trained")
	text := filepath.Join(model, "calib.jsonl")
	dir := t.TempDir()
	out := filepath.Join(dir, "p.json")
	base := []string{"select", "--model", model, "--data", text, "--seq-len", "32", "--out", out, "--quiet", "--json"}
	if code, _, errs := runCLI(t, append(base, "--sequences", "2", "--budget", "5MB", "--calib", dir)...); code != exitUsage || !strings.Contains(errs, "not both") {
		t.Errorf("--calib and --data: status %d, %s", code, errs)
	}
	emptyDir(t, dir)
	code, stdout, errs := runCLI(t, append(base, "--sequences", "2", "--budget", "5MB")...)
	if code != exitOK || !strings.Contains(stdout, `"measured": true`) {
		t.Fatalf("select --data: status %d\n%s", code, errs)
	}
	var sens struct {
		Calibration manifest.CalibInfo `json:"calibration"`
	}
	b, _ := os.ReadFile(filepath.Join(dir, "p.sensitivity.json"))
	if err := json.Unmarshal(b, &sens); err != nil {
		t.Fatal(err)
	}
	if sens.Calibration.Mode != manifest.CalibModeSequential || sens.Calibration.Tokens != 64 {
		t.Errorf("calibration %+v", sens.Calibration)
	}
	code, stdout, errs = runCLI(t, append(base, "--sequences", "2", "--budget", "4.8MB")...)
	if code != exitOK || !strings.Contains(stdout, `"measured": false`) {
		t.Fatalf("re-run: status %d\n%s", code, errs)
	}
	code, _, errs = runCLI(t, append(base, "--sequences", "3", "--budget", "4.8MB")...)
	if code != exitError || !strings.Contains(errs, "does not belong") {
		t.Errorf("other calibration set: status %d, %s", code, errs)
	}
}
