// Package importcheck holds the test that keeps the module's imports pointing
// one way: leaves import nothing of ours but the internal/cpu leaf, and every
// package imports only the packages below it.
package importcheck

import (
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

const module = "github.com/ttquant/ttquant"

// allowed lists, for every package directory of the module (relative to the
// repository root, subdirectories included), the module packages that its
// non-test files may import; an entry "=p" permits p but not the packages
// under it (so manifest/ttnn reads the checkpoint format without linking the
// build pipelines). Test files may in addition import
// internal/testdata and the package under test's allowed set plus anything
// named in allowedInTests.
var allowed = map[string][]string{
	"internal/cpu":           {},
	"bfp":                    {"internal/cpu"},
	"safetensors":            {},
	"internal/testdata":      {},
	"internal/benchenv":      {},
	"internal/testdatacheck": {},
	"internal/kernels":       {"internal/cpu"},
	"internal/rng":           {},
	"internal/fslock":        {},
	// The words the quantizer and the checkpoint format share. A leaf.
	"internal/quant": {},
	// Work split across cluster workers: specs and the partition. A leaf.
	"internal/shard":    {"internal/par", "internal/fslock"},
	"internal/progress": {},
	// A real single-node Slurm cluster for tests. Imports nothing of ours.
	"internal/slurmtest":  {},
	"internal/model":      {"safetensors"},
	"internal/testmodel":  {"safetensors", "internal/rng", "internal/atomicfile"},
	"gptq":                {"bfp", "internal/kernels"},
	"calib":               {"bfp", "safetensors", "gptq", "internal/atomicfile", "internal/jsonx", "internal/kernels", "internal/model", "internal/model/ffn", "internal/quant", "internal/rng", "internal/text/dataset", "internal/shard", "internal/fslock", "internal/par"},
	"internal/atomicfile": {},
	// The record-reading rule and compaction of embedded JSON. A leaf.
	"internal/jsonx": {},
	"internal/par":   {},
	"manifest":       {"bfp", "safetensors", "internal/atomicfile", "internal/par", "internal/fslock", "internal/quant"},
	"manifest/plan":  {"bfp", "safetensors", "manifest", "internal/model", "internal/atomicfile"},
	// Build pipelines: the store build reads a calibration store; the
	// sequential build runs the forward pass over tokenized text.
	"manifest/build": {"bfp", "safetensors", "gptq", "calib", "manifest", "manifest/plan", "internal/kernels", "internal/model", "internal/model/ffn", "internal/model/forward", "internal/model/walk", "internal/text", "internal/atomicfile", "internal/jsonx", "internal/par", "internal/fslock", "internal/shard", "internal/progress"},
	"manifest/ttnn":  {"bfp", "safetensors", "=manifest", "internal/atomicfile", "internal/fslock"},
	// Precision selection: measures through the store build, weighs the
	// losses by single-change evaluations in the harness (the forward pass
	// over held-out text), solves, draws the Pareto curve with the
	// evaluation's SVG helpers.
	"manifest/selection": {"safetensors", "gptq", "calib", "manifest", "manifest/plan", "manifest/build", "internal/model", "internal/atomicfile", "internal/fslock", "internal/jsonx", "internal/shard", "emulator/eval", "emulator/eval/harness", "internal/model/forward", "internal/text"},
	"emulator":           {"bfp", "safetensors", "manifest", "internal/kernels", "internal/par", "emulator/eval"},
	// The evaluation's scores and tables; its progress estimate is the
	// one every long command's is.
	"emulator/eval":        {"internal/progress"},
	"internal/importcheck": {"internal/testdata"},
	"cmd":                  {"*"},
	// The evaluation harness runs the forward pass over decoded checkpoint
	// tensors: the checkpoint format (not its build pipelines), the
	// forward pass, text; never the quantizer or calibration directly.
	"emulator/eval/harness": {"=manifest", "bfp", "safetensors", "emulator", "emulator/eval", "internal/model", "internal/model/forward", "internal/text", "internal/kernels", "internal/atomicfile", "internal/shard"},
	// Tokenizer and datasets: a near-leaf, importing only its own
	// packages, so that calibration and evaluation can use it without it
	// ever pulling in the checkpoint format or the quantizer.
	"internal/text": {"internal/text"},
	// The feed-forward blocks (the MoE block, SwiGLU), used by calibration
	// and by the forward pass alike.
	"internal/model/ffn": {"internal/kernels", "internal/model"},
	// The forward pass runs models; it must not link the checkpoint
	// builder, the calibration or the quantizer.
	"internal/model/forward": {"safetensors", "internal/kernels", "internal/model", "internal/model/ffn"},
	// The calibration walker: the forward pass stepped layer by layer over
	// calibration sequences, and its resume files. Used by calibration from
	// text and by the sequential build; links neither of them, nor the
	// quantizer, nor the checkpoint format.
	"internal/model/walk": {"internal/atomicfile", "internal/jsonx", "internal/model", "internal/model/forward"},
	// The built-in model is data: it imports nothing.
	"internal/model/builtin": {},
	// Calibration from text: the store format, the forward pass and the
	// text pipeline, and the output directory's lock; never the
	// checkpoint format or its builder.
	"calib/textcalib": {"calib", "safetensors", "internal/atomicfile", "internal/jsonx", "internal/kernels", "internal/model", "internal/model/forward", "internal/model/walk", "internal/text", "internal/fslock", "internal/shard", "internal/progress"},
}

// allowedInTests are extra module packages that test files may import.
var allowedInTests = map[string][]string{
	"*":                      {"internal/testdata", "internal/testmodel", "internal/benchenv"},
	"gptq":                   {"safetensors"},
	"manifest":               {"manifest/plan", "manifest/build"},
	"manifest/build":         {"emulator", "calib/textcalib"}, // textcalib: a text store for the store build's asymmetric test
	"manifest/ttnn":          {"manifest/plan", "manifest/build"},
	"internal/testmodel":     {},
	"internal/model/forward": {"internal/testmodel"},
	"calib":                  {"internal/model/forward"}, // the loaders compared with the forward pass's
	"cmd/ttquant":            {"internal/slurmtest"},
	"calib/textcalib":        {"internal/model/builtin"},      // the example builds a store from the built-in model
	"internal/model/ffn":     {"internal/rng", "safetensors"}, // random blocks; the tiny model's routers
	// The harness's tests build native checkpoints of the fixtures.
	"emulator/eval/harness": {"manifest", "manifest/build", "manifest/plan", "internal/model/builtin"},
}

// owner returns the key of allowed that governs dir: the longest key that is
// dir or a parent of it.
func owner(dir string) (string, bool) {
	best := ""
	for k := range allowed {
		if (dir == k || strings.HasPrefix(dir, k+"/")) && len(k) > len(best) {
			best = k
		}
	}
	return best, best != ""
}

// permits reports whether a package allowed to import list may import pkg:
// pkg is listed, or is a subpackage of a listed package that has no rule of
// its own (manifest does not permit manifest/build).
func permits(list []string, pkg string) bool {
	for _, p := range list {
		if exact, ok := strings.CutPrefix(p, "="); ok {
			if pkg == exact {
				return true
			}
			continue
		}
		if p == "*" || pkg == p {
			return true
		}
		if strings.HasPrefix(pkg, p+"/") {
			if k, ok := owner(pkg); ok && k == p {
				return true
			}
		}
	}
	return false
}

func TestImportsPointOneWay(t *testing.T) {
	root := testdata.RepoRoot()
	var problems []string
	for _, rel := range moduleGoFiles(t, root) {
		path := filepath.Join(root, rel)
		dir := filepath.Dir(rel)
		key, ok := owner(dir)
		if !ok {
			if dir != "." {
				problems = append(problems, rel+": package directory not listed in the import rules")
			}
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		isTest := strings.HasSuffix(path, "_test.go")
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p != module && !strings.HasPrefix(p, module+"/") {
				continue
			}
			p = strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
			if p == dir || strings.HasPrefix(dir, p+"/") && p == key {
				continue // the package itself (external test package)
			}
			if permits(allowed[key], p) {
				continue
			}
			if isTest && (permits(allowedInTests["*"], p) || permits(allowedInTests[key], p) || p == key || strings.HasPrefix(p, key+"/")) {
				continue
			}
			problems = append(problems, rel+" imports "+p+", which "+key+" may not import")
		}
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
}

// TestRulesRejectUpwardImport checks the rule table itself, so that the walk
// above cannot pass because the table permits everything.
func TestRulesRejectUpwardImport(t *testing.T) {
	cases := []struct {
		dir, imp string
		want     bool
	}{
		{"bfp", "gptq", false},
		{"bfp", "safetensors", false},
		{"safetensors", "bfp", false},
		{"gptq", "bfp", true},
		{"gptq", "calib", false},
		{"calib", "manifest", false},
		{"manifest", "emulator", false},
		{"emulator", "manifest", true},
		{"emulator", "emulator/eval", true},
		{"emulator/eval", "emulator", false},
		{"emulator/eval", "manifest", false},
		{"emulator/eval", "gptq", false},
		{"emulator/eval", "calib", false},
		{"emulator/eval/harness", "manifest", true},
		{"emulator/eval/harness", "internal/model/forward", true},
		{"emulator/eval/harness", "manifest/build", false},
		{"emulator/eval/harness", "gptq", false},
		{"emulator/eval/harness", "calib", false},
		{"cmd/ttquant", "emulator", true},
		{"manifest", "calib", false},
		{"manifest", "gptq", false},
		{"manifest", "manifest/build", false},
		{"manifest", "manifest/plan", false},
		{"manifest", "internal/testmodel", false},
		{"manifest", "internal/model", false},
		{"manifest/plan", "manifest/build", false},
		{"manifest/plan", "calib", false},
		{"manifest/build", "manifest/plan", true},
		{"calib", "internal/testmodel", false},
		{"calib", "internal/model", true},
		{"internal/model", "calib", false},
		{"emulator", "internal/testmodel", false},
		{"manifest/ttnn", "manifest", true},
		{"manifest/ttnn", "internal/atomicfile", true},
		{"manifest/ttnn", "manifest/build", false},
		{"manifest/ttnn", "manifest/plan", false},
		{"manifest/ttnn", "calib", false},
		{"manifest/ttnn", "gptq", false},
		{"internal/text/tokenizer", "manifest", false},
		{"internal/text/dataset", "calib", false},
		{"internal/text/dataset", "gptq", false},
		{"internal/text/dataset", "safetensors", false},
		{"internal/text/dataset", "internal/text/tokenizer", true},
		{"internal/model/forward", "gptq", false},
		{"internal/model/forward", "manifest", false},
		{"internal/model/forward", "calib", false},
		{"internal/model/forward", "internal/model/ffn", true},
		{"internal/model/ffn", "calib", false},
		{"calib/textcalib", "internal/model/forward", true},
		{"calib/textcalib", "internal/model/walk", true},
		{"manifest/build", "internal/model/walk", true},
		{"internal/model/walk", "calib", false},
		{"internal/model/walk", "manifest", false},
		{"internal/model/walk", "gptq", false},
		{"calib/textcalib", "manifest", false},
		{"calib/textcalib", "manifest/build", false},
	}
	for _, c := range cases {
		key, ok := owner(c.dir)
		if !ok {
			t.Fatalf("%s has no rule", c.dir)
		}
		if got := permits(allowed[key], c.imp); got != c.want {
			t.Errorf("%s importing %s: permitted=%v, want %v", c.dir, c.imp, got, c.want)
		}
	}
}

// linksNone lists, for the packages whose promise is what they do not
// link, the module packages that must not be among their dependencies,
// direct or transitive: a program that opens or verifies a checkpoint, runs
// the forward pass or tokenizes text links neither the calibration nor the
// quantizer nor a build pipeline.
var linksNone = map[string][]string{
	"manifest":                {"calib", "gptq", "manifest/build", "manifest/plan", "internal/testmodel", "internal/kernels"},
	"manifest/ttnn":           {"calib", "gptq", "manifest/build", "manifest/plan", "internal/testmodel"},
	"internal/model/forward":  {"calib", "gptq", "manifest", "manifest/build", "internal/testmodel"},
	"internal/model/ffn":      {"calib", "gptq", "manifest", "internal/model/forward"},
	"internal/model/walk":     {"calib", "gptq", "manifest", "manifest/build", "internal/testmodel"},
	"internal/text/tokenizer": {"calib", "gptq", "manifest", "internal/model/forward", "internal/kernels"},
	"emulator/eval/harness":   {"calib", "gptq", "manifest/build", "internal/testmodel"},
}

// TestLinksNoQuantizer checks linksNone through the build tool, so that
// an import two steps away counts as much as a direct one.
func TestLinksNoQuantizer(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not available")
	}
	pkgs := make([]string, 0, len(linksNone))
	for p := range linksNone {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		cmd := exec.Command(goBin, "list", "-deps", "./"+p)
		cmd.Dir = testdata.RepoRoot()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps ./%s: %v", p, err)
		}
		deps := map[string]bool{}
		for _, d := range strings.Fields(string(out)) {
			deps[d] = true
		}
		for _, f := range linksNone[p] {
			if deps[module+"/"+f] {
				t.Errorf("%s depends on %s, directly or through another package", p, f)
			}
		}
	}
}

// TestNoProductionTestModel: only test files and the command line (whose
// testmodel and demo commands write the built-in models) import
// internal/testmodel.
func TestNoProductionTestModel(t *testing.T) {
	for key, list := range allowed {
		if key == "cmd" || key == "internal/testmodel" || key == "internal/importcheck" {
			continue
		}
		if permits(list, "internal/testmodel") {
			t.Errorf("%s may import internal/testmodel outside tests", key)
		}
	}
}
