package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
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
