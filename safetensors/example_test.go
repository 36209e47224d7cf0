package safetensors_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/safetensors"
)

// Write a small file, open it, and read a tensor back: its raw bytes with
// ReadTensor, or converted with Float32s.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "safetensors-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "model.safetensors")

	data := make([]byte, 4*3)
	for i, v := range []float32{1.5, -2, 0.25} {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	if err := safetensors.WriteFile(path, []safetensors.Tensor{{Name: "w", DType: safetensors.F32, Shape: []int64{1, 3}, Data: data}}, nil); err != nil {
		panic(err)
	}

	f, err := safetensors.Open(path)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	info, _ := f.Lookup("w")
	raw, err := f.ReadTensor("w")
	if err != nil {
		panic(err)
	}
	vals, err := f.Float32s("w")
	if err != nil {
		panic(err)
	}
	fmt.Println(f.Names(), info.DType, info.Shape, len(raw), vals)
	// Output: [w] F32 [1 3] 12 [1.5 -2 0.25]
}
