package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/build"
)

func init() {
	register(&command{name: "convert", summary: "build a native checkpoint with round-to-nearest quantization", run: runConvert})
}

// buildFlags are the flags convert and gptq share.
type buildFlags struct {
	model, out, parent            string
	plan                          *planFlags
	workers, expertsPerFile       int
	denseShard                    int64
	quiet, asJSON, allowNonFinite bool
	workersFlag                   *int
	shard                         *shardFlags
	exponent                      *string
}

func addBuildFlags(fs *flag.FlagSet) *buildFlags {
	b := &buildFlags{}
	fs.StringVar(&b.model, "model", "", "source checkpoint: a .safetensors file, a directory or a *.index.json (required)")
	fs.StringVar(&b.out, "out", "", "output directory (required; an unfinished build there of the same inputs is resumed)")
	b.plan = addPlanFlags(fs)
	fs.StringVar(&b.parent, "parent", "", "sha256 of the manifest this checkpoint derives from")
	b.workersFlag = addWorkersFlag(fs, "files produced")
	fs.IntVar(&b.expertsPerFile, "experts-per-file", manifest.DefaultExpertsPerFile, "routed experts per grouped expert file")
	fs.Int64Var(&b.denseShard, "dense-shard-bytes", manifest.DefaultDenseShardBytes, "target size of a dense shard file")
	fs.BoolVar(&b.quiet, "quiet", false, "no progress on stderr")
	fs.BoolVar(&b.asJSON, "json", false, "print the result as JSON")
	b.shard = addShardFlags(fs, "ttquant assemble DIR")
	fs.BoolVar(&b.allowNonFinite, "allow-nonfinite", false, "store tensors whose source holds NaN or Inf instead of refusing (they are listed in the manifest and reported)")
	b.exponent = addExponentFlag(fs)
	return b
}

// options turns the shared flags into build options.
func (b *buildFlags) options(e *env, needOut bool) (build.BuildOptions, error) {
	var opt build.BuildOptions
	if b.model == "" {
		return opt, usageErrorf("--model is required")
	}
	if needOut && b.out == "" {
		return opt, usageErrorf("--out is required")
	}
	b.workers = *b.workersFlag
	if err := checkWorkers(b.workers); err != nil {
		return opt, err
	}
	if err := inRange("experts-per-file", int64(b.expertsPerFile), 1, build.MaxExpertsPerFile); err != nil {
		return opt, err
	}
	if err := inRange("dense-shard-bytes", b.denseShard, 1, math.MaxInt64); err != nil {
		return opt, err
	}
	sp, err := b.shard.spec()
	if err != nil {
		return opt, err
	}
	if b.parent != "" && !isSHA256(b.parent) {
		return opt, usageErrorf("--parent %q: want the sha256 of a manifest (64 lowercase hex digits)", b.parent)
	}
	rule, err := exponentRule(*b.exponent)
	if err != nil {
		return opt, err
	}
	pl, err := b.plan.load()
	if err != nil {
		return opt, err
	}
	opt = build.BuildOptions{
		Faults:          testFaults,
		Tool:            toolVersion(),
		Source:          b.model,
		Out:             b.out,
		Plan:            pl,
		Workers:         b.workers,
		ExpertsPerFile:  b.expertsPerFile,
		DenseShardBytes: b.denseShard,
		Parent:          b.parent,
		AllowNonFinite:  b.allowNonFinite,
		Shard:           sp,
		Exponent:        rule,
	}
	if !b.quiet {
		opt.Progress = newProgress(e.stderr).event
	}
	return opt, nil
}

// toolVersion is this binary's version, recorded in the manifests it
// writes.
func toolVersion() manifest.ToolInfo {
	bi := readBuildInfo()
	return manifest.ToolInfo{Name: "ttquant", Version: bi.Version, Revision: bi.Revision, Modified: bi.Modified}
}

// buildError explains an interrupted build, saying what the output
// directory holds now.
func buildError(opt build.BuildOptions, err error) error {
	if errors.Is(err, context.Canceled) && !opt.DryRun {
		return fmt.Errorf("interrupted: %s", outDirState(opt.Out))
	}
	return err
}

// syntheticCalibrationError makes the refusal of a synthetic calibration
// store a usage error that names the flag accepting it.
func syntheticCalibrationError(err error) error {
	if errors.Is(err, build.ErrSyntheticCalibration) {
		return usageErrorf("%v (pass --allow-synthetic-calibration to use it anyway)", err)
	}
	return err
}

// outDirState describes an output directory after an interrupted build.
func outDirState(dir string) string {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Sprintf("nothing was written (%s does not exist)", dir)
	case err != nil:
		return fmt.Sprintf("%s cannot be read: %v", dir, err)
	case len(ents) == 0:
		return fmt.Sprintf("nothing was written (%s is empty)", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, manifest.ManifestName)); err == nil {
		return fmt.Sprintf("%s still holds the finished checkpoint, unchanged", dir)
	}
	return fmt.Sprintf("the unfinished build is kept in %s; run the same command again to resume it", dir)
}

// buildReport is the --json document of convert and gptq.
type buildReport struct {
	SchemaVersion   int                   `json:"schema_version"`
	Dir             string                `json:"dir"`
	Identity        string                `json:"identity"`
	CacheKey        string                `json:"cache_key"`
	Files           int                   `json:"files"`
	Tensors         int                   `json:"tensors"`
	Bytes           int64                 `json:"bytes"`
	Kept            int                   `json:"kept_files"`
	AlreadyComplete bool                  `json:"already_complete"`
	Work            *build.WorkSummary    `json:"work"`
	Layers          []manifest.LayerStats `json:"layers,omitempty"`
	// NonFinite lists the tensors stored from a source holding NaN or Inf
	// (--allow-nonfinite).
	NonFinite []string `json:"nonfinite_tensors,omitempty"`
}

func printBuild(e *env, res *build.BuildResult, asJSON bool) error {
	if res.Manifest == nil {
		return printShard(e, res, asJSON)
	}
	if n := len(res.NonFinite); n > 0 {
		fmt.Fprintf(e.stderr, "WARNING: %d tensors were stored from source values holding NaN or Inf (--allow-nonfinite); each BFP block with one has lost its other values. The manifest lists them under ttquant.nonfinite_tensors: %s\n",
			n, strings.Join(firstN(res.NonFinite, 5), ", "))
	}
	if asJSON {
		return writeJSON(e.stdout, buildReport{
			SchemaVersion: schemaVersion, Dir: res.Dir, Identity: res.Identity, CacheKey: res.CacheKey,
			Files: res.Files, Tensors: res.Tensors, Bytes: res.Bytes, Kept: res.Kept,
			AlreadyComplete: res.AlreadyComplete, Work: res.Work, Layers: res.Manifest.TTQuant.Layers,
			NonFinite: res.NonFinite,
		})
	}
	header := false
	for _, l := range res.Manifest.TTQuant.Layers {
		if l.HeldOutTokens == 0 || l.RefMeanSquare == 0 {
			continue
		}
		if !header {
			fmt.Fprintln(e.stdout, "held-out MoE block error (mean squared error / mean square of the output)")
			fmt.Fprintf(e.stdout, "%5s  %8s  %10s  %10s  %8s  %7s\n", "layer", "held-out", "GPTQ", "RTN", "GPTQ/RTN", "starved")
			header = true
		}
		ratio := 0.0
		if l.HeldOutRTNMSE > 0 {
			ratio = l.HeldOutMSE / l.HeldOutRTNMSE
		}
		fmt.Fprintf(e.stdout, "%5d  %8d  %10.3e  %10.3e  %8.3f  %7d\n", l.Layer, l.HeldOutTokens, l.HeldOutMSE/l.RefMeanSquare, l.HeldOutRTNMSE/l.RefMeanSquare, ratio, len(l.Starved))
	}
	fallbacks := 0
	for _, m := range res.Manifest.TTQuant.Matrices {
		if m.Fallback != "" {
			fallbacks++
		}
	}
	if fallbacks > 0 {
		fmt.Fprintf(e.stdout, "fallbacks   %d matrices rounded to nearest instead of GPTQ (reasons in the manifest)\n", fallbacks)
	}
	fmt.Fprintf(e.stdout, "checkpoint  %s\n", res.Dir)
	fmt.Fprintf(e.stdout, "identity    %s\n", res.Identity)
	fmt.Fprintf(e.stdout, "cache key   %s\n", res.CacheKey)
	fmt.Fprintf(e.stdout, "contents    %d files, %d tensors, %s\n", res.Files, res.Tensors, humanBytes(res.Bytes))
	if res.Kept > 0 {
		fmt.Fprintf(e.stdout, "resumed     kept %d finished files\n", res.Kept)
	}
	return nil
}

func runConvert(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "convert", "--model SRC --out DST [--preset P | --plan FILE] [flags]")
	bf := addBuildFlags(fs)
	calibPath := fs.String("calib", "", "calibration store (calib build): weights the rounding of --bfp-exponent search by each input channel's mean squared activation; only with --bfp-exponent search")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	opt, err := bf.options(e, true)
	if err != nil {
		return err
	}
	opt.Calib = *calibPath
	if err := opt.Validate(); err != nil {
		return usageErrorf("%v", err)
	}
	res, err := build.Convert(ctx, opt)
	if errors.Is(err, build.ErrConvertCalib) {
		return usageErrorf("%v", err)
	}
	if err != nil {
		return buildError(opt, err)
	}
	return printBuild(e, res, bf.asJSON)
}

// progress renders build progress on stderr as one line of one form: the
// share of the build's work done, the current layer's share, files,
// bytes, elapsed time and the ETA (build.ProgressEvent.Work, one measure
// for the whole build). On a terminal the line is rewritten in place as
// each file (each expert group in a GPTQ layer) is finished; otherwise a
// line is printed per finished layer, inside a layer at most every
// logEvery, and at the end.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	last  time.Time
	width int
}

// logEvery is the longest silence inside a layer when stderr is not a
// terminal.
const logEvery = 10 * time.Second

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// pct is a as a whole percentage of b (0 when b is not positive).
func pct(a, b int64) int64 {
	if b <= 0 {
		return 0
	}
	return a * 100 / b
}

// progressText is the line for an event.
func progressText(ev build.ProgressEvent) string {
	layer := ""
	if ev.Layer >= 0 && ev.LayerWorkTotal > 0 {
		layer = fmt.Sprintf("layer %d %d%%  ", ev.Layer, pct(ev.LayerWork, ev.LayerWorkTotal))
	}
	return fmt.Sprintf("%3d%%  %s%d/%d files  %s/%s  %s elapsed  ETA %s", pct(ev.Work, ev.WorkTotal), layer,
		ev.FilesDone, ev.FilesTotal, humanBytes(ev.BytesDone), humanBytes(ev.BytesTotal), ev.Elapsed.Round(time.Second), etaText(ev.ETA()))
}

// etaText is a progress line's ETA: to the second, or "?" before there
// is an estimate.
func etaText(d time.Duration, ok bool) string {
	if !ok {
		return "?"
	}
	return d.Round(time.Second).String()
}

func (p *progress) event(ev build.ProgressEvent) {
	line := progressText(ev)
	switch ev.Kind {
	case "file":
		p.draw(line, "", false, true)
	case "layer-start":
		p.draw(line, "", false, false)
	case "layer":
		p.draw(line, fmt.Sprintf("layer %d done  ", ev.Layer), true, false)
	case "done":
		p.end(line)
	case "start":
		p.begin()
	}
}

// begin starts the silence that draw measures.
func (p *progress) begin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = time.Now()
}

// draw shows line: on a terminal rewritten in place (at most every 200 ms
// when throttled); otherwise printed with prefix when it is a milestone,
// else only after logEvery of silence.
func (p *progress) draw(line, prefix string, milestone, throttle bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		if throttle && time.Since(p.last) < 200*time.Millisecond {
			return
		}
		p.last = time.Now()
		pad := ""
		if n := p.width - len(line); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		p.width = len(line)
		fmt.Fprintf(p.w, "\r%s%s", line, pad)
		return
	}
	switch {
	case milestone:
		fmt.Fprintf(p.w, "%s%s\n", prefix, line)
	case time.Since(p.last) < logEvery:
		return
	default:
		fmt.Fprintln(p.w, line)
	}
	p.last = time.Now()
}

// end shows the last line and ends it.
func (p *progress) end(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r%s%s\n", line, strings.Repeat(" ", max(0, p.width-len(line))))
	} else {
		fmt.Fprintf(p.w, "done  %s\n", line)
	}
	p.width = 0
}

// println prints a log line, first clearing a progress line left in place
// on a terminal (the next draw shows it again).
func (p *progress) println(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.width > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
		p.width = 0
	}
	fmt.Fprintln(p.w, msg)
}

// close ends a line left in place by a command that stopped early.
func (p *progress) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.width > 0 {
		fmt.Fprintln(p.w)
	}
	p.width = 0
}

// firstN returns the first n strings of s, with "…" for the rest.
func firstN(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(append([]string(nil), s[:n]...), fmt.Sprintf("… (%d more)", len(s)-n))
}

// parseNoArgs parses the flags of a command that takes no positional
// argument, given in any order (parseInterleaved); an argument is a usage
// error.
func parseNoArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q", pos[0])
	}
	return nil
}

// parseInterleaved parses flags that may follow positional arguments
// ("verify DIR --json") and returns the positional arguments; after "--"
// every argument is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		ended, err := parseOnce(fs, args)
		if err != nil {
			return nil, err
		}
		args = fs.Args()
		if ended || len(args) == 0 {
			return append(pos, args...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// testFaults is the fault hook of every build the command line starts:
// nil, except in the command's own tests, which slow writes down to stop
// a process in the middle of a file.
var testFaults atomicfile.Faults
