package safetensors

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeShards writes a three-shard checkpoint and its index into dir.
func writeShards(t *testing.T, dir string) {
	t.Helper()
	shards := map[string][]Tensor{
		"model-00001-of-00003.safetensors": {{"embed", F32, []int64{2}, f32bytes(1, 2)}, {"norm", F32, []int64{1}, f32bytes(3)}},
		"model-00002-of-00003.safetensors": {{"layer.0", F32, []int64{2}, f32bytes(4, 5)}},
		"model-00003-of-00003.safetensors": {{"lm_head", F32, []int64{1}, f32bytes(6)}},
	}
	var names []string
	for s, ts := range shards {
		if err := WriteFile(filepath.Join(dir, s), ts, map[string]string{"format": "pt"}); err != nil {
			t.Fatal(err)
		}
		names = append(names, s)
	}
	x, err := BuildIndex(dir, names)
	if err != nil {
		t.Fatal(err)
	}
	if ts, ok := x.TotalSize(); !ok || ts != 24 {
		t.Fatalf("BuildIndex total_size %d %v, want 24", ts, ok)
	}
	if err := WriteIndex(filepath.Join(dir, IndexFileName), x); err != nil {
		t.Fatal(err)
	}
}

func TestOpenModelSharded(t *testing.T) {
	dir := t.TempDir()
	writeShards(t, dir)
	for _, p := range []string{dir, filepath.Join(dir, IndexFileName)} {
		m, err := OpenModel(p)
		if err != nil {
			t.Fatalf("OpenModel(%s): %v", p, err)
		}
		if got := strings.Join(m.Names(), ","); got != "embed,layer.0,lm_head,norm" {
			t.Errorf("names %s", got)
		}
		f, ti, ok := m.Lookup("layer.0")
		if !ok || filepath.Base(f.Path()) != "model-00002-of-00003.safetensors" || ti.Size() != 8 {
			t.Errorf("Lookup(layer.0) = %v %+v %v", f, ti, ok)
		}
		v, err := m.Float32s("lm_head")
		if err != nil || v[0] != 6 {
			t.Errorf("lm_head = %v, %v", v, err)
		}
		var order []string
		for _, mt := range m.Tensors() {
			order = append(order, filepath.Base(mt.File.Path())[:11]+":"+mt.Name)
		}
		if got := strings.Join(order, ","); got != "model-00001:embed,model-00001:norm,model-00002:layer.0,model-00003:lm_head" {
			t.Errorf("storage order %s", got)
		}
		if len(m.Files()) != 3 || m.TotalSize() != 24 || len(m.Warnings()) != 0 {
			t.Errorf("files %d, total %d, warnings %v", len(m.Files()), m.TotalSize(), m.Warnings())
		}
		if _, err := m.ReadTensor("missing"); !errors.Is(err, ErrTensorNotFound) {
			t.Errorf("missing tensor: %v", err)
		}
		m.Close()
	}
}

func TestOpenModelSingleAndDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := WriteFile(filepath.Join(dir, "a.safetensors"), []Tensor{{"x", U8, []int64{1}, []byte{1}}}, nil); err != nil {
		t.Fatal(err)
	}
	m, err := OpenModel(filepath.Join(dir, "a.safetensors"))
	if err != nil || m.Len() != 1 {
		t.Fatalf("single file: %v", err)
	}
	m.Close()
	if err := WriteFile(filepath.Join(dir, "b.safetensors"), []Tensor{{"y", U8, []int64{1}, []byte{2}}}, nil); err != nil {
		t.Fatal(err)
	}
	m, err = OpenModel(dir)
	if err != nil || m.Len() != 2 {
		t.Fatalf("directory: %v", err)
	}
	m.Close()
	if err := WriteFile(filepath.Join(dir, "c.safetensors"), []Tensor{{"x", U8, []int64{1}, []byte{3}}}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = OpenModel(dir)
	if !errors.Is(err, ErrDuplicateTensor) || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("name in two files: %v", err)
	}
}

func TestOpenModelIndexErrors(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(t *testing.T, dir string)
		kind    error
		mention []string
	}{
		{"missing shard", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "model-00002-of-00003.safetensors"))
		}, ErrInvalidIndex, []string{"model-00002-of-00003.safetensors", "layer.0"}},
		{"name missing from index", func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(x *Index) { delete(x.WeightMap, "norm") })
		}, ErrInvalidIndex, []string{"norm", "missing from weight_map"}},
		{"tensor in another shard", func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(x *Index) { x.WeightMap["norm"] = "model-00003-of-00003.safetensors" })
		}, ErrInvalidIndex, []string{"norm", "model-00001-of-00003.safetensors"}},
		{"index lists absent tensor", func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(x *Index) { x.WeightMap["ghost"] = "model-00003-of-00003.safetensors" })
		}, ErrInvalidIndex, []string{"ghost", "model-00003-of-00003.safetensors"}},
		{"tensor in two shards", func(t *testing.T, dir string) {
			if err := WriteFile(filepath.Join(dir, "model-00003-of-00003.safetensors"),
				[]Tensor{{"lm_head", F32, []int64{1}, f32bytes(6)}, {"norm", F32, []int64{1}, f32bytes(3)}}, nil); err != nil {
				t.Fatal(err)
			}
		}, ErrDuplicateTensor, []string{"norm", "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"}},
		{"duplicate key in weight_map", func(t *testing.T, dir string) {
			p := filepath.Join(dir, IndexFileName)
			b, _ := os.ReadFile(p)
			s := strings.Replace(string(b), `"norm": "model-00001-of-00003.safetensors"`,
				`"norm": "model-00001-of-00003.safetensors", "norm": "model-00003-of-00003.safetensors"`, 1)
			os.WriteFile(p, []byte(s), 0o644)
		}, ErrInvalidIndex, []string{"duplicate key", "norm"}},
		{"shard escaping the directory", func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(x *Index) { x.WeightMap["norm"] = "../model-00001-of-00003.safetensors" })
		}, ErrInvalidIndex, []string{"norm"}},
		{"bad shard", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "model-00003-of-00003.safetensors"), []byte("version https://git-lfs.github.com/spec/v1\n"), 0o644)
		}, ErrHeaderTooLarge, []string{"model-00003-of-00003.safetensors", "Git LFS"}},
		{"total_size mismatch is only a warning", func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(x *Index) { x.Metadata["total_size"] = 99 })
		}, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeShards(t, dir)
			c.mutate(t, dir)
			m, err := OpenModel(dir)
			if c.kind == nil {
				if err != nil {
					t.Fatal(err)
				}
				if w := m.Warnings(); len(w) != 1 || !strings.Contains(w[0], "total_size") {
					t.Errorf("warnings %v", w)
				}
				m.Close()
				return
			}
			if !errors.Is(err, c.kind) {
				t.Fatalf("err = %v, want %v", err, c.kind)
			}
			for _, s := range c.mention {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func rewriteIndex(t *testing.T, dir string, edit func(*Index)) {
	t.Helper()
	p := filepath.Join(dir, IndexFileName)
	x, err := ReadIndex(p)
	if err != nil {
		t.Fatal(err)
	}
	edit(x)
	if err := WriteIndex(p, x); err != nil {
		t.Fatal(err)
	}
}
