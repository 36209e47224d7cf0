package eval

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// SchemaVersion is the version of the JSON result layout (Result). It
// changes when a field changes meaning or disappears.
const SchemaVersion = 1

// RunInfo describes one run of an evaluation: the reference or a candidate.
type RunInfo struct {
	// Label is the short name used in tables ("BF16", "RTN", "GPTQ").
	Label string `json:"label"`
	// Identity records what was run, opaque to this package: a
	// checkpoint's identity, the source model's files and digests, …
	Identity any `json:"identity,omitempty"`
	// Numerics describes how the run computed (for example "cpu-fp32" or
	// "device:HiFi2"); empty when not recorded.
	Numerics string `json:"numerics,omitempty"`
}

// CandidateResult is one candidate's table.
type CandidateResult struct {
	RunInfo
	Rows []Row `json:"rows"`
	// KLQuantiles is the per-position KL over all positions at the
	// fractions 0, 0.01, …, 1 (Accumulator.KLQuantiles), for pictures.
	KLQuantiles Quantiles `json:"kl_quantiles,omitempty"`
}

// Quantiles are KL values; JSON writes an infinite one as null and reads
// null as +Inf.
type Quantiles []float64

// MarshalJSON writes non-finite values as null.
func (q Quantiles) MarshalJSON() ([]byte, error) {
	out := make([]*float64, len(q))
	for i, v := range q {
		out[i] = finite(v)
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads null as +Inf.
func (q *Quantiles) UnmarshalJSON(b []byte) error {
	var in []*float64
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*q = make(Quantiles, len(in))
	for i, p := range in {
		(*q)[i] = math.Inf(1)
		if p != nil {
			(*q)[i] = *p
		}
	}
	return nil
}

// Result is the outcome of an evaluation, ready for JSON (WriteJSON) or a
// Markdown report (WriteMarkdown).
type Result struct {
	SchemaVersion int               `json:"schema_version"`
	Reference     RunInfo           `json:"reference"`
	Candidates    []CandidateResult `json:"candidates"`
	// Vocab is the number of logits per position.
	Vocab int `json:"vocab"`
	// Positions is the number of positions run, scored or not.
	Positions int64 `json:"positions"`
	// Data records where the evaluation text came from (datasets, their
	// digests, windowing), opaque to this package.
	Data any `json:"data,omitempty"`
	// Settings records the evaluation's options, opaque to this package.
	Settings any `json:"settings,omitempty"`
}

// NewResult builds the result of a scorer's run: the reference, one RunInfo
// per candidate (in the scorer's order), and the provenance to record.
func NewResult(ref RunInfo, cands []RunInfo, s *Scorer, data, settings any) (*Result, error) {
	acc := s.Accumulator()
	if len(cands) != acc.Candidates() {
		return nil, fmt.Errorf("eval: %d candidate descriptions for %d candidates", len(cands), acc.Candidates())
	}
	r := &Result{SchemaVersion: SchemaVersion, Reference: ref, Vocab: s.vocab, Positions: s.Positions(), Data: data, Settings: settings}
	for i, c := range cands {
		r.Candidates = append(r.Candidates, CandidateResult{RunInfo: c, Rows: acc.Rows(i), KLQuantiles: acc.KLQuantiles(i, 100)})
	}
	return r, nil
}

// WriteJSON writes the result as indented JSON followed by a newline.
func (r *Result) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("eval: encoding the result: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// rowJSON is Row with nullable numbers.
type rowJSON struct {
	Corpus          string   `json:"corpus"`
	Tokens          int64    `json:"tokens"`
	PPLTokens       int64    `json:"ppl_tokens"`
	RefPPL          *float64 `json:"ref_ppl"`
	CandPPL         *float64 `json:"cand_ppl"`
	DeltaPPLPercent *float64 `json:"delta_ppl_percent"`
	Top1            *float64 `json:"top1_agreement"`
	MeanKL          *float64 `json:"mean_kl"`
	P99KL           *float64 `json:"p99_kl"`
	Windows         int      `json:"windows"`
	DeltaPPLSE      *float64 `json:"delta_ppl_percent_se"`
	Top1SE          *float64 `json:"top1_agreement_se"`
	MeanKLSE        *float64 `json:"mean_kl_se"`
}

func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func orNaN(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// MarshalJSON writes NaN and infinite values as null (JSON has neither).
func (r Row) MarshalJSON() ([]byte, error) {
	return json.Marshal(rowJSON{r.Corpus, r.Tokens, r.PPLTokens, finite(r.RefPPL), finite(r.CandPPL),
		finite(r.DeltaPPLPercent), finite(r.Top1), finite(r.MeanKL), finite(r.P99KL),
		r.Windows, finite(r.DeltaPPLSE), finite(r.Top1SE), finite(r.MeanKLSE)})
}

// UnmarshalJSON reads null numbers as NaN.
func (r *Row) UnmarshalJSON(b []byte) error {
	var j rowJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*r = Row{Corpus: j.Corpus, Tokens: j.Tokens, PPLTokens: j.PPLTokens, RefPPL: orNaN(j.RefPPL), CandPPL: orNaN(j.CandPPL),
		DeltaPPLPercent: orNaN(j.DeltaPPLPercent), Top1: orNaN(j.Top1), MeanKL: orNaN(j.MeanKL), P99KL: orNaN(j.P99KL),
		Windows: j.Windows, DeltaPPLSE: orNaN(j.DeltaPPLSE), Top1SE: orNaN(j.Top1SE), MeanKLSE: orNaN(j.MeanKLSE)}
	return nil
}

// Formatting of table cells: undefined values print as "—", infinite ones
// as "inf".
func fmtNum(v float64, prec int) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// FormatPPL formats a perplexity with 3 decimals.
func FormatPPL(v float64) string { return fmtNum(v, 3) }

// FormatDelta formats a ΔPPL percentage with its sign and 2 decimals.
func FormatDelta(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmtNum(v, 2)
	}
	s := strconv.FormatFloat(v, 'f', 2, 64) + "%"
	if v >= 0 {
		s = "+" + s
	}
	return s
}

// FormatTop1 formats a top-1 agreement fraction with 3 decimals.
func FormatTop1(v float64) string { return fmtNum(v, 3) }

// FormatKL formats a KL divergence in nats with 4 significant digits after
// the leading zeros (at least 4 decimals).
func FormatKL(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) || v == 0 || v >= 1e-3 {
		return fmtNum(v, 4)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// withSE appends " ± se" (formatted by f) to a formatted value when the
// standard error is defined.
func withSE(v string, se float64, f func(float64) string) string {
	if math.IsNaN(se) || math.IsInf(se, 0) {
		return v
	}
	return v + " ± " + f(se)
}

// FormatDeltaSE formats a ΔPPL percentage with its standard error in
// percentage points.
func FormatDeltaSE(v, se float64) string {
	return withSE(FormatDelta(v), se, func(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) })
}

// FormatTop1SE formats a top-1 agreement with its standard error.
func FormatTop1SE(v, se float64) string { return withSE(FormatTop1(v), se, FormatTop1) }

// FormatKLSE formats a mean KL with its standard error.
func FormatKLSE(v, se float64) string {
	return withSE(FormatKL(v), se, func(x float64) string { return strconv.FormatFloat(x, 'g', 2, 64) })
}

// escapeCell makes a string safe inside a Markdown table cell.
func escapeCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ", "\r", " ").Replace(s)
}

// WriteMarkdown writes the published table layout: one table per candidate
// (per corpus: scored tokens, PPL reference → candidate, ΔPPL, top-1
// agreement, mean and p99 KL; ΔPPL, top-1 and mean KL ± their standard
// errors over windows) and, with more than one candidate, a comparison
// table with one column group per candidate.
func (r *Result) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	ref := escapeCell(r.Reference.Label)
	for i, c := range r.Candidates {
		if i > 0 {
			b.WriteByte('\n')
		}
		name := escapeCell(c.Label)
		fmt.Fprintf(&b, "### %s vs %s", name, ref)
		if c.Numerics != "" {
			fmt.Fprintf(&b, " (%s)", escapeCell(c.Numerics))
		}
		b.WriteString("\n\n")
		fmt.Fprintf(&b, "| Corpus | Scored tokens | PPL %s → %s | ΔPPL | Top-1 | Mean KL | p99 KL |\n", ref, name)
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
		for _, row := range c.Rows {
			fmt.Fprintf(&b, "| %s | %d | %s → %s | %s | %s | %s | %s |\n", corpusCell(row.Corpus, c.Rows),
				row.Tokens, FormatPPL(row.RefPPL), FormatPPL(row.CandPPL), FormatDeltaSE(row.DeltaPPLPercent, row.DeltaPPLSE),
				FormatTop1SE(row.Top1, row.Top1SE), FormatKLSE(row.MeanKL, row.MeanKLSE), FormatKL(row.P99KL))
		}
	}
	if len(r.Candidates) > 1 {
		b.WriteString("\n### Comparison\n\n")
		b.WriteString("| Corpus | Scored tokens | PPL " + ref)
		for _, c := range r.Candidates {
			n := escapeCell(c.Label)
			fmt.Fprintf(&b, " | %s PPL | %s ΔPPL | %s top-1 | %s mean KL | %s p99 KL", n, n, n, n, n)
		}
		b.WriteString(" |\n|---|---:|---:")
		b.WriteString(strings.Repeat("|---:|---:|---:|---:|---:", len(r.Candidates)))
		b.WriteString("|\n")
		first := r.Candidates[0].Rows
		for j, row := range first {
			fmt.Fprintf(&b, "| %s | %d | %s", corpusCell(row.Corpus, first), row.Tokens, FormatPPL(row.RefPPL))
			for _, c := range r.Candidates {
				cr := c.Rows[j]
				fmt.Fprintf(&b, " | %s | %s | %s | %s | %s", FormatPPL(cr.CandPPL), FormatDeltaSE(cr.DeltaPPLPercent, cr.DeltaPPLSE),
					FormatTop1SE(cr.Top1, cr.Top1SE), FormatKLSE(cr.MeanKL, cr.MeanKLSE), FormatKL(cr.P99KL))
			}
			b.WriteString(" |\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// corpusCell prints the last row (the one covering every position) in bold.
func corpusCell(label string, rows []Row) string {
	if len(rows) > 0 && rows[len(rows)-1].Corpus == label {
		return "**" + escapeCell(label) + "**"
	}
	return escapeCell(label)
}
