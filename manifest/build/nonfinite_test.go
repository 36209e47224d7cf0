package build

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/safetensors"
)

// poisonedSource copies the tiny model and writes a BF16 value (bits) at
// element k of the first stored tensor pick accepts; it returns the copy
// and that tensor.
func poisonedSource(t *testing.T, pick func(*storedTensor) bool, k int64, bits uint16) (string, *storedTensor) {
	t.Helper()
	src, _ := tinyFixture(t)
	m, err := safetensors.OpenModel(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sts, err := resolveStored(preset(t), m, plan.ResolveOptions{ExpertsPerFile: manifest.DefaultExpertsPerFile, DenseShardBytes: manifest.DefaultDenseShardBytes})
	if err != nil {
		t.Fatal(err)
	}
	var st *storedTensor
	for _, s := range sts {
		if pick(s) && s.srcDType == "BF16" && s.parts[0].len > 2*k+2 {
			st = s
			break
		}
	}
	if st == nil {
		t.Fatal("no tensor fits")
	}
	dir := filepath.Join(t.TempDir(), "model")
	copyTree(t, src, dir)
	p := st.parts[0]
	info, _ := p.file.Lookup(p.tensor)
	path := filepath.Join(dir, filepath.Base(p.file.Path()))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(b[p.file.DataOffset()+info.Begin+p.off+2*k:], bits)
	os.WriteFile(path, b, 0o644)
	return dir, st
}

const (
	bf16NaN    = 0x7fc0
	bf16PosInf = 0x7f80
)

// TestNonFiniteSourceRefused: a NaN or Inf in a tensor stops the build,
// whatever the tensor's method, with an error naming the tensor, the index
// and the value; --allow-nonfinite stores it and lists it.
func TestNonFiniteSourceRefused(t *testing.T) {
	const k = 37
	cases := []struct {
		name string
		pick func(*storedTensor) bool
		bits uint16
		gptq bool
		want string
	}{
		{"rtn matrix", func(s *storedTensor) bool { return s.isBFP && !s.isExpertMatrix() }, bf16NaN, false, "NaN"},
		{"lossless tensor", func(s *storedTensor) bool { return !s.isBFP && manifest.IsFloatDType(s.srcDType) }, bf16PosInf, false, "+Inf"},
		{"rtn expert", func(s *storedTensor) bool { return s.isExpertMatrix() }, bf16NaN, false, "NaN"},
		{"gptq expert", func(s *storedTensor) bool { return s.isExpertMatrix() && s.layer == 1 }, bf16NaN, true, "NaN"},
	}
	for _, c := range cases {
		if c.gptq && purego {
			continue
		}
		src, st := poisonedSource(t, c.pick, k, c.bits)
		out := filepath.Join(t.TempDir(), "out")
		o := convertOpts(t, out, 2)
		if c.gptq {
			o = gptq1Opts(t, out, 2)
		}
		o.Source = src
		build := Convert
		if c.gptq {
			build = GPTQ
		}
		_, err := build(context.Background(), o)
		idx := fmt.Sprint(multiIndex(k, st.shape))
		if !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), st.name) || !strings.Contains(err.Error(), idx) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want ErrNonFinite naming %s, element %s and %s", c.name, err, st.name, idx, c.want)
			continue
		}
		// Refused by the hashing pass, before the first layer: nothing
		// is written (a GPTQ layer 1 used to be reached after layer 0's
		// files).
		if !strings.Contains(err.Error(), "before any work") {
			t.Errorf("%s: refused late: %v", c.name, err)
		}
		if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the refused build left %s (%v)", c.name, out, err)
		}

		if c.gptq {
			// GPTQ cannot run on it, allowed or not.
			o.AllowNonFinite = true
			if _, err := build(context.Background(), o); !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), "GPTQ cannot") {
				t.Errorf("%s with AllowNonFinite: %v", c.name, err)
			}
			continue
		}
		// Allowed: stored, listed, verified against the source.
		out2 := filepath.Join(t.TempDir(), "allowed")
		o.Out = out2
		o.AllowNonFinite = true
		res, err := build(context.Background(), o)
		if err != nil {
			t.Fatalf("%s with AllowNonFinite: %v", c.name, err)
		}
		if len(res.NonFinite) != 1 || res.NonFinite[0] != st.name || fmt.Sprint(res.Manifest.TTQuant.NonFinite) != fmt.Sprint(res.NonFinite) {
			t.Errorf("%s: NonFinite %v, manifest %v; want [%s]", c.name, res.NonFinite, res.Manifest.TTQuant.NonFinite, st.name)
		}
		if rep := mustVerify(t, out2, VerifyOptions{Source: src}); !rep.OK {
			t.Errorf("%s: verify: %v", c.name, rep.Failures)
		}
		// A rerun without the permission is refused before it touches the
		// checkpoint.
		if c.name == "rtn matrix" {
			before := treeHash(t, out2)
			o.AllowNonFinite = false
			if _, err := build(context.Background(), o); !errors.Is(err, ErrNonFinite) {
				t.Errorf("rerun without AllowNonFinite: %v", err)
			}
			if treeHash(t, out2) != before {
				t.Error("the refused rerun changed the checkpoint")
			}
		}
	}
}

// TestFiniteScanChunks: the hashing pass's scan finds the same non-finite
// elements whatever the chunk boundaries, an element split between two
// chunks included.
func TestFiniteScanChunks(t *testing.T) {
	src, st := poisonedSource(t, func(s *storedTensor) bool { return s.isBFP && !s.isExpertMatrix() }, 11, bf16NaN)
	path := filepath.Join(src, filepath.Base(st.parts[0].file.Path()))
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	whole := newFiniteScan(f)
	whole.chunk(0, b)
	if len(whole.bad) != 1 || whole.bad[st.parts[0].tensor] == nil {
		t.Fatalf("whole file: %v", whole.bad)
	}
	want := fmt.Sprint(whole.bad[st.parts[0].tensor].offsets)
	for _, step := range []int{1, 3, 7, 13, 4096 + 1} {
		s := newFiniteScan(f)
		for off := 0; off < len(b); off += step {
			s.chunk(int64(off), b[off:min(off+step, len(b))])
		}
		if got := s.bad[st.parts[0].tensor]; len(s.bad) != 1 || got == nil || fmt.Sprint(got.offsets) != want {
			t.Errorf("chunks of %d bytes: %v, want offsets %s", step, s.bad, want)
		}
	}
}

// TestShardedRunRefusesNonFinite: a worker of a split build refuses a
// source holding NaN before it writes anything, as a whole build does; and
// a worker run again without AllowNonFinite on the assembled checkpoint of
// such a source (built with it) is refused and changes nothing, as a whole
// build's rerun is (TestNonFiniteSourceRefused).
func TestShardedRunRefusesNonFinite(t *testing.T) {
	src, st := poisonedSource(t, func(s *storedTensor) bool { return s.isBFP && !s.isExpertMatrix() }, 37, bf16NaN)
	out := filepath.Join(t.TempDir(), "out")
	o := convertOpts(t, out, 2)
	o.Source = src
	o.Shard = shard.Spec{Index: 1, Count: 3}
	_, err := Convert(context.Background(), o)
	if !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), st.name) || !strings.Contains(err.Error(), "before any work") {
		t.Fatalf("worker 1/3 on a NaN source: %v; want ErrNonFinite naming %s, before any work", err, st.name)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused worker left %s (%v)", out, err)
	}
	o.AllowNonFinite = true
	for i := range 3 {
		o.Shard = shard.Spec{Index: i, Count: 3}
		if _, err := Convert(context.Background(), o); err != nil {
			t.Fatalf("worker %d/3 with AllowNonFinite: %v", i, err)
		}
	}
	if _, err := Assemble(context.Background(), AssembleOptions{Dir: out}); err != nil {
		t.Fatal(err)
	}
	before := treeHash(t, out)
	o.AllowNonFinite = false
	o.Shard = shard.Spec{Index: 2, Count: 3}
	if res, err := Convert(context.Background(), o); !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), "--allow-nonfinite") {
		t.Errorf("worker 2/3 again without AllowNonFinite: %+v, %v; want ErrNonFinite", res, err)
	}
	if treeHash(t, out) != before {
		t.Error("the refused worker changed the checkpoint")
	}
}
