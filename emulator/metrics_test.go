package emulator

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/safetensors"
)

// directToken computes the per-token quantities the textbook way, in
// float64: log-softmax of each row, then KL as Σ p_ref·(log p_ref − log
// p_cand) over the tokens with p_ref > 0.
func directToken(ref, cand []float32, target int) (kl float64, rTop, cTop int, rNLL, cNLL float64) {
	logSoftmax := func(x []float32) []float64 {
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
	argmax := func(x []float32) int {
		best := 0
		for i, v := range x {
			if v > x[best] {
				best = i
			}
		}
		return best
	}
	lr, lc := logSoftmax(ref), logSoftmax(cand)
	for i := range lr {
		p := math.Exp(lr[i])
		if p == 0 {
			continue
		}
		kl += p * (lr[i] - lc[i])
	}
	rNLL, cNLL = math.NaN(), math.NaN()
	if target >= 0 {
		rNLL, cNLL = -lr[target], -lc[target]
	}
	return kl, argmax(ref), argmax(cand), rNLL, cNLL
}

func approxEq(a, b, tol float64) bool {
	if math.IsInf(a, 0) || math.IsInf(b, 0) || math.IsNaN(a) || math.IsNaN(b) {
		return a == b || math.IsNaN(a) && math.IsNaN(b)
	}
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

func randLogits(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

func TestCompareTokenAgainstDirect(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 200; trial++ {
		v := 2 + r.IntN(300)
		ref := randLogits(r, v, 1+4*r.Float64())
		cand := make([]float32, v)
		for i := range cand {
			cand[i] = ref[i] + float32(r.NormFloat64()*0.3)
		}
		target := r.IntN(v+1) - 1
		q, err := CompareToken(ref, cand, target)
		if err != nil {
			t.Fatal(err)
		}
		kl, rt, ct, rn, cn := directToken(ref, cand, target)
		if !approxEq(q.KL, kl, 1e-9) || q.RefTop1 != rt || q.CandTop1 != ct || !approxEq(q.RefNLL, rn, 1e-12) || !approxEq(q.CandNLL, cn, 1e-12) {
			t.Fatalf("trial %d: got %+v, direct KL %g top1 %d/%d NLL %g/%g", trial, q, kl, rt, ct, rn, cn)
		}
		if q.KL <= 0 {
			t.Fatalf("trial %d: KL %g of different distributions", trial, q.KL)
		}
	}
}

func TestCompareTokenIdentical(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	ref := randLogits(r, 1000, 5)
	q, err := CompareToken(ref, ref, 17)
	if err != nil {
		t.Fatal(err)
	}
	if q.KL != 0 || q.RefTop1 != q.CandTop1 || q.RefNLL != q.CandNLL {
		t.Errorf("identical rows: %+v", q)
	}
}

func TestCompareTokenNegInf(t *testing.T) {
	inf := float32(math.Inf(-1))
	ref := []float32{1, inf, 2, 0.5, inf}
	cand := []float32{1.5, 0, 1, inf, inf}
	// cand is -Inf where ref has mass: KL is +Inf.
	q, err := CompareToken(ref, cand, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsInf(q.KL, 1) {
		t.Errorf("KL = %g, want +Inf", q.KL)
	}
	// ref is -Inf where cand has mass: those terms contribute nothing.
	cand2 := []float32{1.5, 0, 1, 0.25, inf}
	q, err = CompareToken(ref, cand2, 2)
	if err != nil {
		t.Fatal(err)
	}
	kl, rt, ct, rn, cn := directToken(ref, cand2, 2)
	if !approxEq(q.KL, kl, 1e-12) || math.IsInf(q.KL, 0) || q.RefTop1 != rt || q.CandTop1 != ct || !approxEq(q.RefNLL, rn, 1e-12) || !approxEq(q.CandNLL, cn, 1e-12) {
		t.Errorf("got %+v, direct KL %g top1 %d/%d NLL %g/%g", q, kl, rt, ct, rn, cn)
	}
	// A target the candidate excludes has infinite NLL.
	q, err = CompareToken(ref, cand, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsInf(q.CandNLL, 1) || math.IsInf(q.RefNLL, 0) {
		t.Errorf("NLL %g/%g, want finite/+Inf", q.RefNLL, q.CandNLL)
	}
}

func TestCompareTokenErrors(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	ninf := float32(math.Inf(-1))
	for _, c := range []struct {
		ref, cand []float32
		want      string
	}{
		{[]float32{1, nan}, []float32{1, 2}, "reference logits: NaN at vocabulary index 1"},
		{[]float32{1, 2}, []float32{nan, 2}, "candidate logits: NaN at vocabulary index 0"},
		{[]float32{1, inf}, []float32{1, 2}, "+Inf"},
		{[]float32{ninf, ninf}, []float32{1, 2}, "every value is -Inf"},
	} {
		_, err := CompareToken(c.ref, c.cand, -1)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrBadLogits) {
			t.Errorf("%v vs %v: error %v, want %q", c.ref, c.cand, err, c.want)
		}
	}
	if _, err := CompareToken([]float32{1}, []float32{1, 2}, -1); err == nil {
		t.Error("rows of different lengths accepted")
	}
	if _, err := CompareToken([]float32{1, 2}, []float32{1, 2}, 2); err == nil {
		t.Error("target outside the vocabulary accepted")
	}
}

// memLogits is an in-memory LogitsSource.
type memLogits struct {
	x             []float32
	tokens, vocab int
	reads         int
}

func (m *memLogits) Shape() (int, int) { return m.tokens, m.vocab }
func (m *memLogits) Name() string      { return "memory" }
func (m *memLogits) ReadRows(dst []float32, start, n int) error {
	m.reads++
	copy(dst, m.x[start*m.vocab:(start+n)*m.vocab])
	return nil
}

func TestCompareLogitsAgainstDirect(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const tokens, vocab = 57, 41
	ref := randLogits(r, tokens*vocab, 3)
	cand := make([]float32, len(ref))
	for i := range cand {
		cand[i] = ref[i] + float32(r.NormFloat64()*0.5)
	}
	targets := make([]int64, tokens)
	labels := make([]string, tokens)
	for i := range targets {
		targets[i] = int64(r.IntN(vocab))
		labels[i] = []string{"wiki", "code", "chat"}[i%3]
	}
	targets[5] = -1 // not scored for perplexity
	// Direct computation.
	type sums struct{ n, np, agree, rnll, cnll, kl float64 }
	want := map[string]*sums{"wiki": {}, "code": {}, "chat": {}, OverallLabel: {}}
	for i := 0; i < tokens; i++ {
		kl, rt, ct, rn, cn := directToken(ref[i*vocab:(i+1)*vocab], cand[i*vocab:(i+1)*vocab], int(targets[i]))
		for _, l := range []string{labels[i], OverallLabel} {
			s := want[l]
			s.n++
			s.kl += kl
			if rt == ct {
				s.agree++
			}
			if targets[i] >= 0 {
				s.np++
				s.rnll += rn
				s.cnll += cn
			}
		}
	}
	var first []QualityRow
	for _, chunk := range []int{1, 4, 100} {
		for _, workers := range []int{1, 3} {
			rs := &memLogits{x: ref, tokens: tokens, vocab: vocab}
			cs := &memLogits{x: cand, tokens: tokens, vocab: vocab}
			rows, err := CompareLogits(context.Background(), rs, cs, targets, labels, CompareOptions{ChunkTokens: chunk, Workers: workers})
			if err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = rows
			} else {
				a, b := fmt.Sprintf("%+v", first), fmt.Sprintf("%+v", rows)
				if a != b {
					t.Errorf("chunk %d, workers %d: result differs:\n%s\n%s", chunk, workers, a, b)
				}
			}
			if wantReads := (tokens + chunk - 1) / chunk; rs.reads != wantReads {
				t.Errorf("chunk %d: %d reads, want %d", chunk, rs.reads, wantReads)
			}
		}
	}
	if len(first) != 4 || first[0].Corpus != "chat" || first[1].Corpus != "code" || first[2].Corpus != "wiki" || first[3].Corpus != OverallLabel {
		t.Fatalf("rows %+v", first)
	}
	for _, row := range first {
		s := want[row.Corpus]
		rp, cp := math.Exp(s.rnll/s.np), math.Exp(s.cnll/s.np)
		if row.Tokens != int64(s.n) || row.PPLTokens != int64(s.np) || !approxEq(row.Top1, s.agree/s.n, 1e-15) ||
			!approxEq(row.MeanKL, s.kl/s.n, 1e-9) || !approxEq(row.RefPPL, rp, 1e-12) || !approxEq(row.CandPPL, cp, 1e-12) ||
			!approxEq(row.DeltaPPLPercent, 100*(cp/rp-1), 1e-9) {
			t.Errorf("%s: got %+v, direct n %v np %v top1 %v KL %v PPL %v/%v", row.Corpus, row, s.n, s.np, s.agree/s.n, s.kl/s.n, rp, cp)
		}
	}
}

func TestCompareLogitsIdentical(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	const tokens, vocab = 20, 300
	x := randLogits(r, tokens*vocab, 4)
	targets := make([]int64, tokens)
	for i := range targets {
		targets[i] = int64(r.IntN(vocab))
	}
	rows, err := CompareLogits(context.Background(), &memLogits{x: x, tokens: tokens, vocab: vocab},
		&memLogits{x: x, tokens: tokens, vocab: vocab}, targets, nil, CompareOptions{ChunkTokens: 7})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("rows %+v", rows)
	}
	o := rows[0]
	if o.DeltaPPLPercent != 0 || o.Top1 != 1 || o.MeanKL != 0 || o.RefPPL != o.CandPPL || o.Tokens != tokens {
		t.Errorf("identical runs: %+v", o)
	}
}

func TestCompareLogitsErrors(t *testing.T) {
	ctx := context.Background()
	a := &memLogits{x: make([]float32, 6), tokens: 2, vocab: 3}
	b := &memLogits{x: make([]float32, 8), tokens: 2, vocab: 4}
	if _, err := CompareLogits(ctx, a, b, nil, nil, CompareOptions{}); err == nil {
		t.Error("different vocabularies accepted")
	}
	if _, err := CompareLogits(ctx, a, a, []int64{1}, nil, CompareOptions{}); err == nil {
		t.Error("short targets accepted")
	}
	if _, err := CompareLogits(ctx, a, a, []int64{1, 3}, nil, CompareOptions{}); err == nil {
		t.Error("target outside the vocabulary accepted")
	}
	if _, err := CompareLogits(ctx, a, a, nil, []string{"x"}, CompareOptions{}); err == nil {
		t.Error("short labels accepted")
	}
	bad := &memLogits{x: []float32{0, 0, 0, 0, float32(math.NaN()), 0}, tokens: 2, vocab: 3}
	_, err := CompareLogits(ctx, a, bad, nil, nil, CompareOptions{ChunkTokens: 1})
	if err == nil || !strings.Contains(err.Error(), "token 1") || !strings.Contains(err.Error(), "candidate logits: NaN at vocabulary index 1") {
		t.Errorf("NaN logits: %v", err)
	}
}

// writeLogitsFile writes a minimal safetensors file holding one tensor.
func writeLogitsFile(t testing.TB, path, name, dtype string, shape []int64, data []byte) {
	t.Helper()
	hdr, err := json.Marshal(map[string]any{name: map[string]any{"dtype": dtype, "shape": shape, "data_offsets": []int{0, len(data)}}})
	if err != nil {
		t.Fatal(err)
	}
	for len(hdr)%8 != 0 {
		hdr = append(hdr, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	out = append(append(out, hdr...), data...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSafetensorsLogits(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	const tokens, vocab = 9, 13
	x := randLogits(r, tokens*vocab, 2)
	dir := t.TempDir()
	f32 := make([]byte, 0, 4*len(x))
	bf16 := make([]byte, 0, 2*len(x))
	for i, v := range x {
		x[i] = math.Float32frombits(math.Float32bits(v) &^ 0xffff) // BF16-exact
		f32 = binary.LittleEndian.AppendUint32(f32, math.Float32bits(x[i]))
		bf16 = binary.LittleEndian.AppendUint16(bf16, uint16(math.Float32bits(x[i])>>16))
	}
	writeLogitsFile(t, filepath.Join(dir, "ref.safetensors"), "logits", "F32", []int64{tokens, vocab}, f32)
	writeLogitsFile(t, filepath.Join(dir, "cand.safetensors"), "out", "BF16", []int64{1, tokens, vocab}, bf16)
	open := func(name string) *SafetensorsLogits {
		f, err := safetensors.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		l, err := OpenLogits(f, "")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ref, cand := open("ref.safetensors"), open("cand.safetensors")
	for _, l := range []*SafetensorsLogits{ref, cand} {
		if tk, v := l.Shape(); tk != tokens || v != vocab {
			t.Fatalf("%s: shape %d×%d", l.Name(), tk, v)
		}
		got := make([]float32, 3*vocab)
		if err := l.ReadRows(got, 4, 3); err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			if v != x[4*vocab+i] {
				t.Fatalf("%s: value %d = %g, want %g", l.Name(), i, v, x[4*vocab+i])
			}
		}
		if err := l.ReadRows(got, 8, 2); err == nil {
			t.Errorf("%s: read past the end accepted", l.Name())
		}
	}
	rows, err := CompareLogits(context.Background(), ref, cand, nil, nil, CompareOptions{ChunkTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	if rows[0].MeanKL != 0 || rows[0].Top1 != 1 || !math.IsNaN(rows[0].RefPPL) {
		t.Errorf("same logits in F32 and BF16: %+v", rows[0])
	}
	// Wrong dtype and shape are named.
	writeLogitsFile(t, filepath.Join(dir, "ints.safetensors"), "logits", "I32", []int64{2, 2}, make([]byte, 16))
	writeLogitsFile(t, filepath.Join(dir, "flat.safetensors"), "logits", "F32", []int64{4}, make([]byte, 16))
	for name, want := range map[string]string{"ints.safetensors": "must be BF16", "flat.safetensors": "[tokens, vocab]"} {
		f, err := safetensors.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		_, err = OpenLogits(f, "")
		f.Close()
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v, want mention of %q and the file", name, err, want)
		}
	}
}
