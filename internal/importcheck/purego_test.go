package importcheck

import (
	"bufio"
	"go/build/constraint"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// goldenOverTaggedCode are packages without build-tagged code of their own
// whose tests pin, by golden digest or reference vectors, results computed
// through build-tagged code paths of the packages below them (gptq's solver
// over the kernels and the BFP rounding; the forward pass against the
// trained models' reference NLL; the checkpoint digests of manifest/build),
// so the purego pass must run them too — those tests, not the whole
// package a second time.
var goldenOverTaggedCode = []string{"gptq", "internal/model/forward", "manifest/build"}

// readmeTestCommand returns README.md's test command: the line of its first
// code block that ends in "# the tests", without the comment.
func readmeTestCommand(t *testing.T, root string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cmd, comment, ok := strings.Cut(sc.Text(), "#")
		if ok && strings.TrimSpace(comment) == "the tests" {
			return strings.TrimSpace(cmd)
		}
	}
	t.Fatal(`README.md has no line ending in "# the tests"`)
	return ""
}

// puregoPatterns returns the package patterns of the command's
// "go test -tags purego" steps (a step may narrow its tests with -run).
func puregoPatterns(t *testing.T, command string) []string {
	t.Helper()
	var pats []string
	for _, step := range strings.Split(command, "&&") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(step), "go test -tags purego ")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		for i := 0; i < len(fields); i++ {
			if fields[i] == "-run" {
				i++
				continue
			}
			pats = append(pats, fields[i])
		}
	}
	if len(pats) == 0 {
		t.Fatalf("README's test command %q has no go test -tags purego step", command)
	}
	return pats
}

// covered reports whether a go package pattern list names dir.
func covered(patterns []string, dir string) bool {
	for _, p := range patterns {
		p = strings.TrimPrefix(p, "./")
		if p == dir || p == "..." {
			return true
		}
		if base, ok := strings.CutSuffix(p, "/..."); ok && (dir == base || strings.HasPrefix(dir, base+"/")) {
			return true
		}
	}
	return false
}

// puregoDirs lists the package directories holding a file whose build
// constraint mentions the purego tag (test files included: they are the
// twins' checks).
func puregoDirs(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	for _, rel := range moduleGoFiles(t, root) {
		path := filepath.Join(root, rel)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "package ") {
				break
			}
			if !constraint.IsGoBuild(line) {
				continue
			}
			expr, err := constraint.Parse(line)
			if err != nil {
				t.Errorf("%s: %v", path, err)
				break
			}
			mentions := false
			expr.Eval(func(tag string) bool {
				mentions = mentions || tag == "purego"
				return false
			})
			if mentions {
				dirs = append(dirs, filepath.Dir(rel))
			}
		}
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// TestPuregoPassCoversTaggedCode: the test command runs the purego pass
// over every package with purego-tagged files and over the golden tests of
// results computed through them, and over nothing else is required; CI runs
// exactly that command.
func TestPuregoPassCoversTaggedCode(t *testing.T) {
	root := testdata.RepoRoot()
	command := readmeTestCommand(t, root)
	patterns := puregoPatterns(t, command)
	dirs := puregoDirs(t, root)
	if len(dirs) == 0 {
		t.Fatal("no file mentions the purego tag; the scan is broken")
	}
	for _, dir := range append(dirs, goldenOverTaggedCode...) {
		if !covered(patterns, dir) {
			t.Errorf("%s has purego-tagged code or golden tests over it, but README's purego pass (%s) does not run it", dir, strings.Join(patterns, " "))
		}
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), command) {
		t.Errorf(".ci/run does not run README's test command %q", command)
	}
}

func TestCoveredPatterns(t *testing.T) {
	pats := []string{"./bfp", "./emulator/...", "./internal/kernels/..."}
	for dir, want := range map[string]bool{
		"bfp": true, "bfp/x": false, "emulator": true, "emulator/eval/harness": true,
		"internal/kernels": true, "internal/kernelsx": false, "gptq": false,
	} {
		if got := covered(pats, dir); got != want {
			t.Errorf("covered(%v, %q) = %v, want %v", pats, dir, got, want)
		}
	}
	if !covered([]string{"./..."}, "anything/at/all") {
		t.Error("./... must cover every directory")
	}
}
