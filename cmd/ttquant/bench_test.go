package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBenchTable(t *testing.T) {
	code, out, errs := runCLI(t, "bench", "--duration", "300ms", "--small")
	if code != exitOK {
		t.Fatalf("status %d, stderr %s", code, errs)
	}
	for _, want := range []string{"FMA peak:", "hessian", "gptq-update-96x256", "inverse-factor-256", "sgemm", "dgemm", "GFLOP/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestBenchJSON(t *testing.T) {
	code, out, errs := runCLI(t, "bench", "--duration", "300ms", "--small", "--json", "--workers", "1")
	if code != exitOK {
		t.Fatalf("status %d, stderr %s", code, errs)
	}
	var doc benchDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if doc.SchemaVersion != schemaVersion || doc.Workers != 1 || len(doc.Results) != 7 || doc.Peak.F32 <= 0 {
		t.Errorf("unexpected document: %+v", doc)
	}
	for _, r := range doc.Results {
		if !(r.GFLOPS > 0) || r.Runs < 1 {
			t.Errorf("result %+v", r)
		}
	}
	if doc.Estimate.Solves != 3*40*256 || !(doc.Estimate.TotalSeconds > 0) {
		t.Errorf("estimate %+v", doc.Estimate)
	}
	code, out, errs = runCLI(t, "bench", "--duration", "100ms", "--small", "--json", "--layers", "2", "--experts", "8")
	if code != exitOK {
		t.Fatalf("status %d, stderr %s", code, errs)
	}
	doc = benchDoc{}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc.Estimate.Solves != 3*2*8 || doc.Workload.Layers != 2 {
		t.Errorf("estimate flags not applied: %v %+v", err, doc.Workload)
	}
}

func TestBenchUsage(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--duration", "0s"},
		{"bench", "--workers", "-1"},
		{"bench", "extra"},
		{"bench", "--nope"},
		{"bench", "--hidden", "0"},
	} {
		if code, _, _ := runCLI(t, args...); code != exitUsage {
			t.Errorf("%q: status %d, want %d", args, code, exitUsage)
		}
	}
}
