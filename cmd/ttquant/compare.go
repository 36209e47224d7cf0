package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/emulator"
	"github.com/ttquant/ttquant/safetensors"
)

func init() {
	register(&command{
		name:    "compare",
		summary: "quality of a candidate run's logits against a reference (ΔPPL, top-1, KL)",
		run:     runCompare,
	})
}

// compareRow is one row of `compare --json`; non-finite or undefined values
// are null.
type compareRow struct {
	Corpus          string   `json:"corpus"`
	Tokens          int64    `json:"tokens"`
	PPLTokens       int64    `json:"ppl_tokens"`
	RefPPL          *float64 `json:"ref_ppl"`
	CandPPL         *float64 `json:"cand_ppl"`
	DeltaPPLPercent *float64 `json:"delta_ppl_percent"`
	Top1Agreement   *float64 `json:"top1_agreement"`
	MeanKL          *float64 `json:"mean_kl"`
	P99KL           *float64 `json:"p99_kl"`
}

type compareDoc struct {
	SchemaVersion int          `json:"schema_version"`
	Reference     string       `json:"reference"`
	Candidate     string       `json:"candidate"`
	Targets       string       `json:"targets,omitempty"`
	Tokens        int          `json:"tokens"`
	Vocab         int          `json:"vocab"`
	Rows          []compareRow `json:"rows"`
}

func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func runCompare(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "compare", "--reference A.safetensors --candidate B.safetensors [--targets T.safetensors] [--corpus LABELS.txt] [--json]")
	refPath := fs.String("reference", "", "reference run's logits: safetensors `file` with a [tokens, vocab] BF16/F16/F32 tensor (named \"logits\", or the only tensor)")
	candPath := fs.String("candidate", "", "candidate run's logits, same tokens and vocabulary as the reference")
	tensor := fs.String("tensor", "", "logits tensor `name` in both files (default \"logits\" or the only tensor)")
	targetsPath := fs.String("targets", "", "safetensors `file` with an integer tensor [tokens] of target token ids for perplexity (named \"targets\", or the only tensor; negative = not scored). Default: a \"targets\" tensor in the reference file, if any")
	corpusPath := fs.String("corpus", "", "text `file` with one corpus label per token, one per line")
	chunk := fs.Int("chunk", 16, "token rows read at a time from each file")
	asJSON := fs.Bool("json", false, "print a JSON document instead of the table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageErrorf("unexpected arguments %q", fs.Args())
	}
	if *refPath == "" || *candPath == "" {
		return usageErrorf("--reference and --candidate are required")
	}
	if err := inRange("chunk", int64(*chunk), 1, math.MaxInt32); err != nil {
		return err
	}
	rf, ref, err := openLogits(*refPath, *tensor)
	if err != nil {
		return err
	}
	defer rf.Close()
	cf, cand, err := openLogits(*candPath, *tensor)
	if err != nil {
		return err
	}
	defer cf.Close()
	tokens, vocab := ref.Shape()
	targets, targetsFrom, err := compareTargets(*targetsPath, *refPath, rf, ref)
	if err != nil {
		return err
	}
	var labels []string
	if *corpusPath != "" {
		if labels, err = readLabels(*corpusPath); err != nil {
			return err
		}
		if len(labels) != tokens {
			return fmt.Errorf("%s: %d corpus labels for the %d tokens of %s", *corpusPath, len(labels), tokens, ref.Name())
		}
	}

	e.log.Info("comparing logits", "reference", *refPath, "candidate", *candPath, "tokens", tokens, "vocab", vocab)
	next := tokens / 10
	rows, err := emulator.CompareLogits(ctx, ref, cand, targets, labels, emulator.CompareOptions{
		ChunkTokens: *chunk,
		Progress: func(done, total int) {
			if done >= next && done < total {
				e.log.Info("progress", "tokens", done, "of", total)
				next = done + total/10
			}
		},
	})
	if err != nil {
		return err
	}
	if *asJSON {
		doc := compareDoc{SchemaVersion: schemaVersion, Reference: *refPath, Candidate: *candPath, Targets: targetsFrom, Tokens: tokens, Vocab: vocab}
		for _, r := range rows {
			doc.Rows = append(doc.Rows, compareRow{Corpus: r.Corpus, Tokens: r.Tokens, PPLTokens: r.PPLTokens,
				RefPPL: finite(r.RefPPL), CandPPL: finite(r.CandPPL), DeltaPPLPercent: finite(r.DeltaPPLPercent),
				Top1Agreement: finite(r.Top1), MeanKL: finite(r.MeanKL), P99KL: finite(r.P99KL)})
		}
		return writeJSON(e.stdout, doc)
	}
	return writeQualityTable(e.stdout, rows)
}

// openLogits opens a logits file and its [tokens, vocab] tensor.
func openLogits(path, tensor string) (*safetensors.File, *emulator.SafetensorsLogits, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, nil, err
	}
	l, err := emulator.OpenLogits(f, tensor)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, l, nil
}

// compareTargets reads the target token ids from targetsPath or, when it
// is empty, from a "targets" tensor of the reference file (none: nil), and
// checks them against the reference's tokens and vocabulary. It returns
// the file they came from.
func compareTargets(targetsPath, refPath string, rf *safetensors.File, ref *emulator.SafetensorsLogits) ([]int64, string, error) {
	tokens, vocab := ref.Shape()
	var targets []int64
	from := targetsPath
	switch {
	case from != "":
		tf, err := safetensors.Open(from)
		if err != nil {
			return nil, "", err
		}
		targets, err = readTargets(tf, true)
		tf.Close()
		if err != nil {
			return nil, "", err
		}
	default:
		if _, ok := rf.Lookup("targets"); ok {
			from = refPath
			var err error
			if targets, err = readTargets(rf, false); err != nil {
				return nil, "", err
			}
		}
	}
	if targets != nil && len(targets) != tokens {
		return nil, "", fmt.Errorf("%s: %d targets for the %d tokens of %s", from, len(targets), tokens, ref.Name())
	}
	for i, t := range targets {
		if t >= int64(vocab) {
			return nil, "", fmt.Errorf("%s: target %d of token %d is outside the vocabulary of %d (%s)", from, t, i, vocab, ref.Name())
		}
	}
	return targets, from, nil
}

// readTargets reads the target ids: the tensor "targets", or (when onlyOK is
// true) the file's only tensor.
func readTargets(f *safetensors.File, onlyOK bool) ([]int64, error) {
	name := "targets"
	if _, ok := f.Lookup(name); !ok {
		ts := f.Tensors()
		if !onlyOK || len(ts) != 1 {
			return nil, fmt.Errorf("%s: no tensor named \"targets\" and %d tensors to choose from", f.Path(), len(ts))
		}
		name = ts[0].Name
	}
	info, _ := f.Lookup(name)
	if len(info.Shape) > 2 || len(info.Shape) == 2 && info.Shape[0] != 1 {
		return nil, fmt.Errorf("%s: tensor %q has shape %v; targets must be [tokens] (or [1, tokens])", f.Path(), name, info.Shape)
	}
	return f.Int64s(name)
}

// readLabels reads one corpus label per line (surrounding blanks trimmed);
// empty lines are errors, except after the last label.
func readLabels(path string) ([]string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	var labels []string
	intern := map[string]string{}
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	blank := 0
	for line := 1; sc.Scan(); line++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" {
			blank = line
			continue
		}
		if blank != 0 {
			return nil, fmt.Errorf("%s: line %d is empty; every token needs a corpus label", path, blank)
		}
		s, ok := intern[l]
		if !ok && l == emulator.OverallLabel {
			return nil, fmt.Errorf("%s: line %d: %q is reserved for the row covering all tokens", path, line, l)
		}
		if !ok {
			intern[l] = l
			s = l
		}
		labels = append(labels, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return labels, nil
}

// writeQualityTable prints the rows as a Markdown table in the layout of
// published quality tables.
func writeQualityTable(w io.Writer, rows []emulator.QualityRow) error {
	num := func(v float64, prec int) string {
		switch {
		case math.IsNaN(v):
			return "—"
		case math.IsInf(v, 1):
			return "inf"
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
	pct := func(v float64, sign bool) string {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return num(v, 2)
		}
		s := strconv.FormatFloat(v, 'f', 2, 64) + "%"
		if sign && v >= 0 {
			s = "+" + s
		}
		return s
	}
	var b strings.Builder
	b.WriteString("| Corpus | Tokens | PPL (reference) | PPL (candidate) | ΔPPL | Top-1 agreement | Mean KL | p99 KL |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		name := r.Corpus
		if name == emulator.OverallLabel {
			name = "**Overall**"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", name, r.Tokens,
			num(r.RefPPL, 3), num(r.CandPPL, 3), pct(r.DeltaPPLPercent, true), pct(100*r.Top1, false), num(r.MeanKL, 5), num(r.P99KL, 5))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
