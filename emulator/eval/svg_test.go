package eval

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
)

// parseSVG checks that b is well-formed XML with an svg root and counts
// its elements by name.
func parseSVG(t *testing.T, b []byte) map[string]int {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	count := map[string]int{}
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v\n%s", err, b)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			count[se.Name.Local]++
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return count
}

// TestWriteSVG: a two-candidate result draws a bar and an error bar per
// corpus and candidate and one distribution line per candidate, as XML.
func TestWriteSVG(t *testing.T) {
	mk := func(kl, se float64) []Row {
		return []Row{{Corpus: "code", MeanKL: kl, MeanKLSE: se}, {Corpus: "prose", MeanKL: 2 * kl, MeanKLSE: se}, {Corpus: "all", MeanKL: 1.5 * kl, MeanKLSE: se / 2}}
	}
	q := func(s float64) Quantiles {
		out := make(Quantiles, 101)
		for k := range out {
			out[k] = s * math.Exp(float64(k)/20)
		}
		out[0] = 0
		return out
	}
	r := &Result{Candidates: []CandidateResult{
		{RunInfo: RunInfo{Label: "RTN & co"}, Rows: mk(0.0065, 0.0002), KLQuantiles: q(1e-4)},
		{RunInfo: RunInfo{Label: "GPTQ"}, Rows: mk(0.0053, 0.0002), KLQuantiles: q(8e-5)},
	}}
	var b bytes.Buffer
	if err := r.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	n := parseSVG(t, b.Bytes())
	// The background, 6 bars, 4 legend swatches.
	if n["rect"] != 1+6+4 || n["polyline"] != 2 || n["line"] < 6*3 {
		t.Errorf("elements %v", n)
	}
	if !strings.Contains(b.String(), "RTN &amp; co") {
		t.Error("a label is not escaped")
	}
	b.Reset()
	err := WriteLineSVG(&b, LineChart{Title: "per layer", XLabel: "layer", YLabel: "error", X: []float64{0, 1, 2}, LogY: true,
		Series: []Series{{Name: "GPTQ", Y: []float64{1e-3, 2e-3, 3e-3}}, {Name: "RTN", Y: []float64{5e-3, 4e-3, 6e-3}}}})
	if err != nil {
		t.Fatal(err)
	}
	if n := parseSVG(t, b.Bytes()); n["polyline"] != 2 || n["circle"] != 6 {
		t.Errorf("line chart elements %v", n)
	}
	if err := WriteLineSVG(&b, LineChart{X: []float64{0}, LogY: true, Series: []Series{{Name: "x", Y: []float64{0}}}}); err == nil {
		t.Error("a zero on a log axis is drawn")
	}
}

// TestWriteXYSVG: the curve is one polyline, each point a circle with its
// label, and values that cannot be drawn are refused.
func TestWriteXYSVG(t *testing.T) {
	c := XYChart{Title: "t", XLabel: "x", YLabel: "y", CurveName: "curve",
		CurveX: []float64{1, 2, 3}, CurveY: []float64{3, 1, 0.5},
		Points: []XYPoint{{"selected", 2, 1}, {"uniform", 3, 2}}}
	var b bytes.Buffer
	if err := WriteXYSVG(&b, c); err != nil {
		t.Fatal(err)
	}
	n := parseSVG(t, b.Bytes())
	if n["polyline"] != 1 || n["circle"] != 2 || !strings.Contains(b.String(), ">selected<") || !strings.Contains(b.String(), ">uniform<") {
		t.Errorf("elements %v\n%s", n, b.String())
	}
	c.Points[0].Y = math.NaN()
	if err := WriteXYSVG(io.Discard, c); err == nil {
		t.Error("a NaN point was drawn")
	}
	if err := WriteXYSVG(io.Discard, XYChart{CurveX: []float64{1}}); err == nil {
		t.Error("a curve with more x than y values was drawn")
	}
}
