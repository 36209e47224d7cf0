package safetensors

import (
	"bytes"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// A File is documented as safe for concurrent use: readers of different
// tensors (and of the same one) run at once.
func TestConcurrentReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.safetensors")
	var ts []Tensor
	for i := 0; i < 16; i++ {
		data := bytes.Repeat([]byte{byte(i)}, 4096)
		ts = append(ts, Tensor{Name: fmt.Sprintf("t%02d", i), DType: U8, Shape: []int64{4096}, Data: data})
	}
	if err := WriteFile(path, ts, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; k < 32; k++ {
				i := (g + k) % 16
				name := fmt.Sprintf("t%02d", i)
				b, err := f.ReadTensor(name)
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(b, bytes.Repeat([]byte{byte(i)}, 4096)) {
					errs <- fmt.Errorf("%s: wrong bytes", name)
					return
				}
				if v, err := f.Float32s(name); err != nil || v[0] != float32(i) {
					errs <- fmt.Errorf("%s: Float32s %v, %v", name, v[:1], err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestParseBuffersAreNotShared checks that a parsed header keeps nothing of
// the parsing buffers that later Opens reuse: names, shapes and metadata of
// the first file survive opening many other files, also concurrently.
func TestParseBuffersAreNotShared(t *testing.T) {
	dir := t.TempDir()
	write := func(name, prefix string, n int) string {
		var ts []Tensor
		for i := 0; i < n; i++ {
			ts = append(ts, Tensor{Name: fmt.Sprintf("%s.%03d", prefix, i), DType: F32, Shape: []int64{int64(i%3 + 1), 2}, Data: make([]byte, 4*2*(i%3+1))})
		}
		p := filepath.Join(dir, name)
		if err := WriteFile(p, ts, map[string]string{"who": prefix}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	first, err := Open(write("a.safetensors", "alpha", 50))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	others := []string{write("b.safetensors", "zzzzz", 80), write("c.safetensors", "q", 7)}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				f, err := Open(others[(g+i)%len(others)])
				if err != nil {
					t.Error(err)
					return
				}
				f.Close()
			}
		}(g)
	}
	wg.Wait()
	for i, ti := range first.Tensors() {
		want := fmt.Sprintf("alpha.%03d", i)
		if ti.Name != want || len(ti.Shape) != 2 || ti.Shape[0] != int64(i%3+1) || ti.Shape[1] != 2 {
			t.Fatalf("tensor %d became %q %v, want %q [%d 2]", i, ti.Name, ti.Shape, want, i%3+1)
		}
		if _, ok := first.Lookup(want); !ok {
			t.Fatalf("lookup of %q fails", want)
		}
	}
	if first.Metadata()["who"] != "alpha" {
		t.Errorf("metadata became %v", first.Metadata())
	}
}
