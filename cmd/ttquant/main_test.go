package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/model/builtin"
)

// runCLI runs the command line in-process and returns its exit status and
// output streams.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI(t, "version")
	if code != exitOK || !strings.HasPrefix(out, "ttquant ") {
		t.Fatalf("version: status %d, output %q", code, out)
	}
	code, out, _ = runCLI(t, "version", "--json")
	if code != exitOK {
		t.Fatalf("version --json: status %d", code)
	}
	var b buildInfo
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatalf("version --json output is not JSON: %v\n%s", err, out)
	}
	if b.SchemaVersion != schemaVersion || b.Module != "github.com/ttquant/ttquant" {
		t.Errorf("version --json = %+v", b)
	}
}

func TestUsageErrors(t *testing.T) {
	if code, _, _ := runCLI(t); code != exitUsage {
		t.Errorf("no arguments: status %d, want %d", code, exitUsage)
	}
	if code, _, errs := runCLI(t, "no-such-command"); code != exitUsage || !strings.Contains(errs, "unknown command") {
		t.Errorf("unknown command: status %d, stderr %q", code, errs)
	}
	code, _, errs := runCLI(t, "version", "--no-such-flag")
	if code != exitUsage {
		t.Errorf("bad flag: status %d, want %d", code, exitUsage)
	}
	if n := strings.Count(errs, "no-such-flag"); n != 1 {
		t.Errorf("bad flag reported %d times, want once:\n%s", n, errs)
	}
	if code, _, errs := runCLI(t, "convert", "--preset", "no-such-preset", "--model", "m", "--out", "o"); code != exitUsage || !strings.Contains(errs, "no-such-preset") {
		t.Errorf("unknown preset: status %d, stderr %q", code, errs)
	}
}

// TestBuildInfoRevision: the revision comes from the go command's
// vcs.revision stamp, else from the -X fallback; vcs.modified is kept.
func TestBuildInfoRevision(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.x", Main: debug.Module{Path: "github.com/ttquant/ttquant", Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	if b := buildInfoOf(stamped, "fallback"); b.Revision != "abc123" || !b.Modified || b.Version != "(devel)" {
		t.Errorf("stamped build: %+v", b)
	}
	bare := &debug.BuildInfo{GoVersion: "go1.x", Main: debug.Module{Path: "github.com/ttquant/ttquant"}}
	if b := buildInfoOf(bare, "def456"); b.Revision != "def456" || b.Modified {
		t.Errorf("unstamped build with -X revision: %+v", b)
	}
	if b := buildInfoOf(nil, ""); b.Revision != "" || b.Version != "(unknown)" {
		t.Errorf("no build info: %+v", b)
	}
}

// TestHelpExitsZero: -h and --help print the usage on stdout and exit 0,
// for commands and subcommands alike; a bad flag stays a usage error.
func TestHelpExitsZero(t *testing.T) {
	var cases [][]string
	for _, args := range [][]string{{"-h"}, {"--help"}, {"gptq", "-h"}, {"convert", "--help"}, {"calib", "-h"},
		{"calib", "synth", "-h"}, {"emulate", "-h"}, {"emulate", "check", "--help"}, {"verify", "-h"}, {"demo", "-h"}} {
		cases = append(cases, args)
	}
	for name := range commands {
		cases = append(cases, []string{name, "-h"})
	}
	for _, args := range cases {
		code, out, _ := runCLI(t, args...)
		if code != exitOK || !strings.Contains(out, "usage: ttquant") {
			t.Errorf("%v: status %d, stdout %q", args, code, out)
		}
	}
	if code, _, errs := runCLI(t, "gptq", "--bogus"); code != exitUsage || !strings.Contains(errs, "usage: ttquant gptq") {
		t.Errorf("bad flag: status %d, stderr %q", code, errs)
	}
}

// builtinModel writes the built-in trained model into a new temporary
// directory and returns that directory and the model's folder in it.
func builtinModel(t *testing.T) (root, model string) {
	t.Helper()
	root = t.TempDir()
	model, err := builtin.Write(filepath.Join(root, "model"))
	if err != nil {
		t.Fatal(err)
	}
	return root, model
}

// TestVersionFlag: ttquant --version (and -version) prints what the
// version command prints.
func TestVersionFlag(t *testing.T) {
	_, want, _ := runCLI(t, "version")
	for _, flag := range []string{"--version", "-version"} {
		code, out, errs := runCLI(t, flag)
		if code != exitOK || out != want {
			t.Errorf("ttquant %s: status %d, stdout %q (want %q), stderr %q", flag, code, out, want, errs)
		}
	}
	if code, out, _ := runCLI(t, "--version", "--json"); code != exitOK || !strings.Contains(out, `"schema_version"`) {
		t.Errorf("ttquant --version --json: status %d, stdout %q", code, out)
	}
}

// TestFlagAfterArgument: a flag after a positional argument is a usage
// error naming it (the flag package stops at the first argument, so it
// would otherwise be taken as one), except after "--" and in the commands
// that accept flags on either side of their arguments.
func TestFlagAfterArgument(t *testing.T) {
	_, model := builtinModel(t)
	for _, args := range [][]string{
		{"eval", "--model", model, "ckpt", "--json"},
		{"tokenize", "--model", model, "hello", "--ids"},
	} {
		code, out, errs := runCLI(t, args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, args[len(args)-1]) || !strings.Contains(errs, "after the argument") {
			t.Errorf("%v: status %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	code, out, errs := runCLI(t, "tokenize", "--model", model, "--ids", "--", "--ids")
	if code != exitOK || strings.TrimSpace(out) == "" {
		t.Errorf("tokenize -- --ids: status %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, "inspect", filepath.Join(model, "model.safetensors"), "--json"); code != exitOK {
		t.Errorf("inspect FILE --json (flags after arguments accepted): status %d, stderr %q", code, errs)
	}
}
