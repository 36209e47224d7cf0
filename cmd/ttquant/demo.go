package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/ttquant/ttquant/cmd/internal/demo"
)

func init() {
	register(&command{name: "demo", summary: "the main job end to end on the built-in trained model: sequential GPTQ from text, verify, quality table", run: runDemo})
}

// demoReport is the --json document of demo.
type demoReport struct {
	SchemaVersion int `json:"schema_version"`
	*demo.Result
}

func runDemo(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "demo", "[--out DIR] [--json]")
	out := fs.String("out", "", "keep the model and the checkpoints in this directory (default: a temporary directory, removed)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	workers := addWorkersFlag(fs, "files produced and checked, experts quantized, windows evaluated")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	seqs := fs.Int("sequences", 48, "calibration sequences")
	seqLen := fs.Int("seq-len", 512, "tokens per calibration sequence")
	heldOut := fs.Int("held-out", 8, "final calibration sequences kept out of the Hessians for the held-out error")
	evalSeqs := fs.Int("eval-sequences", 24, "evaluation sequences")
	evalSeqLen := fs.Int("eval-seq-len", 512, "tokens per evaluation sequence (one window each)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	for _, c := range []struct {
		name   string
		v, min int64
		max    int64
	}{
		{"sequences", int64(*seqs), 2, math.MaxInt32},
		{"seq-len", int64(*seqLen), 2, math.MaxInt32},
		{"held-out", int64(*heldOut), 1, int64(*seqs) - 1},
		{"eval-sequences", int64(*evalSeqs), 1, math.MaxInt32},
		{"eval-seq-len", int64(*evalSeqLen), 2, math.MaxInt32},
	} {
		if err := inRange(c.name, c.v, c.min, c.max); err != nil {
			return err
		}
	}
	opt := demo.Options{Tool: toolVersion(), Out: *out, Workers: *workers, Sequences: *seqs, SeqLen: *seqLen, HeldOut: *heldOut, EvalSequences: *evalSeqs, EvalSeqLen: *evalSeqLen}
	if !*quiet {
		pr := newProgress(e.stderr)
		defer pr.close()
		opt.Progress = pr.demoEvent
		opt.Log = func(msg string) { pr.println("demo: " + msg) }
		fmt.Fprintln(e.stderr, "demo: built-in trained tiny Qwen3.6-MoE; qwen36-35b-a3b preset (experts BFP4_b, the rest BFP8_b)")
	}
	res, err := demo.Run(ctx, opt)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(e.stdout, demoReport{SchemaVersion: schemaVersion, Result: res}); err != nil {
			return err
		}
	} else if err := printDemo(e, res); err != nil {
		return err
	}
	if !res.OK() {
		return &statusError{status: exitVerifyKO, err: fmt.Errorf("a demo checkpoint failed verification")}
	}
	return nil
}

func printDemo(e *env, r *demo.Result) error {
	w := e.stdout
	fmt.Fprintf(w, "model %s: sequential GPTQ with the asymmetric fit (routed and shared experts) against round to nearest\n\n", r.Model)
	fmt.Fprintln(w, "held-out MoE block error per layer (mean squared error / mean square of the output), on the")
	fmt.Fprintln(w, "inputs the quantized layers before it produce; drift: the quantized stream against the BF16 one")
	fmt.Fprintf(w, "%5s  %8s  %8s  %10s  %10s  %8s  %10s  %7s\n", "layer", "calib", "held-out", "GPTQ", "RTN", "GPTQ/RTN", "drift", "starved")
	for _, l := range r.Layers {
		fmt.Fprintf(w, "%5d  %8d  %8d  %10.3e  %10.3e  %8.3f  %10.3e  %7d\n", l.Layer, l.CalibTokens, l.HeldOutTokens, l.GPTQRelErr, l.RTNRelErr, l.Ratio, l.StreamRelMSE, l.Starved)
	}
	if n := len(r.Fallbacks); n > 0 {
		fmt.Fprintf(w, "%d matrices rounded to nearest instead of GPTQ, e.g. %s: %s\n", n, r.Fallbacks[0].Tensor, r.Fallbacks[0].Fallback)
	}
	fmt.Fprintln(w)
	for _, c := range r.Checkpoints {
		status := "verify OK"
		if !c.Verify.OK {
			status = fmt.Sprintf("verify FAILED (%d checks)", len(c.Verify.Failures))
		}
		fmt.Fprintf(w, "%-5s %d files, %d tensors, %s, identity %.16s…, %s", c.Label, c.Files, c.Tensors, humanBytes(c.Bytes), c.Identity, status)
		if c.Dir != "" {
			fmt.Fprintf(w, " (%s)", c.Dir)
		}
		fmt.Fprintln(w)
		for _, f := range c.Verify.Failures {
			fmt.Fprintf(w, "FAIL  %s\n", f)
		}
	}
	if r.Eval == nil {
		return nil
	}
	fmt.Fprintln(w)
	if err := r.Eval.WriteMarkdown(w); err != nil {
		return err
	}
	if r.Reading != "" {
		fmt.Fprintf(w, "\n%s\n", r.Reading)
	}
	if len(r.Pictures) > 0 {
		fmt.Fprintf(w, "\npictures: %s\n", strings.Join(r.Pictures, ", "))
	}
	return nil
}

// demoText is the demo's one progress line: the command's share, its
// step, the build's layer, elapsed time and the command's ETA.
func demoText(p demo.Progress) string {
	layer := ""
	if p.Layer >= 0 {
		layer = fmt.Sprintf("  layer %d %d%%", p.Layer, int(p.LayerShare*100))
	}
	return fmt.Sprintf("%3d%%  step %d/%d %s%s  %s elapsed  ETA %s", int(p.Share()*100), p.Step, p.Steps, p.Name, layer, p.Elapsed.Round(time.Second), etaText(p.ETA()))
}

func (p *progress) demoEvent(ev demo.Progress) {
	line := demoText(ev)
	switch ev.Kind {
	case "update":
		p.draw(line, "", false, true)
	case "step":
		p.draw(line, "", true, false)
	case "layer":
		p.draw(line, fmt.Sprintf("layer %d done  ", ev.Layer), true, false)
	case "done":
		p.end(line)
	}
}
