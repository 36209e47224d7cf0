package emulator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/safetensors"
)

// StoredTensor is one tensor as a checkpoint stores it.
type StoredTensor struct {
	Name string
	// Format is the stored format: "BFP8_b" or "BFP4_b" (Data is packed
	// tiles in Layout), or "BF16" or "F32" (Data is little-endian elements
	// in logical order). Other formats are not checked.
	Format string
	Layout Layout
	Data   []byte
}

// ErrNotStored is returned by a StoredLookup for a name the checkpoint does
// not hold.
var ErrNotStored = errors.New("tensor not in the checkpoint")

// StoredLookup returns a checkpoint's stored tensor by name, or an error
// wrapping ErrNotStored.
type StoredLookup func(name string) (*StoredTensor, error)

// CheckpointLookup is the StoredLookup of a native checkpoint: a tensor's
// packed bytes (checked against their sha256) with its format and layout.
func CheckpointLookup(c *manifest.Checkpoint) StoredLookup {
	return func(name string) (*StoredTensor, error) {
		t, err := c.TensorInfo(name)
		if errors.Is(err, manifest.ErrNoTensor) {
			return nil, fmt.Errorf("%w: %w", ErrNotStored, err)
		}
		if err != nil {
			return nil, err
		}
		st := &StoredTensor{Name: name, Format: t.DType, Layout: Layout{Shape: t.Shape}}
		if f, tile, ok := t.BFP(); ok {
			st.Format = f.String()
			st.Layout.Tile = tile
			st.Layout.Transposed = t.Orientation == manifest.OrientTransposed
		}
		if st.Data, err = c.ReadPacked(name); err != nil {
			return nil, err
		}
		return st, nil
	}
}

// EmulatedDecode returns what the device unpacker places in a source
// register for each element of a stored tensor, as BF16 patterns in logical
// row-major order.
func EmulatedDecode(st *StoredTensor) ([]uint16, error) {
	switch strings.ToUpper(st.Format) {
	case "BFP8_B", "BFP4_B":
		f, err := bfp.ParseFormat(st.Format)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", st.Name, err)
		}
		v, err := DecodeStored(f, st.Layout, st.Data)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", st.Name, err)
		}
		return v, nil
	case "BF16":
		n := st.Layout.Elements()
		if len(st.Data) != 2*n {
			return nil, fmt.Errorf("emulator: tensor %q: %d bytes of BF16 for shape %v", st.Name, len(st.Data), st.Layout.Shape)
		}
		v := make([]uint16, n)
		for i := range v {
			v[i] = binary.LittleEndian.Uint16(st.Data[2*i:])
		}
		return v, nil
	}
	return nil, fmt.Errorf("emulator: tensor %q: stored format %q is not modelled", st.Name, st.Format)
}

// SkippedTensor is a dumped tensor that could not be checked, and why.
type SkippedTensor struct {
	Tensor string `json:"tensor"`
	File   string `json:"file"`
	Reason string `json:"reason"`
}

// CheckReport is the result of checking a directory of device dumps.
type CheckReport struct {
	Checked    []CheckResult   `json:"checked"`
	Skipped    []SkippedTensor `json:"skipped,omitempty"`
	Mismatches int             `json:"mismatches"` // over all checked tensors
}

// CheckDumpDir checks every tensor of every *.safetensors file under dir
// (tensors read back from a device, BF16 or F32, in the stored tensors'
// logical shapes) against the emulated decode of the tensor of the same
// name in a checkpoint (EmulatedDecode; a tensor stored as F32 against its
// stored bits, which needs an F32 dump), bit for bit. Tensors the checkpoint does not hold,
// or holds in a format that is not modelled, are reported as skipped; a
// dump whose dtype or shape does not match is an error naming the file and
// tensor. At most limit mismatches per tensor are listed (all are counted).
// Tensors are checked in name order.
func CheckDumpDir(ctx context.Context, dir string, lookup StoredLookup, limit int) (*CheckReport, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".safetensors") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("emulator: no .safetensors files under %s", dir)
	}
	sort.Strings(files)
	type item struct {
		name, path string
	}
	var items []item
	seen := map[string]string{}
	for _, p := range files {
		f, err := safetensors.Open(p)
		if err != nil {
			return nil, err
		}
		for _, t := range f.Tensors() {
			if prev, dup := seen[t.Name]; dup {
				f.Close()
				return nil, fmt.Errorf("emulator: tensor %q is dumped twice, in %s and %s", t.Name, prev, p)
			}
			seen[t.Name] = p
			items = append(items, item{t.Name, p})
		}
		f.Close()
	}
	sort.Slice(items, func(i, j int) bool { return items[i].name < items[j].name })
	rep := &CheckReport{}
	for _, it := range items {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		st, err := lookup(it.name)
		if errors.Is(err, ErrNotStored) {
			rep.Skipped = append(rep.Skipped, SkippedTensor{it.name, it.path, "not in the checkpoint"})
			continue
		}
		if err != nil {
			return nil, err
		}
		var want Dump
		switch strings.ToUpper(st.Format) {
		case "BFP8_B", "BFP4_B", "BF16":
			w16, err := EmulatedDecode(st)
			if err != nil {
				return nil, err
			}
			want = bf16Dump(w16)
		case "F32":
			n := st.Layout.Elements()
			if len(st.Data) != 4*n {
				return nil, fmt.Errorf("emulator: tensor %q: %d bytes of F32 for shape %v", st.Name, len(st.Data), st.Layout.Shape)
			}
			want = Dump{Bits: make([]uint32, n)}
			for i := range want.Bits {
				want.Bits[i] = binary.LittleEndian.Uint32(st.Data[4*i:])
			}
		default:
			rep.Skipped = append(rep.Skipped, SkippedTensor{it.name, it.path, fmt.Sprintf("stored format %s is not modelled", st.Format)})
			continue
		}
		d, err := readDump(it.path, it.name, st.Layout.Shape)
		if err != nil {
			return nil, err
		}
		res, err := CheckDumpBits(it.name, st.Layout, want, d, limit)
		if err != nil {
			return nil, err
		}
		rep.Checked = append(rep.Checked, res)
		rep.Mismatches += res.Mismatches
	}
	return rep, nil
}

// readDump reads a dumped tensor's bit patterns, checking dtype and shape.
func readDump(path, name string, shape []int64) (Dump, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return Dump{}, err
	}
	defer f.Close()
	info, _ := f.Lookup(name)
	if !slices.Equal(info.Shape, shape) {
		return Dump{}, fmt.Errorf("%s: tensor %q has shape %v; the checkpoint's is %v", path, name, info.Shape, shape)
	}
	raw, err := f.ReadTensor(name)
	if err != nil {
		return Dump{}, err
	}
	var d Dump
	switch info.DType {
	case safetensors.BF16:
		d.BF16 = true
		d.Bits = make([]uint32, len(raw)/2)
		for i := range d.Bits {
			d.Bits[i] = uint32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	case safetensors.F32:
		d.Bits = make([]uint32, len(raw)/4)
		for i := range d.Bits {
			d.Bits[i] = binary.LittleEndian.Uint32(raw[4*i:])
		}
	default:
		return Dump{}, fmt.Errorf("%s: tensor %q is %v; a dump must be BF16 or F32", path, name, info.DType)
	}
	return d, nil
}
