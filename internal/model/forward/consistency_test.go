package forward

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/safetensors"
)

// writeModel writes a built-in fixture variant into a temporary directory.
func writeModel(tb testing.TB, cfg testmodel.Config, v testmodel.Variant) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := testmodel.Write(dir, cfg, v); err != nil {
		tb.Fatal(err)
	}
	return dir
}

func openModel(tb testing.TB, dir string) *Model {
	tb.Helper()
	m, err := Open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	m.Resident = true
	return m
}

// testIDs returns n deterministic token ids below vocab.
func testIDs(n, vocab int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 7))
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	return ids
}

// logitsOf runs the sequences as one batch from empty state and returns
// every position's logits, per sequence.
func logitsOf(tb testing.TB, m *Model, seqs ...[]int32) [][]float32 {
	tb.Helper()
	b := &Batch{}
	var ids []int32
	for _, s := range seqs {
		b.Lens = append(b.Lens, len(s))
		ids = append(ids, s...)
	}
	x, err := m.Embed(ids)
	if err != nil {
		tb.Fatal(err)
	}
	b.X = x
	if err := m.Trunk(b, nil, nil); err != nil {
		tb.Fatal(err)
	}
	hf, err := m.FinalNorm(b.X)
	if err != nil {
		tb.Fatal(err)
	}
	all := make([]float32, 0, len(ids)*m.Config.Vocab)
	if err := m.Logits(hf, func(_, _ int, lg []float32) error { all = append(all, lg...); return nil }); err != nil {
		tb.Fatal(err)
	}
	out := make([][]float32, len(seqs))
	V, r := m.Config.Vocab, 0
	for s, ln := range b.Lens {
		out[s] = all[r*V : (r+ln)*V]
		r += ln
	}
	return out
}

func bitsEqual(a, b []float32) (int, bool) {
	if len(a) != len(b) {
		return -1, false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i, false
		}
	}
	return 0, true
}

func maxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

func argmaxRows(lg []float32, V int) []int {
	var out []int
	for r := 0; r*V < len(lg); r++ {
		_, am := LogSoftmaxAt(lg[r*V:(r+1)*V], 0)
		out = append(out, am)
	}
	return out
}

// randHeads returns T rows of n-wide vectors, each L2-normalised and scaled.
func randHeads[T real](r *rand.Rand, rows, n int, scale float64) []T {
	v := make([]T, rows*n)
	for i := 0; i < rows; i++ {
		var ss float64
		x := make([]float64, n)
		for j := range x {
			x[j] = r.NormFloat64()
			ss += x[j] * x[j]
		}
		for j := range x {
			v[i*n+j] = T(x[j] / math.Sqrt(ss) * scale)
		}
	}
	return v
}

func deltaInputs[T real](seed uint64, n, dk, dv int) (q, k, v, beta, g, s0 []T) {
	r := rand.New(rand.NewPCG(seed, 1))
	q = randHeads[T](r, n, dk, 1/math.Sqrt(float64(dk)))
	k = randHeads[T](r, n, dk, 1)
	v = make([]T, n*dv)
	for i := range v {
		v[i] = T(r.NormFloat64())
	}
	beta, g = make([]T, n), make([]T, n)
	for i := range beta {
		beta[i] = T(1 / (1 + math.Exp(-r.NormFloat64())))
		// Mostly mild decay, some strong (exp(g) down to ~e⁻⁸).
		g[i] = T(-math.Exp(r.NormFloat64()-1) * (1 + 3*float64(i%7/6)))
	}
	s0 = make([]T, dk*dv)
	for i := range s0 {
		s0[i] = T(0.1 * r.NormFloat64())
	}
	return
}

// TestDeltaRuleChunkedMatchesRecurrent checks the chunked delta rule
// against the recurrent definition: outputs and final state, over lengths
// that end inside a chunk, from a non-zero state. float64: 1e-12. float32:
// 2e-6 relative to the largest output (and absolute on the state, whose
// entries are O(0.1..1)): each output is a sum of dk products of unit-scale
// values read from a state built by chained updates, so a few dozen float32
// roundings (2^-24 ≈ 6e-8 each) accumulate; measured at most 3e-7.
func TestDeltaRuleChunkedMatchesRecurrent(t *testing.T) {
	for _, n := range []int{1, 5, 64, 65, 150} {
		const dk, dv = 32, 48
		{
			q, k, v, beta, g, s0 := deltaInputs[float64](uint64(n), n, dk, dv)
			sr, sc := append([]float64(nil), s0...), append([]float64(nil), s0...)
			or, oc := make([]float64, n*dv), make([]float64, n*dv)
			DeltaRuleRecurrent(q, k, v, beta, g, n, dk, dv, sr, or)
			DeltaRuleChunked(q, k, v, beta, g, n, dk, dv, sc, oc)
			if d := maxAbs64(or, oc); d > 1e-12 {
				t.Errorf("float64, T=%d: outputs differ by %g", n, d)
			}
			if d := maxAbs64(sr, sc); d > 1e-12 {
				t.Errorf("float64, T=%d: final states differ by %g", n, d)
			}
		}
		{
			q, k, v, beta, g, s0 := deltaInputs[float32](uint64(n), n, dk, dv)
			sr, sc := append([]float32(nil), s0...), append([]float32(nil), s0...)
			or, oc := make([]float32, n*dv), make([]float32, n*dv)
			DeltaRuleRecurrent(q, k, v, beta, g, n, dk, dv, sr, or)
			DeltaRuleChunked(q, k, v, beta, g, n, dk, dv, sc, oc)
			var scale float64
			for _, x := range or {
				scale = max(scale, math.Abs(float64(x)))
			}
			d := maxAbsDiff(or, oc) / scale
			ds := maxAbsDiff(sr, sc)
			t.Logf("float32, T=%d: output difference %.2g relative, state %.2g", n, d, ds)
			if d > 2e-6 || ds > 2e-6 {
				t.Errorf("float32, T=%d: outputs differ by %g relative, states by %g", n, d, ds)
			}
		}
	}
}

func maxAbs64(a, b []float64) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

// TestDeltaRuleChunkedPrefix: the chunked outputs of a prefix are
// bit-identical to the same positions of the whole sequence.
func TestDeltaRuleChunkedPrefix(t *testing.T) {
	const n, dk, dv = 150, 32, 32
	q, k, v, beta, g, _ := deltaInputs[float32](3, n, dk, dv)
	full := make([]float32, n*dv)
	DeltaRuleChunked(q, k, v, beta, g, n, dk, dv, make([]float32, dk*dv), full)
	for _, p := range []int{1, 63, 64, 100} {
		part := make([]float32, p*dv)
		DeltaRuleChunked(q[:p*dk], k[:p*dk], v[:p*dv], beta[:p], g[:p], p, dk, dv, make([]float32, dk*dv), part)
		if i, ok := bitsEqual(part, full[:p*dv]); !ok {
			t.Errorf("prefix %d: output element %d differs", p, i)
		}
	}
}

// TestPrefixAndBatchingAndWorkers: on the micro fixture, the logits of a
// prefix equal the whole sequence's first rows bit for bit; batching two
// sequences together and changing the worker count change no bit.
func TestPrefixAndBatchingAndWorkers(t *testing.T) {
	m := openModel(t, writeModel(t, testmodel.Micro(), testmodel.SingleFile))
	V := m.Config.Vocab
	a := testIDs(150, V, 1)
	b := testIDs(37, V, 2)
	full := logitsOf(t, m, a)[0]
	for _, p := range []int{1, 2, 64, 65, 100} {
		pre := logitsOf(t, m, a[:p])[0]
		if i, ok := bitsEqual(pre, full[:p*V]); !ok {
			t.Errorf("prefix %d: logit %d (row %d) differs from the full sequence", p, i, i/V)
		}
	}
	both := logitsOf(t, m, b, a)
	if i, ok := bitsEqual(both[1], full); !ok {
		t.Errorf("batched with another sequence: logit %d differs", i)
	}
	prev := kernels.SetWorkers(1)
	one := logitsOf(t, m, a)[0]
	kernels.SetWorkers(3)
	three := logitsOf(t, m, a)[0]
	kernels.SetWorkers(prev)
	if i, ok := bitsEqual(one, full); !ok {
		t.Errorf("1 worker: logit %d differs", i)
	}
	if i, ok := bitsEqual(three, full); !ok {
		t.Errorf("3 workers: logit %d differs", i)
	}
}

// TestDecodeMatchesFull: a prompt prefilled then continued token by token
// (and in segments) with caches gives the full forward's logits within
// float32 rounding of the recurrent vs chunked delta rule, with identical
// argmax.
func TestDecodeMatchesFull(t *testing.T) {
	m := openModel(t, writeModel(t, testmodel.Micro(), testmodel.SingleFile))
	V := m.Config.Vocab
	ids := testIDs(100, V, 5)
	full := logitsOf(t, m, ids)[0]
	for _, plan := range [][]int{
		{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, // token by token from the start
		{70, 1, 1, 1, 5, 1, 21},        // prefill, steps, a segment, more
		{64, 36},
	} {
		d := m.NewDecoder()
		got := make([]float32, 0, len(ids)*V)
		pos := 0
		for _, n := range plan {
			if err := d.Feed(ids[pos:pos+n], func(_, _ int, lg []float32) error { got = append(got, lg...); return nil }); err != nil {
				t.Fatal(err)
			}
			pos += n
		}
		ref := full[:pos*V]
		diff := maxAbsDiff(got, ref)
		t.Logf("plan %v: max |Δlogit| %.3g", plan, diff)
		if diff > 1e-4 {
			t.Errorf("plan %v: logits differ from the full forward by %g", plan, diff)
		}
		ga, ra := argmaxRows(got, V), argmaxRows(ref, V)
		for i := range ga {
			if ga[i] != ra[i] {
				t.Errorf("plan %v: position %d argmax %d, full forward %d", plan, i, ga[i], ra[i])
			}
		}
	}
}

// TestLayoutsGiveIdenticalLogits: the fused (sharded), per-expert and
// single-file layouts of the built-in fixture, and the same weights
// rewritten in the Qwen3-Next layout (model. prefix, fused in_proj_qkvz
// and in_proj_ba grouped per key head, per-expert experts, flat config),
// give bit-identical logits.
func TestLayoutsGiveIdenticalLogits(t *testing.T) {
	cfg := testmodel.Micro()
	ids := testIDs(90, cfg.Vocab, 9)
	ref := logitsOf(t, openModel(t, writeModel(t, cfg, testmodel.Default)), ids)[0]
	per := writeModel(t, cfg, testmodel.PerExpert)
	for name, dir := range map[string]string{
		"per-expert":  per,
		"single-file": writeModel(t, cfg, testmodel.SingleFile),
		"qwen3-next":  toQwen3Next(t, per, cfg),
	} {
		got := logitsOf(t, openModel(t, dir), ids)[0]
		if i, ok := bitsEqual(got, ref); !ok {
			t.Errorf("%s layout: logit %d differs from the fused layout (%g vs %g)", name, i, got[i], ref[i])
		}
	}
}

// toQwen3Next rewrites the per-expert fixture in dir as a Qwen3-Next
// checkpoint with the same values.
func toQwen3Next(tb testing.TB, dir string, cfg testmodel.Config) string {
	tb.Helper()
	src, err := safetensors.OpenModel(dir)
	if err != nil {
		tb.Fatal(err)
	}
	defer src.Close()
	const old = "model.language_model."
	H := int64(cfg.Hidden)
	nk, dk, dv := cfg.LinearKeyHeads, cfg.LinearKeyHeadDim, cfg.LinearValueHeadDim
	r := cfg.LinearValueHeads / nk
	kd, vd := nk*dk, cfg.LinearValueHeads*dv
	var out []safetensors.Tensor
	raw := func(name string) ([]byte, safetensors.TensorInfo) {
		f, ti, ok := src.Lookup(name)
		if !ok {
			tb.Fatalf("no tensor %s", name)
		}
		b, err := f.ReadTensor(name)
		if err != nil {
			tb.Fatal(err)
		}
		return b, ti
	}
	for _, name := range src.Names() {
		nn := name
		if len(name) > len(old) && name[:len(old)] == old {
			nn = "model." + name[len(old):]
		}
		switch {
		case hasSuffix(name, "linear_attn.in_proj_z.weight"), hasSuffix(name, "linear_attn.in_proj_b.weight"), hasSuffix(name, "linear_attn.in_proj_a.weight"):
			continue
		case hasSuffix(name, "linear_attn.in_proj_qkv.weight"):
			p := name[:len(name)-len("in_proj_qkv.weight")]
			np := nn[:len(nn)-len("in_proj_qkv.weight")]
			qkv, ti := raw(name)
			z, _ := raw(p + "in_proj_z.weight")
			bb, _ := raw(p + "in_proj_b.weight")
			aa, _ := raw(p + "in_proj_a.weight")
			es := int64(2) // BF16 bytes
			if ti.DType != safetensors.BF16 {
				tb.Fatalf("%s is %v", name, ti.DType)
			}
			row := H * es
			rows := func(b []byte, from, n int) []byte { return b[int64(from)*row : int64(from+n)*row] }
			var qkvz, ba []byte
			for g := 0; g < nk; g++ {
				qkvz = append(qkvz, rows(qkv, g*dk, dk)...)
				qkvz = append(qkvz, rows(qkv, kd+g*dk, dk)...)
				qkvz = append(qkvz, rows(qkv, 2*kd+g*r*dv, r*dv)...)
				qkvz = append(qkvz, rows(z, g*r*dv, r*dv)...)
				ba = append(ba, rows(bb, g*r, r)...)
				ba = append(ba, rows(aa, g*r, r)...)
			}
			out = append(out,
				safetensors.Tensor{Name: np + "in_proj_qkvz.weight", DType: safetensors.BF16, Shape: []int64{int64(2*kd + 2*vd), H}, Data: qkvz},
				safetensors.Tensor{Name: np + "in_proj_ba.weight", DType: safetensors.BF16, Shape: []int64{int64(2 * cfg.LinearValueHeads), H}, Data: ba})
		default:
			b, ti := raw(name)
			out = append(out, safetensors.Tensor{Name: nn, DType: ti.DType, Shape: ti.Shape, Data: b})
		}
	}
	nd := tb.TempDir()
	if err := safetensors.WriteFile(filepath.Join(nd, "model.safetensors"), out, map[string]string{"format": "pt"}); err != nil {
		tb.Fatal(err)
	}
	writeFlatConfig(tb, nd, cfg)
	return nd
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

// TestMoEBlockWorkersAndHooks: the layer's MoE block, read through
// forward's weight source in both expert layouts, gives the bits of the
// block's own ffn.MoE.Forward with and without a hook and with experts
// evaluated 1 and 3 at a time. (calib's loader is compared with forward's
// in calib's tests.)
func TestMoEBlockWorkersAndHooks(t *testing.T) {
	cfg := testmodel.Micro()
	for _, v := range []testmodel.Variant{testmodel.Default, testmodel.PerExpert} {
		m := openModel(t, writeModel(t, cfg, v))
		x := make([]float32, 77*cfg.Hidden)
		r := rand.New(rand.NewPCG(4, 4))
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		for i := 0; i < m.Config.NumLayers(); i++ {
			l, err := m.Layer(i)
			if err != nil {
				t.Fatal(err)
			}
			prev := kernels.SetWorkers(1)
			want, err := l.MoE.Forward(x, 77)
			kernels.SetWorkers(prev)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range []int{1, 3} {
				prev := kernels.SetWorkers(w)
				got, err := l.moe(x, 77, func(*Activations) error { return nil })
				got2, err2 := l.moe(x, 77, nil)
				kernels.SetWorkers(prev)
				if err != nil || err2 != nil {
					t.Fatal(err, err2)
				}
				for _, g := range [][]float32{got, got2} {
					if j, ok := bitsEqual(g, want); !ok {
						t.Errorf("%v layer %d, %d workers: element %d: %g vs %g", v, i, w, j, g[j], want[j])
					}
				}
			}
		}
	}
}

// TestMixerGroups: a batch larger than MixerRows runs its token mixer in
// groups of sequences; results are unchanged bit for bit.
func TestMixerGroups(t *testing.T) {
	m := openModel(t, writeModel(t, testmodel.Micro(), testmodel.SingleFile))
	V := m.Config.Vocab
	mixerRows = 100 // groups {a}, {b, c}
	defer func() { mixerRows = MixerRows }()
	a, b, c := testIDs(150, V, 1), testIDs(70, V, 2), testIDs(30, V, 3)
	got := logitsOf(t, m, a, b, c)
	for i, s := range [][]int32{a, b, c} {
		if j, ok := bitsEqual(got[i], logitsOf(t, m, s)[0]); !ok {
			t.Errorf("sequence %d: logit %d differs when batched", i, j)
		}
	}
}
