package eval

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
)

// logSoftmax is the textbook float64 log-softmax.
func logSoftmax(x []float32) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, float64(v))
	}
	s := 0.0
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	lse := m + math.Log(s)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - lse
	}
	return out
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// direct computes KL(ref‖cand), both arg-maxes and both NLLs the textbook way.
func direct(ref, cand []float32, target int) (kl float64, rTop, cTop int, rNLL, cNLL float64) {
	lr, lc := logSoftmax(ref), logSoftmax(cand)
	for i := range lr {
		if p := math.Exp(lr[i]); p != 0 {
			kl += p * (lr[i] - lc[i])
		}
	}
	rNLL, cNLL = math.NaN(), math.NaN()
	if target >= 0 {
		rNLL, cNLL = -lr[target], -lc[target]
	}
	return kl, argmax(ref), argmax(cand), rNLL, cNLL
}

func near(a, b, tol float64) bool {
	if math.IsInf(a, 0) || math.IsInf(b, 0) || math.IsNaN(a) || math.IsNaN(b) {
		return a == b || math.IsNaN(a) && math.IsNaN(b)
	}
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

func randRow(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

func TestCompareTokenAgainstDirect(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		v := 2 + r.IntN(500)
		ref := randRow(r, v, 1+5*r.Float64())
		cand := make([]float32, v)
		for i := range cand {
			cand[i] = ref[i] + float32(r.NormFloat64()*0.4)
		}
		target := r.IntN(v+1) - 1
		q, err := CompareToken(ref, cand, target)
		if err != nil {
			t.Fatal(err)
		}
		kl, rt, ct, rn, cn := direct(ref, cand, target)
		if !near(q.KL, kl, 1e-9) || q.RefTop1 != rt || q.CandTop1 != ct || !near(q.RefNLL, rn, 1e-12) || !near(q.CandNLL, cn, 1e-12) {
			t.Fatalf("trial %d: got %+v, direct KL %g top1 %d/%d NLL %g/%g", trial, q, kl, rt, ct, rn, cn)
		}
	}
}

// testData is a random evaluation: n positions, k candidates.
type testData struct {
	vocab   int
	ref     []float32
	cands   [][]float32
	targets []int32
	mask    []bool
	labels  []string
}

func makeData(r *rand.Rand, n, vocab int, noise []float64) testData {
	d := testData{vocab: vocab, ref: randRow(r, n*vocab, 3), targets: make([]int32, n), mask: make([]bool, n), labels: make([]string, n)}
	for _, s := range noise {
		c := make([]float32, len(d.ref))
		for i := range c {
			c[i] = d.ref[i] + float32(r.NormFloat64()*s)
		}
		d.cands = append(d.cands, c)
	}
	for i := 0; i < n; i++ {
		d.targets[i] = int32(r.IntN(vocab))
		if r.IntN(10) == 0 {
			d.targets[i] = -1
		}
		d.mask[i] = r.IntN(5) != 0
		d.labels[i] = []string{"chat", "code", "book", ""}[r.IntN(4)]
	}
	return d
}

// score runs the data through a scorer in batches of the given size.
func (d testData) score(t *testing.T, batch, workers int, names []string) *Scorer {
	t.Helper()
	s, err := NewScorer(d.vocab, names, ScorerOptions{Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	n := len(d.targets)
	v := d.vocab
	for lo := 0; lo < n; lo += batch {
		hi := min(lo+batch, n)
		b := Batch{Ref: d.ref[lo*v : hi*v], Targets: d.targets[lo:hi], Mask: d.mask[lo:hi], Corpus: d.labels[lo:hi]}
		for _, c := range d.cands {
			b.Cands = append(b.Cands, c[lo*v:hi*v])
		}
		if err := s.Score(b); err != nil {
			t.Fatal(err)
		}
	}
	if s.Positions() != int64(n) {
		t.Fatalf("%d positions, want %d", s.Positions(), n)
	}
	return s
}

func TestScorerAgainstDirect(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n, vocab = 203, 97
	d := makeData(r, n, vocab, []float64{0.1, 0.6})
	names := []string{"small", "large"}

	// Direct computation, per candidate and corpus.
	type agg struct {
		n, np, agree, rnll, cnll, kl float64
		kls                          []float64
	}
	want := make([]map[string]*agg, len(names))
	for k := range names {
		want[k] = map[string]*agg{"chat": {}, "code": {}, "book": {}, AllCorpus: {}}
		for i := 0; i < n; i++ {
			if !d.mask[i] {
				continue
			}
			kl, rt, ct, rn, cn := direct(d.ref[i*vocab:(i+1)*vocab], d.cands[k][i*vocab:(i+1)*vocab], int(d.targets[i]))
			for _, l := range []string{d.labels[i], AllCorpus} {
				if l == "" {
					continue
				}
				a := want[k][l]
				a.n++
				a.kl += kl
				a.kls = append(a.kls, kl)
				if rt == ct {
					a.agree++
				}
				if d.targets[i] >= 0 {
					a.np++
					a.rnll += rn
					a.cnll += cn
				}
			}
		}
	}

	var first string
	for _, batch := range []int{1, 7, n} {
		for _, workers := range []int{1, 3} {
			s := d.score(t, batch, workers, names)
			acc := s.Accumulator()
			got := fmt.Sprintf("%+v %+v", acc.Rows(0), acc.Rows(1))
			if first == "" {
				first = got
			} else if got != first {
				t.Fatalf("batch %d, workers %d: result differs:\n%s\n%s", batch, workers, got, first)
			}
		}
	}
	s := d.score(t, 16, 2, names)
	for k := range names {
		rows := s.Accumulator().Rows(k)
		if len(rows) != 4 || rows[0].Corpus != "book" || rows[1].Corpus != "chat" || rows[2].Corpus != "code" || rows[3].Corpus != AllCorpus {
			t.Fatalf("rows %+v", rows)
		}
		for _, row := range rows {
			a := want[k][row.Corpus]
			sort.Float64s(a.kls)
			p99 := a.kls[int(math.Ceil(0.99*a.n))-1]
			rp, cp := math.Exp(a.rnll/a.np), math.Exp(a.cnll/a.np)
			if row.Tokens != int64(a.n) || row.PPLTokens != int64(a.np) || !near(row.Top1, a.agree/a.n, 1e-15) ||
				!near(row.MeanKL, a.kl/a.n, 1e-9) || !near(row.P99KL, p99, 1e-9) || !near(row.RefPPL, rp, 1e-12) ||
				!near(row.CandPPL, cp, 1e-12) || !near(row.DeltaPPLPercent, 100*(cp/rp-1), 1e-9) {
				t.Errorf("%s/%s: got %+v, direct n %v np %v top1 %v KL %v p99 %v PPL %v/%v", names[k], row.Corpus, row, a.n, a.np, a.agree/a.n, a.kl/a.n, p99, rp, cp)
			}
			if row.MeanKL <= 0 || row.P99KL <= row.MeanKL/2 {
				t.Errorf("%s/%s: noisy candidate scored as identical: %+v", names[k], row.Corpus, row)
			}
		}
	}
}

func TestIdenticalCandidateExact(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const n, vocab = 64, 4099
	d := makeData(r, n, vocab, []float64{0.05})
	// Wide logits with −Inf entries and targets with low probability.
	ninf := float32(math.Inf(-1))
	for i := range d.ref {
		d.ref[i] *= 7
		if r.IntN(50) == 0 {
			d.ref[i] = ninf
		}
	}
	for i := range d.targets {
		if d.targets[i] >= 0 && d.ref[i*vocab+int(d.targets[i])] == ninf {
			d.ref[i*vocab+int(d.targets[i])] = 0
		}
	}
	d.cands = [][]float32{d.ref, d.cands[0], append([]float32(nil), d.ref...)}
	s := d.score(t, 5, 2, []string{"self", "noisy", "copy"})
	for _, k := range []int{0, 2} {
		for _, row := range s.Accumulator().Rows(k) {
			if row.DeltaPPLPercent != 0 || row.Top1 != 1 || row.MeanKL != 0 || row.P99KL != 0 || row.RefPPL != row.CandPPL {
				t.Errorf("candidate %d, %s: %+v", k, row.Corpus, row)
			}
		}
	}
	for _, row := range s.Accumulator().Rows(1) {
		if row.MeanKL == 0 {
			t.Errorf("noisy candidate, %s: KL 0", row.Corpus)
		}
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for _, c := range []struct {
		p    int
		want float64
	}{{1, 1}, {20, 1}, {21, 2}, {50, 3}, {99, 5}, {100, 5}} {
		if got := Percentile(xs, c.p); got != c.want {
			t.Errorf("p%d = %v, want %v", c.p, got, c.want)
		}
	}
	if xs[0] != 5 {
		t.Error("input sorted in place")
	}
	big := make([]float64, 1000)
	for i := range big {
		big[i] = float64(999 - i)
	}
	if got := Percentile(big, 99); got != 989 { // rank 990 of 0..999
		t.Errorf("p99 of 0..999 = %v, want 989", got)
	}
	if !math.IsNaN(Percentile(nil, 99)) || !math.IsNaN(Percentile(xs, 0)) || !math.IsNaN(Percentile(xs, 101)) {
		t.Error("undefined percentile not NaN")
	}
	if got := Percentile([]float64{1, math.Inf(1)}, 99); !math.IsInf(got, 1) {
		t.Errorf("p99 with an infinite KL = %v", got)
	}
}

func TestScorerErrors(t *testing.T) {
	s, err := NewScorer(3, []string{"a"}, ScorerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ok := []float32{1, 2, 3, 4, 5, 6}
	for _, c := range []struct {
		b    Batch
		want string
	}{
		{Batch{Ref: ok[:5], Cands: [][]float32{ok[:5]}}, "not whole rows"},
		{Batch{Ref: ok, Cands: nil}, "0 candidates, want 1"},
		{Batch{Ref: ok, Cands: [][]float32{ok[:3]}}, `candidate "a" has 3 logits`},
		{Batch{Ref: ok, Cands: [][]float32{ok}, Targets: []int32{1}}, "1 targets for 2 positions"},
		{Batch{Ref: ok, Cands: [][]float32{ok}, Targets: []int32{1, 3}}, "target 3 outside the vocabulary of 3"},
		{Batch{Ref: ok, Cands: [][]float32{ok}, Mask: []bool{true}}, "score mask of 1 entries"},
		{Batch{Ref: ok, Cands: [][]float32{ok}, Corpus: []string{"a", "b", "c"}}, "3 corpus labels"},
		{Batch{Ref: ok, Cands: [][]float32{ok}, Corpus: []string{AllCorpus}}, "reserved"},
		{Batch{Ref: ok, Cands: [][]float32{{1, 2, 3, 4, float32(math.NaN()), 6}}}, `position 1, candidate "a": candidate logits: NaN at vocabulary index 1`},
	} {
		err := s.Score(c.b)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
	if s.Positions() != 0 || s.Accumulator().Rows(0)[0].Tokens != 0 {
		t.Error("a refused batch was counted")
	}
	// A masked-out position is not checked: its logits are never read.
	if err := s.Score(Batch{Ref: []float32{1, 2, 3, float32(math.NaN()), 0, 0}, Cands: [][]float32{ok}, Mask: []bool{true, false}}); err != nil {
		t.Errorf("masked NaN row: %v", err)
	}
	var pe *PositionError
	err = s.Score(Batch{Ref: []float32{1, 2, float32(math.Inf(1))}, Cands: [][]float32{ok[:3]}})
	if !errors.As(err, &pe) || pe.Position != 2 || pe.Candidate != "" || !errors.Is(err, ErrBadLogits) {
		t.Errorf("reference +Inf: %v", err)
	}
	if _, err := NewScorer(0, []string{"a"}, ScorerOptions{}); err == nil {
		t.Error("empty vocabulary accepted")
	}
	if _, err := NewScorer(3, nil, ScorerOptions{}); err == nil {
		t.Error("no candidates accepted")
	}
}

func TestAccumulatorOrder(t *testing.T) {
	a, err := NewAccumulator(1, "")
	if err != nil {
		t.Fatal(err)
	}
	q := []TokenQuality{{KL: 0.5, RefNLL: 1, CandNLL: 2}}
	for _, l := range []string{"zeta", "code", "alpha"} {
		if err := a.Add(q, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.SetOrder([]string{"chat", "code"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range a.Rows(0) {
		got = append(got, fmt.Sprintf("%s:%d", r.Corpus, r.Tokens))
	}
	if strings.Join(got, " ") != "chat:0 code:1 alpha:1 zeta:1 all:3" {
		t.Errorf("rows %v", got)
	}
	if err := a.SetOrder([]string{"x", "x"}); err == nil {
		t.Error("repeated label accepted")
	}
	if err := a.Add(q, "all"); err == nil {
		t.Error("reserved label accepted")
	}
}

func TestResultJSONAndMarkdown(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	d := makeData(r, 40, 31, []float64{0.2, 0.3})
	s := d.score(t, 8, 2, []string{"RTN", "GPTQ"})
	s.Accumulator().SetOrder([]string{"chat", "code", "book"})
	type ident struct {
		Digest string `json:"digest"`
	}
	res, err := NewResult(RunInfo{Label: "BF16", Identity: ident{"src"}},
		[]RunInfo{{Label: "RTN", Identity: ident{"aa"}, Numerics: "cpu"}, {Label: "GPTQ", Identity: ident{"bb"}, Numerics: "device:HiFi2"}},
		s, map[string]string{"eval": "eval-dev.jsonl"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewResult(RunInfo{}, []RunInfo{{}}, s, nil, nil); err == nil {
		t.Error("wrong number of candidates accepted")
	}
	var buf bytes.Buffer
	if err := res.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if raw["schema_version"] != float64(SchemaVersion) || raw["data"].(map[string]any)["eval"] != "eval-dev.jsonl" {
		t.Errorf("json: %s", buf.String())
	}
	if id := raw["candidates"].([]any)[1].(map[string]any)["identity"].(map[string]any)["digest"]; id != "bb" {
		t.Errorf("candidate identity %v", id)
	}
	var back Result
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(back.Candidates[1].Rows) != fmt.Sprint(res.Candidates[1].Rows) {
		t.Errorf("rows changed through JSON:\n%v\n%v", back.Candidates[1].Rows, res.Candidates[1].Rows)
	}

	// An empty corpus row has undefined values: null in JSON.
	empty, _ := json.Marshal(Row{Corpus: "x", RefPPL: math.NaN(), CandPPL: math.Inf(1), DeltaPPLPercent: math.NaN(), Top1: math.NaN(), MeanKL: math.NaN(), P99KL: math.NaN()})
	if !strings.Contains(string(empty), `"ref_ppl":null`) || !strings.Contains(string(empty), `"cand_ppl":null`) {
		t.Errorf("undefined values: %s", empty)
	}

	buf.Reset()
	if err := res.WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	lines := strings.Split(md, "\n")
	var tables [][]string
	for i := 0; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "| Corpus") {
			j := i
			for j < len(lines) && strings.HasPrefix(lines[j], "|") {
				j++
			}
			tables = append(tables, lines[i:j])
			i = j
		}
	}
	if len(tables) != 3 {
		t.Fatalf("%d tables:\n%s", len(tables), md)
	}
	all := res.Candidates[1].Rows[3]
	wantAll := fmt.Sprintf("| **all** | %d | %s → %s | %s | %s | %s | %s |", all.Tokens, FormatPPL(all.RefPPL), FormatPPL(all.CandPPL),
		FormatDelta(all.DeltaPPLPercent), FormatTop1(all.Top1), FormatKL(all.MeanKL), FormatKL(all.P99KL))
	if tables[1][0] != "| Corpus | Scored tokens | PPL BF16 → GPTQ | ΔPPL | Top-1 | Mean KL | p99 KL |" || len(tables[1]) != 6 ||
		!strings.HasPrefix(tables[1][2], "| chat |") || tables[1][5] != wantAll {
		t.Errorf("GPTQ table:\n%s\nwant last row %s", strings.Join(tables[1], "\n"), wantAll)
	}
	if !strings.Contains(md, "### GPTQ vs BF16 (device:HiFi2)") {
		t.Errorf("heading missing:\n%s", md)
	}
	cmp := tables[2]
	if n := strings.Count(cmp[0], "|") - 1; n != 3+2*5 || strings.Count(cmp[1], "|")-1 != n || len(cmp) != 6 {
		t.Errorf("comparison table:\n%s", strings.Join(cmp, "\n"))
	}
	for _, l := range cmp[2:] {
		if strings.Count(l, "|")-1 != 13 {
			t.Errorf("comparison row %q", l)
		}
	}
	if !strings.Contains(cmp[0], "| RTN PPL | RTN ΔPPL | RTN top-1 | RTN mean KL | RTN p99 KL | GPTQ PPL |") {
		t.Errorf("comparison header %q", cmp[0])
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{FormatDelta(0.4449), "+0.44%"},
		{FormatDelta(-1.5), "-1.50%"},
		{FormatDelta(0), "+0.00%"},
		{FormatDelta(math.NaN()), "—"},
		{FormatKL(0.0057), "0.0057"},
		{FormatKL(0.00057123), "0.000571"},
		{FormatKL(0), "0.0000"},
		{FormatKL(math.Inf(1)), "inf"},
		{FormatTop1(0.9412), "0.941"},
		{FormatPPL(33.2), "33.200"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
