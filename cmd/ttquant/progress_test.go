package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/model/builtin"
	"github.com/ttquant/ttquant/manifest/build"
)

// progressLine is the one form of every progress line of a build: the
// share of the whole build, the layer and its share, files, bytes, elapsed
// time and one ETA.
var progressLine = regexp.MustCompile(`^(layer \d+ done  |done  )?\s*\d+%  (layer \d+ \d+%  )?\d+/\d+ files  \S+ \S*B/\S+ \S*B  \S+ elapsed  ETA \S+( in \S+)?$`)

// TestGPTQProgressOneLine: a sequential gptq build prints one kind of
// progress line, with one ETA, whatever part of the build it reports (two
// meters with their own ETAs used to alternate).
func TestGPTQProgressOneLine(t *testing.T) {
	root, model := builtinModel(t)
	code, _, errs := runCLI(t, "gptq", "--model", model, "--data", "calib="+filepath.Join(model, builtin.CalibText), "--sequences", "4", "--seq-len", "64",
		"--experts-per-file", "4", "--out", filepath.Join(root, "out"))
	if code != exitOK {
		t.Fatalf("gptq: status %d\n%s", code, errs)
	}
	n := 0
	for _, line := range strings.Split(errs, "\n") {
		if !strings.Contains(line, "ETA") {
			continue
		}
		n++
		if strings.Count(line, "ETA") != 1 || !progressLine.MatchString(line) {
			t.Errorf("progress line %q is not of the one form", line)
		}
	}
	for _, want := range []string{"layer 0 done", "layer 4 done", "done  100%"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	if n < 6 {
		t.Errorf("%d progress lines, want one per layer and a last one:\n%s", n, errs)
	}
}

// TestProgressInsideLayer: on a terminal the one line advances inside a
// layer, at each expert group file, and its ETA is the build's.
func TestProgressInsideLayer(t *testing.T) {
	var b bytes.Buffer
	p := &progress{w: &b, tty: true}
	ev := build.ProgressEvent{Kind: "start", Layer: -1, FilesTotal: 9, BytesTotal: 9 << 20, WorkTotal: 18}
	p.event(ev)
	ev.Kind, ev.Layer, ev.LayerWorkTotal = "layer-start", 0, 9
	p.event(ev)
	for i := 1; i <= 8; i++ {
		ev.Kind, ev.Work, ev.LayerWork, ev.FilesDone, ev.BytesDone, ev.Elapsed = "file", int64(i), int64(i), i, int64(i)<<20, time.Duration(i)*time.Minute
		p.last = time.Time{} // every event redraws
		p.event(ev)
	}
	lines := strings.Split(b.String(), "\r")
	last := strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(last, "44%  layer 0 88%  8/9 files") || !strings.HasSuffix(last, "ETA 10m0s") {
		t.Errorf("last line %q: want 44%% of the build, 88%% of layer 0, ETA 10m0s", last)
	}
	if len(lines) < 9 || strings.Contains(b.String(), "\n") {
		t.Errorf("want one line rewritten in place, got %q", b.String())
	}
}

// demoLine is the one form of the demo's progress lines: the command's
// share, its step, the build's layer, elapsed time and one ETA.
var demoLine = regexp.MustCompile(`^(layer \d+ done  |done  )?\s*\d+%  step \d/4 [a-zA-Z ]+?(  layer \d+ \d+%)?  \S+ elapsed  ETA \S+$`)

// TestDemoProgressOneLine: the demo runs two builds and an evaluation
// under one progress line with one ETA for the whole command (each build
// used to print its own line with its own ETA).
func TestDemoProgressOneLine(t *testing.T) {
	code, _, errs := runCLI(t, "demo", "--out", filepath.Join(t.TempDir(), "d"), "--workers", "2", "--sequences", "6", "--seq-len", "64", "--held-out", "2",
		"--eval-sequences", "2", "--eval-seq-len", "32")
	if code != exitOK {
		t.Fatalf("demo: status %d\n%s", code, errs)
	}
	steps := map[string]bool{}
	for _, line := range strings.Split(errs, "\n") {
		if !strings.Contains(line, "ETA") {
			continue
		}
		if strings.Count(line, "ETA") != 1 || !demoLine.MatchString(line) {
			t.Errorf("progress line %q is not of the demo's one form", line)
		}
		if i := strings.Index(line, "step "); i >= 0 {
			steps[line[i:i+len("step 1/4")]] = true
		}
	}
	for _, want := range []string{"step 1/4", "step 2/4", "step 3/4", "step 4/4"} {
		if !steps[want] {
			t.Errorf("no progress line of %s:\n%s", want, errs)
		}
	}
	if !strings.Contains(errs, "done  100%  step 4/4 evaluate") {
		t.Errorf("stderr lacks the last line at 100%%:\n%s", errs)
	}
	for _, line := range strings.Split(errs, "\n") {
		if progressLine.MatchString(line) {
			t.Errorf("a build's own progress line %q reached the demo's output", line)
		}
	}
}

// storeLine is the one form of calib build's progress lines.
var storeLine = regexp.MustCompile(`^(layer \d+ done  |done  )?\s*\d+%  (MTP )?layer \d+ \d+%  \d+/\d+ layers  \S+ elapsed  ETA \S+$`)

// TestCalibBuildProgressOneLine: calib build prints one progress line of
// one form, with one ETA, a line per finished layer and a last one (each
// layer used to print its own estimate in a sentence of its own).
func TestCalibBuildProgressOneLine(t *testing.T) {
	root, model := builtinModel(t)
	code, _, errs := runCLI(t, "calib", "build", "--model", model, "--data", "calib="+filepath.Join(model, builtin.CalibText), "--sequences", "4", "--seq-len", "64",
		"--out", filepath.Join(root, "store"))
	if code != exitOK {
		t.Fatalf("calib build: status %d\n%s", code, errs)
	}
	n := 0
	for _, line := range strings.Split(errs, "\n") {
		if !strings.Contains(line, "ETA") && !strings.Contains(line, "left") {
			continue
		}
		n++
		if strings.Count(line, "ETA") != 1 || !storeLine.MatchString(line) {
			t.Errorf("progress line %q is not of the one form", line)
		}
	}
	for _, want := range []string{"layer 0 done", "layer 3 done", "done  100%  MTP layer 4 100%  5/5 layers"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	if n < 5 {
		t.Errorf("%d progress lines, want one per layer:\n%s", n, errs)
	}
}
