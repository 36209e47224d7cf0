package safetensors

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func f32bytes(vals ...float32) []byte {
	b, err := AppendFloat32s(nil, vals, F32)
	if err != nil {
		panic(err)
	}
	return b
}

func TestWriterRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	bf, _ := AppendFloat32s(nil, []float32{1, -2, 0.5, 3}, BF16)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.Add("b.weight", BF16, []int64{2, 2}, bf))
	must(w.Add("a.bias", F32, []int64{3}, f32bytes(1, 2, 3)))
	must(w.Add("ids", I32, []int64{2}, []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}))
	must(w.AddFunc("streamed", U8, []int64{5}, 5, func(wr io.Writer) error {
		_, err := wr.Write([]byte{9, 8, 7, 6, 5})
		return err
	}))
	must(w.AddReader("copied", U16, []int64{2}, strings.NewReader("\x01\x02\x03\x04extra")))
	w.SetMetadata(map[string]string{"format": "pt", "z": "last"})
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("target exists before Close: %v", err)
	}
	must(w.Close())

	f, err := Open(path)
	must(err)
	defer f.Close()
	if f.HeaderSize()%8 != 0 {
		t.Errorf("header size %d not a multiple of 8", f.HeaderSize())
	}
	// Data order: F32, I32, BF16, U8 (most aligned first).
	var order []string
	for _, ti := range f.Tensors() {
		order = append(order, ti.Name)
	}
	if got := strings.Join(order, ","); got != "a.bias,ids,b.weight,copied,streamed" {
		t.Errorf("data order %s", got)
	}
	got, err := f.Float32s("b.weight")
	must(err)
	if len(got) != 4 || got[0] != 1 || got[1] != -2 || got[2] != 0.5 || got[3] != 3 {
		t.Errorf("b.weight = %v", got)
	}
	ids, err := f.Int64s("ids")
	must(err)
	if ids[0] != 1 || ids[1] != -1 {
		t.Errorf("ids = %v", ids)
	}
	raw, err := f.ReadTensor("streamed")
	must(err)
	if !bytes.Equal(raw, []byte{9, 8, 7, 6, 5}) {
		t.Errorf("streamed = %v", raw)
	}
	if c, _ := f.ReadTensor("copied"); string(c) != "\x01\x02\x03\x04" {
		t.Errorf("copied = %q", c)
	}
	part := make([]byte, 2)
	must(f.ReadTensorAt("streamed", part, 3))
	if part[0] != 6 || part[1] != 5 {
		t.Errorf("ReadTensorAt = %v", part)
	}
	if err := f.ReadTensorAt("streamed", part, 4); err == nil {
		t.Error("read past the tensor's end accepted")
	}
	sub := make([]float32, 2)
	must(f.ReadFloat32s("a.bias", sub, 1))
	if sub[0] != 2 || sub[1] != 3 {
		t.Errorf("ReadFloat32s = %v", sub)
	}
	sr, err := f.SectionReader("a.bias")
	must(err)
	if sr.Size() != 12 {
		t.Errorf("section size %d", sr.Size())
	}
	if md := f.Metadata(); md["format"] != "pt" || md["z"] != "last" || len(md) != 2 {
		t.Errorf("metadata %v", md)
	}
	_, err = f.ReadTensor("nope")
	if !errors.Is(err, ErrTensorNotFound) || !strings.Contains(err.Error(), "nope") || !strings.Contains(err.Error(), path) {
		t.Errorf("missing tensor error: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestWriterDeterministic(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, reverse bool) []byte {
		ts := []Tensor{
			{"x", F16, []int64{2}, []byte{1, 2, 3, 4}},
			{"y", F16, []int64{1}, []byte{5, 6}},
			{"w", F64, []int64{}, make([]byte, 8)},
		}
		if reverse {
			ts[0], ts[2] = ts[2], ts[0]
		}
		md := map[string]string{"b": "2", "a": "1", "c": "3"}
		p := filepath.Join(dir, name)
		if err := WriteFile(p, ts, md); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(p)
		return b
	}
	a, b := write("a.safetensors", false), write("b.safetensors", true)
	if !bytes.Equal(a, b) {
		t.Errorf("same tensors in another order gave different bytes")
	}
	if !bytes.Contains(a, []byte(`{"__metadata__":{"a":"1","b":"2","c":"3"},"w":`)) {
		t.Errorf("header %q", headerOf(a))
	}
}

func TestWriterRefusals(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.safetensors")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add("t", F32, []int64{2}, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		dt    DType
		shape []int64
		data  []byte
		kind  error
	}{
		{"t", F32, []int64{2}, make([]byte, 8), ErrDuplicateTensor},
		{"__metadata__", F32, []int64{1}, make([]byte, 4), ErrInvalidHeaderDeserialization},
		{"bad\xffname", F32, []int64{1}, make([]byte, 4), ErrInvalidHeader},
		{"short", F32, []int64{2, 2}, make([]byte, 12), ErrTensorInvalidInfo},
		{"f4odd", F4, []int64{3}, make([]byte, 2), ErrMisalignedSlice},
		{"huge", U8, []int64{math.MaxInt64, 4}, nil, ErrValidationOverflow},
		{"neg", U8, []int64{-1}, nil, ErrValidationOverflow},
		{"nodtype", DType(0), []int64{1}, []byte{0}, ErrInvalidHeaderDeserialization},
	}
	for _, c := range cases {
		err := w.Add(c.name, c.dt, c.shape, c.data)
		if !errors.Is(err, c.kind) {
			t.Errorf("Add(%q, %s, %v): err = %v, want %v", c.name, c.dt, c.shape, err, c.kind)
		}
	}
	// A streamed source writing the wrong number of bytes fails Close and
	// leaves nothing behind.
	if err := w.AddFunc("liar", U8, []int64{4}, 4, func(wr io.Writer) error {
		_, err := wr.Write([]byte{1, 2, 3})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), "liar") {
		t.Errorf("Close with a short source: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left after a failed Close: %v", ents)
	}
}

func TestWriterAbortKeepsOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keep.safetensors")
	if err := WriteFile(path, []Tensor{{"a", U8, []int64{1}, []byte{42}}}, nil); err != nil {
		t.Fatal(err)
	}
	old, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add("b", U8, []int64{1}, []byte{7}); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory after Abort: %v", ents)
	}
	// Replace the file while the old one is open: the open File still
	// reads its own (renamed-over) contents.
	if err := WriteFile(path, []Tensor{{"a", U8, []int64{1}, []byte{43}}}, nil); err != nil {
		t.Fatal(err)
	}
	b, err := old.ReadTensor("a")
	if err != nil || b[0] != 42 {
		t.Errorf("old handle reads %v, %v; want [42]", b, err)
	}
	nf, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer nf.Close()
	if b, _ := nf.ReadTensor("a"); b[0] != 43 {
		t.Errorf("new file reads %v", b)
	}
}
