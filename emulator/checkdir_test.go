package emulator

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

func TestCheckDumpDir(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	const s, rows, cols = 2, 40, 50
	vals := make([]float32, s*rows*cols)
	for i := range vals {
		vals[i] = float32(r.NormFloat64() * 0.05)
	}
	layout := Layout{Shape: []int64{s, rows, cols}, Tile: bfp.Tile32x32, Transposed: true}
	packed := packSlices(t, bfp.BFP4, bfp.Tile32x32, vals, s, rows, cols, true)
	norm := make([]byte, 0, 128)
	for i := 0; i < 64; i++ {
		norm = binary.LittleEndian.AppendUint16(norm, uint16(0x3f80+i))
	}
	alog := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 0x3f800001), 0xc0000000), 0x00000001)
	stored := map[string]*StoredTensor{
		"experts.w1": {Name: "experts.w1", Format: "BFP4_b", Layout: layout, Data: packed},
		"norm":       {Name: "norm", Format: "BF16", Layout: Layout{Shape: []int64{64}, Tile: bfp.Tile32x32}, Data: norm},
		"alog":       {Name: "alog", Format: "F32", Layout: Layout{Shape: []int64{3}}, Data: alog},
		"ids":        {Name: "ids", Format: "I64", Layout: Layout{Shape: []int64{1}}, Data: make([]byte, 8)},
	}
	lookup := func(name string) (*StoredTensor, error) {
		st, ok := stored[name]
		if !ok {
			return nil, fmt.Errorf("checkpoint: %q: %w", name, ErrNotStored)
		}
		return st, nil
	}
	want, err := DecodeStored(bfp.BFP4, layout, packed)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeDump := func(flip int) {
		f32 := make([]byte, 0, 4*len(want))
		for i, h := range want {
			b := uint32(h) << 16
			if i == flip {
				b ^= 1 << 22
			}
			f32 = binary.LittleEndian.AppendUint32(f32, b)
		}
		writeLogitsFile(t, filepath.Join(dir, "a.safetensors"), "experts.w1", "F32", layout.Shape, f32)
	}
	writeDump(-1)
	writeLogitsFile(t, filepath.Join(dir, "b.safetensors"), "norm", "BF16", []int64{64}, norm)
	writeLogitsFile(t, filepath.Join(dir, "c.safetensors"), "extra", "F32", []int64{1}, make([]byte, 4))
	writeLogitsFile(t, filepath.Join(dir, "d.safetensors"), "alog", "F32", []int64{3}, alog)
	writeLogitsFile(t, filepath.Join(dir, "e.safetensors"), "ids", "F32", []int64{1}, make([]byte, 4))

	rep, err := CheckDumpDir(context.Background(), dir, lookup, 5)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mismatches != 0 || len(rep.Checked) != 3 || len(rep.Skipped) != 2 || rep.Skipped[0].Tensor != "extra" ||
		rep.Skipped[1].Tensor != "ids" || !strings.Contains(rep.Skipped[1].Reason, "I64 is not modelled") {
		t.Fatalf("clean dump: %+v", rep)
	}
	// One flipped bit in element [1, 7, 33] is found and named.
	flip := 1*rows*cols + 7*cols + 33
	writeDump(flip)
	rep, err = CheckDumpDir(context.Background(), dir, lookup, 5)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mismatches != 1 || len(rep.Checked) != 3 || rep.Checked[1].Tensor != "experts.w1" || len(rep.Checked[1].First) != 1 {
		t.Fatalf("flipped bit: %+v", rep)
	}
	m := rep.Checked[1].First[0]
	// Transposed storage: the element sits at packed (33, 7): tile (1, 0),
	// element (1, 7) in it.
	if !slices.Equal(m.Index, []int64{1, 7, 33}) || m.TileRow != 1 || m.TileCol != 0 || m.InTileRow != 1 || m.InTileCol != 7 || m.Got^m.Want != 1<<22 {
		t.Errorf("mismatch %+v", m)
	}
	if !strings.Contains(m.String(), `tensor "experts.w1" element [1 7 33]: tile (1,0) element (1,7)`) {
		t.Errorf("description %q", m.String())
	}
	// A dump of the wrong shape is an error naming file and tensor.
	writeLogitsFile(t, filepath.Join(dir, "b.safetensors"), "norm", "BF16", []int64{8, 8}, norm)
	if _, err := CheckDumpDir(context.Background(), dir, lookup, 5); err == nil || !strings.Contains(err.Error(), `tensor "norm" has shape [8 8]`) {
		t.Errorf("wrong shape: %v", err)
	}
	// An F32 tensor dumped as BF16 cannot match bit for bit.
	writeLogitsFile(t, filepath.Join(dir, "b.safetensors"), "norm", "BF16", []int64{64}, norm)
	writeLogitsFile(t, filepath.Join(dir, "d.safetensors"), "alog", "BF16", []int64{3}, make([]byte, 6))
	if _, err := CheckDumpDir(context.Background(), dir, lookup, 5); err == nil || !strings.Contains(err.Error(), `"alog" is stored as F32`) {
		t.Errorf("BF16 dump of an F32 tensor: %v", err)
	}
	if _, err := CheckDumpDir(context.Background(), t.TempDir(), lookup, 5); err == nil {
		t.Error("empty directory accepted")
	}
}
