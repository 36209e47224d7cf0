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
