package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
)

func init() {
	register(&command{
		name:    "data",
		summary: "build calibration/evaluation token sequences from a data spec and show their provenance",
		run:     runData,
	})
}

// dataFlags are the flags of every command that takes text (--data SPEC).
// Options come from these flags, or from a spec file, never both.
type dataFlags struct {
	fs            *flag.FlagSet
	data          string
	sequences     int
	seqLen        int
	mode          string
	short         string
	evalSequences int
	evalSeqLen    int
	evalMode      string
	evalShort     string
	evalFraction  float64
	seed          uint64
	separator     string
}

// optionFlags are the dataFlags that a spec file may give instead.
var optionFlags = []string{"sequences", "seq-len", "mode", "short", "eval-sequences", "eval-seq-len", "eval-mode", "eval-short", "eval-fraction", "seed", "separator"}

// dataSets says which token sets a command builds from its text: the
// calibration set, the evaluation set, or both. A command gets the flags
// of the sets it builds only, so its help shows nothing it would ignore.
type dataSets int

const (
	calibrationSet dataSets = 1 << iota
	evaluationSet
)

func addDataFlags(fs *flag.FlagSet, sets dataSets, sequences int) *dataFlags {
	d := &dataFlags{fs: fs, sequences: sequences, seqLen: 2048, mode: "pack", short: "keep",
		evalSeqLen: 2048, evalMode: "pack", evalShort: "keep"}
	fs.StringVar(&d.data, "data", "", "data `SPEC`: LABEL=[KIND:]PATH[:WEIGHT],... or a spec.json (docs/data.md)")
	seqHelp := "calibration sequences (at least 1)"
	if sets&evaluationSet != 0 {
		seqHelp = "calibration sequences (0: none)"
	}
	fs.IntVar(&d.sequences, "sequences", sequences, seqHelp)
	fs.IntVar(&d.seqLen, "seq-len", 2048, "calibration sequence length in tokens")
	fs.StringVar(&d.mode, "mode", "pack", "calibration sequences: pack (records joined by the separator) or record (one record each)")
	fs.StringVar(&d.short, "short", "keep", "mode record: shorter records are kept, pad-ded or skip-ped")
	if sets&evaluationSet != 0 {
		fs.IntVar(&d.evalSequences, "eval-sequences", 0, "evaluation sequences (0: none)")
		fs.IntVar(&d.evalSeqLen, "eval-seq-len", 2048, "evaluation sequence length in tokens")
		fs.StringVar(&d.evalMode, "eval-mode", "pack", "evaluation sequences: pack or record")
		fs.StringVar(&d.evalShort, "eval-short", "keep", "evaluation mode record: keep, pad or skip")
		fs.Float64Var(&d.evalFraction, "eval-fraction", dataset.DefaultEvalFraction, "share of records held out for evaluation, 0 < f < 1")
	} else {
		fs.Float64Var(&d.evalFraction, "eval-fraction", dataset.DefaultEvalFraction, "share of records held out of calibration for a later evaluation (recorded with the calibration set), 0 < f < 1")
	}
	fs.Uint64Var(&d.seed, "seed", 1, "seed of the split, record order and sequence order")
	fs.StringVar(&d.separator, "separator", "", "token after each packed record (default: the tokenizer's EOS)")
	return d
}

// addAllowShortFlag adds --allow-short to a command that builds a
// calibration set from text.
func addAllowShortFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("allow-short", false, "build with the tokens the text gives when it gives fewer than --sequences × --seq-len (default: refuse)")
}

// resolve parses the spec and returns it with the options to build it.
func (d *dataFlags) resolve(workers int) (*dataset.Spec, dataset.Options, error) {
	if d.data == "" {
		return nil, dataset.Options{}, usageErrorf("--data is required")
	}
	spec, err := dataset.ParseSpec(d.data)
	if err != nil {
		return nil, dataset.Options{}, err
	}
	if spec.Options != nil {
		var set []string
		d.fs.Visit(func(f *flag.Flag) {
			for _, o := range optionFlags {
				if f.Name == o {
					set = append(set, "--"+o)
				}
			}
		})
		if len(set) > 0 {
			return nil, dataset.Options{}, usageErrorf("%s: the spec file gives the options; %s cannot be used with it", d.data, strings.Join(set, ", "))
		}
		opt := *spec.Options
		opt.Workers = workers
		return spec, opt, nil
	}
	if d.evalFraction <= 0 || d.evalFraction > 1 || d.evalFraction == 1 && d.sequences > 0 {
		return nil, dataset.Options{}, usageErrorf("--eval-fraction %v: want 0 < f < 1 (or 1, every record for evaluation, with --sequences 0)", d.evalFraction)
	}
	for _, c := range []struct {
		name, v string
		ok      []string
	}{{"mode", d.mode, []string{"pack", "record"}}, {"eval-mode", d.evalMode, []string{"pack", "record"}},
		{"short", d.short, []string{"keep", "pad", "skip"}}, {"eval-short", d.evalShort, []string{"keep", "pad", "skip"}}} {
		found := false
		for _, o := range c.ok {
			found = found || o == c.v
		}
		if !found {
			return nil, dataset.Options{}, usageErrorf("--%s %q: want one of %s", c.name, c.v, strings.Join(c.ok, ", "))
		}
	}
	for _, c := range []struct {
		name string
		v    int
		min  int
	}{{"sequences", d.sequences, 0}, {"eval-sequences", d.evalSequences, 0}, {"seq-len", d.seqLen, 1}, {"eval-seq-len", d.evalSeqLen, 1}} {
		if c.v < c.min || c.v > dataset.MaxSeqLen*16 {
			return nil, dataset.Options{}, usageErrorf("--%s %d: want %d..%d", c.name, c.v, c.min, dataset.MaxSeqLen*16)
		}
	}
	short := func(mode, s string) dataset.Short {
		if mode == "pack" {
			return ""
		}
		return dataset.Short(s)
	}
	opt := dataset.Options{
		Calibration:  dataset.SetOptions{Sequences: d.sequences, SeqLen: d.seqLen, Mode: dataset.Mode(d.mode), Short: short(d.mode, d.short)},
		Evaluation:   dataset.SetOptions{Sequences: d.evalSequences, SeqLen: d.evalSeqLen, Mode: dataset.Mode(d.evalMode), Short: short(d.evalMode, d.evalShort)},
		EvalFraction: d.evalFraction, Seed: d.seed, Separator: d.separator, Workers: workers,
	}
	return spec, opt, nil
}

// dataDoc is the --json document of ttquant data.
type dataDoc struct {
	SchemaVersion int                `json:"schema_version"`
	Model         string             `json:"model"`
	Out           string             `json:"out,omitempty"`
	Provenance    dataset.Provenance `json:"provenance"`
}

// dataLine is one line of the --out file.
type dataLine struct {
	Set     string              `json:"set"`
	Index   int                 `json:"index"`
	Label   string              `json:"label"`
	IDs     []int32             `json:"ids"`
	Mask    string              `json:"mask"` // one '1' or '0' per token
	Records []dataset.RecordRef `json:"records"`
}

func runData(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "data", "--model DIR --data SPEC [--sequences N --seq-len L ...] [--out FILE.jsonl] [--json]")
	model := fs.String("model", "", "model `directory` holding tokenizer.json and tokenizer_config.json (required)")
	out := fs.String("out", "", "write the sequences as JSON lines to this `file` (provenance first)")
	asJSON := fs.Bool("json", false, "print the provenance as JSON")
	workers := addWorkersFlag(fs, "records encoded")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	d := addDataFlags(fs, calibrationSet|evaluationSet, 128)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	if *model == "" {
		return usageErrorf("--model is required")
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	spec, opt, err := d.resolve(*workers)
	if err != nil {
		return err
	}
	if !*quiet {
		opt.Progress = func(msg string) { fmt.Fprintln(e.stderr, "data:", msg) }
	}
	tok, err := tokenizer.Load(*model)
	if err != nil {
		return err
	}
	res, err := dataset.Build(spec, tok, opt)
	if err != nil {
		return err
	}
	if *out != "" {
		if err := writeDataFile(*out, res); err != nil {
			return err
		}
	}
	if *asJSON {
		return writeJSON(e.stdout, dataDoc{SchemaVersion: schemaVersion, Model: *model, Out: *out, Provenance: res.Provenance})
	}
	w := bufio.NewWriter(e.stdout)
	p := res.Provenance
	fmt.Fprintf(w, "tokenizer %s (%s), separator %d\n", p.Tokenizer.SHA256[:16], p.Tokenizer.Pattern, p.Tokenizer.SeparatorID)
	for _, s := range p.Sources {
		label := s.Label
		if label == "" {
			label = "(corpus field)"
		}
		fmt.Fprintf(w, "source %-14s %-5s %s: %d files, %d records (%d calibration, %d evaluation)\n", label, s.Kind, s.Path, len(s.Files), s.Records, s.CalibrationRecords, s.EvaluationRecords)
	}
	for _, set := range []struct {
		name string
		info *dataset.SetInfo
	}{{"calibration", p.Calibration}, {"evaluation", p.Evaluation}} {
		if set.info == nil {
			continue
		}
		labels := make([]string, 0, len(set.info.ByLabel))
		for l, n := range set.info.ByLabel {
			labels = append(labels, fmt.Sprintf("%s %d", l, n))
		}
		sort.Strings(labels)
		fmt.Fprintf(w, "%s: %d sequences, %d tokens (%d masked) from %d records; %s; token ids sha256 %s\n", set.name, set.info.Sequences, set.info.Tokens, set.info.MaskedTokens, set.info.Records, strings.Join(labels, ", "), set.info.TokenIDsSHA256)
	}
	return w.Flush()
}

// writeDataFile writes the provenance and then every sequence as JSON
// lines, through a temporary file renamed into place, so that a failed run
// leaves nothing.
func writeDataFile(path string, res *dataset.Result) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := bufio.NewWriterSize(tmp, 1<<20)
	enc := json.NewEncoder(w)
	if err := enc.Encode(map[string]any{"schema_version": schemaVersion, "provenance": res.Provenance}); err != nil {
		return err
	}
	for _, set := range []*dataset.Set{res.Calibration, res.Evaluation} {
		if set == nil {
			continue
		}
		for i, s := range set.Sequences {
			mask := make([]byte, len(s.Mask))
			for k, m := range s.Mask {
				mask[k] = '0'
				if m {
					mask[k] = '1'
				}
			}
			if err := enc.Encode(dataLine{Set: set.Name, Index: i, Label: s.Label, IDs: s.IDs, Mask: string(mask), Records: s.Records}); err != nil {
				return err
			}
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
