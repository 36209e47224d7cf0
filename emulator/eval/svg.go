package eval

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Pictures of results as standalone SVG 1.1 documents: WriteSVG draws an
// evaluation (per-corpus mean KL with error bars, the distribution of the
// per-position KL of each candidate), WriteLineSVG any few series over a
// common x axis (the demo's per-layer errors), WriteXYSVG a curve with
// labelled points (the precision selection's Pareto curve).

// palette colours the candidates or series in order.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

func colour(i int) string { return palette[i%len(palette)] }

// svg accumulates the elements of one document.
type svg struct {
	b    strings.Builder
	w, h int
}

func newSVG(w, h int) *svg {
	s := &svg{w: w, h: h}
	fmt.Fprintf(&s.b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&s.b, `<rect x="0" y="0" width="%d" height="%d" fill="white"/>`+"\n", w, h)
	return s
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

func (s *svg) text(x, y float64, anchor, str string, extra string) {
	fmt.Fprintf(&s.b, `<text x="%s" y="%s" text-anchor="%s"%s>%s</text>`+"\n", f2(x), f2(y), anchor, extra, xmlEscape(str))
}

func (s *svg) line(x1, y1, x2, y2 float64, stroke string, width float64) {
	fmt.Fprintf(&s.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="%s"/>`+"\n", f2(x1), f2(y1), f2(x2), f2(y2), stroke, f2(width))
}

func (s *svg) rect(x, y, w, h float64, fill string) {
	fmt.Fprintf(&s.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", f2(x), f2(y), f2(w), f2(h), fill)
}

func (s *svg) polyline(xs, ys []float64, stroke string) {
	var pts []string
	for i := range xs {
		pts = append(pts, f2(xs[i])+","+f2(ys[i]))
	}
	fmt.Fprintf(&s.b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), stroke)
}

func (s *svg) finish(w io.Writer) error {
	s.b.WriteString("</svg>\n")
	_, err := io.WriteString(w, s.b.String())
	return err
}

// axis maps data values to pixels, linearly or logarithmically.
type axis struct {
	lo, hi   float64 // data range
	p0, p1   float64 // pixel range
	log      bool
	ticks    []float64
	tickText func(float64) string
}

func (a *axis) at(v float64) float64 {
	lo, hi := a.lo, a.hi
	if a.log {
		v, lo, hi = math.Log10(v), math.Log10(lo), math.Log10(hi)
	}
	if hi == lo {
		return (a.p0 + a.p1) / 2
	}
	return a.p0 + (v-lo)/(hi-lo)*(a.p1-a.p0)
}

// newAxis makes an axis over [lo, hi] with about five round ticks (powers
// of ten on a log axis).
func newAxis(lo, hi, p0, p1 float64, log bool) *axis {
	a := &axis{p0: p0, p1: p1, log: log}
	if log {
		lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
		if lo == hi {
			hi = lo * 10
		}
		for v := lo; v <= hi*1.0001; v *= 10 {
			a.ticks = append(a.ticks, v)
		}
		a.tickText = func(v float64) string { return strconv.FormatFloat(v, 'g', 1, 64) }
		a.lo, a.hi = lo, hi
		return a
	}
	if hi <= lo {
		hi = lo + 1
	}
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 6 {
			step *= m
			break
		}
	}
	lo, hi = math.Floor(lo/step)*step, math.Ceil(hi/step)*step
	for v := lo; v <= hi+step/2; v += step {
		a.ticks = append(a.ticks, v)
	}
	a.tickText = func(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }
	a.lo, a.hi = lo, hi
	return a
}

// frame draws a plot area with its axes, ticks, labels and title; x may be
// nil (category axis drawn by the caller).
func (s *svg) frame(x, y *axis, left, top, right, bottom float64, title, xlabel, ylabel string) {
	s.line(left, bottom, right, bottom, "black", 1)
	s.line(left, top, left, bottom, "black", 1)
	for _, t := range y.ticks {
		py := y.at(t)
		s.line(left-4, py, left, py, "black", 1)
		s.line(left, py, right, py, "#e0e0e0", 0.5)
		s.text(left-6, py+4, "end", y.tickText(t), "")
	}
	if x != nil {
		for _, t := range x.ticks {
			px := x.at(t)
			s.line(px, bottom, px, bottom+4, "black", 1)
			s.text(px, bottom+16, "middle", x.tickText(t), "")
		}
	}
	s.text((left+right)/2, top-10, "middle", title, ` font-weight="bold"`)
	s.text((left+right)/2, bottom+34, "middle", xlabel, "")
	s.text(left-48, (top+bottom)/2, "middle", ylabel, fmt.Sprintf(` transform="rotate(-90 %s %s)"`, f2(left-48), f2((top+bottom)/2)))
}

// legend lists names with their colours from (x, y) down.
func (s *svg) legend(x, y float64, names []string) {
	for i, n := range names {
		s.rect(x, y+float64(i)*16-9, 10, 10, colour(i))
		s.text(x+14, y+float64(i)*16, "start", n, "")
	}
}

// WriteSVG draws the result: on the left, every corpus's mean KL of each
// candidate as a bar with ± one standard error; on the right, the
// distribution of each candidate's per-position KL over all positions (the
// fraction of positions at or below a KL, on a logarithmic KL axis).
func (r *Result) WriteSVG(w io.Writer) error {
	if len(r.Candidates) == 0 {
		return fmt.Errorf("eval: no candidate to draw")
	}
	s := newSVG(1000, 420)
	var names []string
	for _, c := range r.Candidates {
		names = append(names, c.Label)
	}
	// Left: bars.
	left, top, right, bottom := 80.0, 40.0, 480.0, 340.0
	rows := r.Candidates[0].Rows
	hi := 0.0
	for _, c := range r.Candidates {
		for _, row := range c.Rows {
			if v := row.MeanKL + orZero(row.MeanKLSE); v > hi && !math.IsInf(v, 0) {
				hi = v
			}
		}
	}
	y := newAxis(0, hi, bottom, top, false)
	s.frame(nil, y, left, top, right, bottom, "mean KL per corpus (± 1 standard error)", "corpus", "mean KL (nats)")
	group := (right - left) / float64(len(rows))
	bar := group * 0.7 / float64(len(r.Candidates))
	for j, row := range rows {
		g0 := left + float64(j)*group + group*0.15
		s.text(g0+group*0.35, bottom+16, "middle", row.Corpus, "")
		for i, c := range r.Candidates {
			cr := c.Rows[j]
			if math.IsNaN(cr.MeanKL) || math.IsInf(cr.MeanKL, 0) {
				continue
			}
			x0 := g0 + float64(i)*bar
			s.rect(x0, y.at(cr.MeanKL), bar*0.9, bottom-y.at(cr.MeanKL), colour(i))
			if se := cr.MeanKLSE; !math.IsNaN(se) && !math.IsInf(se, 0) {
				xc := x0 + bar*0.45
				s.line(xc, y.at(cr.MeanKL-se), xc, y.at(cr.MeanKL+se), "black", 1.5)
				s.line(xc-4, y.at(cr.MeanKL-se), xc+4, y.at(cr.MeanKL-se), "black", 1.5)
				s.line(xc-4, y.at(cr.MeanKL+se), xc+4, y.at(cr.MeanKL+se), "black", 1.5)
			}
		}
	}
	s.legend(left+10, top+14, names)
	// Right: distributions.
	left, right = 580.0, 980.0
	lo, top2 := math.Inf(1), 0.0
	for _, c := range r.Candidates {
		for _, q := range c.KLQuantiles {
			if q > 0 && q < lo {
				lo = q
			}
			top2 = max(top2, q)
		}
	}
	if math.IsInf(lo, 1) || top2 <= 0 {
		lo, top2 = 1e-6, 1
	}
	x := newAxis(lo, top2, left, right, true)
	yc := newAxis(0, 1, bottom, top, false)
	s.frame(x, yc, left, top, right, bottom, "per-position KL, all positions", "KL (nats, log scale)", "fraction of positions ≤ KL")
	for i, c := range r.Candidates {
		var xs, ys []float64
		n := len(c.KLQuantiles)
		for k, q := range c.KLQuantiles {
			if q <= 0 {
				continue
			}
			xs = append(xs, x.at(math.Min(math.Max(q, x.lo), x.hi)))
			ys = append(ys, yc.at(float64(k)/float64(n-1)))
		}
		if len(xs) > 1 {
			s.polyline(xs, ys, colour(i))
		}
	}
	s.legend(left+10, top+14, names)
	return s.finish(w)
}

func orZero(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// LineChart is a few series over a common x axis.
type LineChart struct {
	Title, XLabel, YLabel string
	X                     []float64
	Series                []Series
	// LogY draws the y axis logarithmically (every value must be > 0).
	LogY bool
}

// Series is one named line of a LineChart.
type Series struct {
	Name string
	Y    []float64
}

// WriteLineSVG draws a LineChart: each series as a line with its points
// marked.
func WriteLineSVG(w io.Writer, c LineChart) error {
	if len(c.X) == 0 || len(c.Series) == 0 {
		return fmt.Errorf("eval: an empty chart")
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, sr := range c.Series {
		if len(sr.Y) != len(c.X) {
			return fmt.Errorf("eval: series %q has %d values for %d x values", sr.Name, len(sr.Y), len(c.X))
		}
		for _, v := range sr.Y {
			if math.IsNaN(v) || math.IsInf(v, 0) || c.LogY && v <= 0 {
				return fmt.Errorf("eval: series %q: value %v cannot be drawn", sr.Name, v)
			}
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	s := newSVG(640, 420)
	left, top, right, bottom := 90.0, 40.0, 600.0, 340.0
	xlo, xhi := c.X[0], c.X[0]
	for _, v := range c.X {
		xlo, xhi = min(xlo, v), max(xhi, v)
	}
	x := newAxis(xlo, xhi, left+20, right-20, false)
	if !c.LogY {
		lo = min(lo, 0)
	}
	y := newAxis(lo, hi, bottom, top, c.LogY)
	s.frame(x, y, left, top, right, bottom, c.Title, c.XLabel, c.YLabel)
	var names []string
	for i, sr := range c.Series {
		xs, ys := make([]float64, len(c.X)), make([]float64, len(c.X))
		for k := range c.X {
			xs[k], ys[k] = x.at(c.X[k]), y.at(sr.Y[k])
			fmt.Fprintf(&s.b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", f2(xs[k]), f2(ys[k]), colour(i))
		}
		s.polyline(xs, ys, colour(i))
		names = append(names, sr.Name)
	}
	s.legend(right-200, top+14, names)
	return s.finish(w)
}

// XYChart is a curve over its own x values with a few labelled points
// (the selection's Pareto curve with the plans it is compared with).
type XYChart struct {
	Title, XLabel, YLabel string
	// Curve is drawn as a line through its points, named CurveName.
	CurveName string
	CurveX    []float64
	CurveY    []float64
	Points    []XYPoint
}

// XYPoint is one labelled point of an XYChart.
type XYPoint struct {
	Label string
	X, Y  float64
}

// WriteXYSVG draws an XYChart: the curve, then each point with its label
// in the legend.
func WriteXYSVG(w io.Writer, c XYChart) error {
	if len(c.CurveX) != len(c.CurveY) {
		return fmt.Errorf("eval: curve has %d x and %d y values", len(c.CurveX), len(c.CurveY))
	}
	if len(c.CurveX) == 0 && len(c.Points) == 0 {
		return fmt.Errorf("eval: an empty chart")
	}
	xs, ys := append([]float64(nil), c.CurveX...), append([]float64(nil), c.CurveY...)
	for _, p := range c.Points {
		xs, ys = append(xs, p.X), append(ys, p.Y)
	}
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), 0.0, math.Inf(-1)
	for i := range xs {
		if math.IsNaN(xs[i]) || math.IsInf(xs[i], 0) || math.IsNaN(ys[i]) || math.IsInf(ys[i], 0) {
			return fmt.Errorf("eval: point (%v, %v) cannot be drawn", xs[i], ys[i])
		}
		xlo, xhi, ylo, yhi = min(xlo, xs[i]), max(xhi, xs[i]), min(ylo, ys[i]), max(yhi, ys[i])
	}
	s := newSVG(900, 440)
	left, top, right, bottom := 90.0, 40.0, 560.0, 360.0
	x := newAxis(xlo, xhi, left+10, right-10, false)
	y := newAxis(ylo, yhi, bottom, top, false)
	s.frame(x, y, left, top, right, bottom, c.Title, c.XLabel, c.YLabel)
	px, py := make([]float64, len(c.CurveX)), make([]float64, len(c.CurveX))
	for i := range c.CurveX {
		px[i], py[i] = x.at(c.CurveX[i]), y.at(c.CurveY[i])
	}
	var names []string
	if len(px) > 0 {
		s.polyline(px, py, colour(0))
		names = append(names, c.CurveName)
	}
	for i, p := range c.Points {
		fmt.Fprintf(&s.b, `<circle cx="%s" cy="%s" r="5" fill="%s"/>`+"\n", f2(x.at(p.X)), f2(y.at(p.Y)), colour(i+1))
		names = append(names, p.Label)
	}
	if len(px) == 0 {
		// No curve: the legend's colours start at the points'.
		names = append([]string{""}, names...)
	}
	s.legend(right+20, top+14, names)
	return s.finish(w)
}
