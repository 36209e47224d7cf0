package ttnn

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the reader: it must never panic, and
// a file it accepts must write back to the same header (Marshal of the
// decoded spec and mesh gives a file that parses to an equal header).
func FuzzParse(f *testing.F) {
	for _, name := range []string{
		"golden_bfp8_40x48_dtype_BFLOAT8_B_layout_TILE.tensorbin",
		"golden_bfp4_40x48_dtype_BFLOAT4_B_layout_TILE.tensorbin",
	} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, spec := range testSpecs() {
		n, _ := spec.PayloadSize()
		data, err := Marshal(spec, []uint32{2, 2}, make([]byte, n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, payload, err := Parse(data)
		if err != nil {
			return
		}
		if int64(len(payload)) != file.PayloadSize {
			t.Fatalf("accepted a payload of %d bytes for a spec needing %d", len(payload), file.PayloadSize)
		}
		if file.Topology == nil || len(file.Shards) != len(file.Topology.MeshCoords) {
			return // not a layout this writer produces
		}
		spec := file.Spec
		again, err := Marshal(spec, file.MeshShape, payload)
		if err != nil {
			t.Fatalf("accepted header does not write back: %v", err)
		}
		f2, p2, err := Parse(again)
		if err != nil {
			t.Fatalf("rewritten file does not parse: %v", err)
		}
		if !bytes.Equal(p2, payload) || f2.PayloadSize != file.PayloadSize {
			t.Fatal("rewritten file differs")
		}
	})
}
