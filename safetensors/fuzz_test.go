package safetensors

import (
	"bytes"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// FuzzOpen feeds arbitrary bytes to the reader (the same code path Open
// uses after opening the file). It must never panic, every error must carry
// one of the format's error kinds, and an accepted file must have tensors
// that tile the data section exactly: in range, no overlap, sizes matching
// shape and dtype. The seeds are the whole conformance corpus, read in
// place.
func FuzzOpen(f *testing.F) {
	dir := testdata.Dir(f, "safetensors")
	for _, c := range readCases(f, dir) {
		data, err := os.ReadFile(filepath.Join(dir, c.file))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := OpenReader(bytes.NewReader(data), int64(len(data)), "fuzz")
		// The general parser alone must decide exactly as the parser with
		// its fast path for canonical entries.
		noFastEntry = true
		slow, serr := OpenReader(bytes.NewReader(data), int64(len(data)), "fuzz")
		noFastEntry = false
		if (err == nil) != (serr == nil) || KindName(err) != KindName(serr) {
			t.Fatalf("fast path: %v; general path: %v", err, serr)
		}
		if err != nil {
			if KindName(err) == "" {
				t.Fatalf("error without a format kind: %v", err)
			}
			return
		}
		if !slices.EqualFunc(file.Tensors(), slow.Tensors(), func(a, b TensorInfo) bool {
			return a.Name == b.Name && a.DType == b.DType && a.Begin == b.Begin && a.End == b.End && slices.Equal(a.Dims(), b.Dims())
		}) {
			t.Fatalf("fast and general paths list different tensors")
		}
		checkTiling(t, file, int64(len(data)))
	})
}

// checkTiling verifies the invariants of an accepted file independently of
// the validation code.
func checkTiling(t *testing.T, f *File, size int64) {
	t.Helper()
	if f.HeaderSize() > MaxHeaderSize || f.DataOffset() != 8+f.HeaderSize() || f.DataOffset() > size {
		t.Fatalf("header size %d, data offset %d, file %d", f.HeaderSize(), f.DataOffset(), size)
	}
	dataLen := size - f.DataOffset()
	var cursor int64
	seen := map[string]bool{}
	for _, ti := range f.Tensors() {
		if seen[ti.Name] {
			t.Fatalf("tensor %q listed twice", ti.Name)
		}
		seen[ti.Name] = true
		if ti.Begin != cursor || ti.End < ti.Begin || ti.End > dataLen {
			t.Fatalf("tensor %q at [%d,%d): gap, overlap or out of range (cursor %d, data %d)", ti.Name, ti.Begin, ti.End, cursor, dataLen)
		}
		cursor = ti.End
		// Size from the exact dims, with overflow checks of our own.
		n, ovf := uint64(1), false
		for _, d := range ti.Dims() {
			hi, lo := bits.Mul64(n, d)
			ovf = ovf || hi != 0
			n = lo
		}
		hi, nb := bits.Mul64(n, uint64(ti.DType.Bits()))
		if ovf || hi != 0 || nb%8 != 0 || nb/8 != uint64(ti.Size()) {
			t.Fatalf("tensor %q: %s %v does not fill [%d,%d)", ti.Name, ti.DType, ti.Dims(), ti.Begin, ti.End)
		}
		if got, ok := f.Lookup(ti.Name); !ok || got.Begin != ti.Begin {
			t.Fatalf("Lookup(%q) disagrees with Tensors", ti.Name)
		}
		if _, err := f.ReadTensor(ti.Name); err != nil {
			t.Fatalf("ReadTensor(%q): %v", ti.Name, err)
		}
	}
	if cursor != dataLen {
		t.Fatalf("tensors cover %d of %d data bytes", cursor, dataLen)
	}
}
