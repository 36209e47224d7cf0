package forward

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

// TestStored: a routed expert matrix is offered as its per-expert source
// tensors (gate rows first), another tensor under its source's name; a
// tensor whose values are not decided is not offered; a source tensor two
// stored tensors provide is refused; the kept values follow Changed.
func TestStored(t *testing.T) {
	e := 3
	ts := []StoredTensor{
		{Key: "model.layers.0.mlp.experts.3.gate_up_proj", Shape: []int64{4, 2}, Expert: &e},
		{Key: "model.layers.0.self_attn.o_proj.weight", Shape: []int64{2, 2}, Sources: []string{"model.layers.0.self_attn.o_proj.weight"}},
	}
	vals := map[string][]float32{
		ts[0].Key: {1, 2, 3, 4, 5, 6, 7, 8},
		ts[1].Key: {9, 10, 11, 12},
	}
	decodes := 0
	ready := map[string]bool{ts[0].Key: true}
	s, err := NewStored("the test checkpoint", ts, func(k string) ([]float32, error) {
		decodes++
		return append([]float32(nil), vals[k]...), nil
	}, func(k string) bool { return ready[k] })
	if err != nil {
		t.Fatal(err)
	}
	up := "model.layers.0.mlp.experts.3.up_proj.weight"
	if sh, ok := s.Shape(up); !ok || len(sh) != 2 || sh[0] != 2 || sh[1] != 2 {
		t.Fatalf("Shape(%s) = %v, %v", up, sh, ok)
	}
	dst := make([]float32, 4)
	if err := s.Read(up, dst, 0); err != nil || dst[0] != 5 || dst[3] != 8 {
		t.Fatalf("Read(%s) = %v, %v: want the last two rows", up, dst, err)
	}
	if err := s.Read("model.layers.0.mlp.experts.3.gate_proj.weight", dst, 0); err != nil || dst[0] != 1 || decodes != 1 {
		t.Fatalf("gate rows %v, %v after %d decodes: want rows 0–1 from one decode", dst, err, decodes)
	}
	o := "model.layers.0.self_attn.o_proj.weight"
	if _, ok := s.Shape(o); ok {
		t.Error("a tensor whose values are not decided is offered")
	}
	var we *WeightError
	if err := s.Read(o, dst, 0); !errors.As(err, &we) || !strings.Contains(err.Error(), "decided") {
		t.Errorf("reading an undecided tensor: %v", err)
	}
	ready[o] = true
	if err := s.Read(o, dst, 0); err != nil || dst[0] != 9 {
		t.Fatalf("Read(%s) = %v, %v", o, dst, err)
	}
	vals[o][0] = 99
	if s.Read(o, dst, 0); dst[0] != 9 {
		t.Error("the kept values were not used")
	}
	s.Changed(o)
	if s.Read(o, dst, 0); dst[0] != 99 {
		t.Error("Changed did not drop the kept values")
	}
	if err := s.Read("nope", dst, 0); !errors.As(err, &we) || !strings.Contains(err.Error(), "the test checkpoint") {
		t.Errorf("reading a tensor it does not store: %v", err)
	}
	if k, off, _, ok := s.Locate(up); !ok || k != ts[0].Key || off != 4 {
		t.Errorf("Locate(%s) = %s, %d, %v", up, k, off, ok)
	}
	dup := append(ts, StoredTensor{Key: "other", Shape: []int64{2, 2}, Sources: []string{o}})
	if _, err := NewStored("x", dup, nil, nil); err == nil || !strings.Contains(err.Error(), "both provide") {
		t.Errorf("two stored tensors for one source tensor: %v", err)
	}
	join := []StoredTensor{{Key: "j", Shape: []int64{2, 2}, Sources: []string{"a", "b"}}}
	if _, err := NewStored("x", join, nil, nil); err == nil || !strings.Contains(err.Error(), "joins 2 sources") {
		t.Errorf("a non-expert tensor joining two sources: %v", err)
	}
}

// TestLogitsChunksSameBits: logits over more than one chunk of rows keep
// the bits of the product one chunk at a time.
func TestLogitsChunksSameBits(t *testing.T) {
	m := openModel(t, writeModel(t, testmodel.Micro(), testmodel.Default))
	H, V := m.Config.Hidden, m.Config.Vocab
	const n = 2*LogitChunk + 13
	hf := make([]float32, n*H)
	r := rand.New(rand.NewPCG(8, 8))
	for i := range hf {
		hf[i] = float32(r.NormFloat64())
	}
	got := make([]float32, 0, n*V)
	if err := m.Logits(hf, func(row0, rows int, lg []float32) error {
		got = append(got, lg[:rows*V]...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for r0 := 0; r0 < n; r0 += LogitChunk {
		rows := min(LogitChunk, n-r0)
		err := m.Logits(hf[r0*H:(r0+rows)*H], func(_, rows int, lg []float32) error {
			if j, ok := bitsEqual(lg[:rows*V], got[r0*V:(r0+rows)*V]); !ok {
				t.Fatalf("row chunk at %d, element %d: one chunk %g, all rows %g", r0, j, lg[j], got[r0*V+j])
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestDumpOptionsValidate: options that ask for nothing, or MTP logits
// with no logits file, are refused.
func TestDumpOptionsValidate(t *testing.T) {
	for _, o := range []DumpOptions{{}, {MTP: true}, {MTP: true, LayersPath: "l"}} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	for _, o := range []DumpOptions{{LogitsPath: "x"}, {LogitsPath: "x", MTP: true}, {LayersPath: "l"}} {
		if err := o.Validate(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// TestLMHeadStates: the head is read on first use; the first float32
// Logits call packs it and, without Linears, drops its values, which
// CheckFinite then reads again without keeping them; with Linears the
// values stay beside the packing.
func TestLMHeadStates(t *testing.T) {
	dir := writeModel(t, testmodel.Micro(), testmodel.Default)
	noop := func(int, int, []float32) error { return nil }
	m := openModel(t, dir)
	if m.lm.state != headUnread || m.lm.w != nil || m.lm.packed != nil {
		t.Fatalf("a new model holds a head: %+v", m.lm)
	}
	hf := make([]float32, 3*m.Config.Hidden)
	if err := m.Logits(hf, noop); err != nil {
		t.Fatal(err)
	}
	if m.lm.state != headPacked || m.lm.w != nil || m.lm.packed == nil {
		t.Fatalf("after float32 logits: state %d, values held %v, packing %v", m.lm.state, m.lm.w != nil, m.lm.packed != nil)
	}
	if err := m.CheckFinite(); err != nil {
		t.Fatal(err)
	}
	if m.lm.state != headPacked || m.lm.w != nil {
		t.Fatalf("CheckFinite kept the dropped values: state %d", m.lm.state)
	}
	m = openModel(t, dir)
	m.Linears = failingLinears{LinearRole(99)} // float32 for every matrix
	if err := m.Logits(hf, noop); err != nil {
		t.Fatal(err)
	}
	if m.lm.state != headRead || m.lm.w == nil || m.lm.packed == nil {
		t.Fatalf("with Linears: state %d, values held %v, packing %v", m.lm.state, m.lm.w != nil, m.lm.packed != nil)
	}
}
