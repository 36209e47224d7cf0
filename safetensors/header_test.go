package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// build makes file bytes from a header string and a data section.
func build(hdr string, data []byte) []byte {
	b := make([]byte, 8, 8+len(hdr)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(hdr)))
	return append(append(b, hdr...), data...)
}

func openBytes(b []byte) (*File, error) {
	return OpenReader(bytes.NewReader(b), int64(len(b)), "mem.safetensors")
}

func TestHeaderEdgeCases(t *testing.T) {
	entry := `{"dtype":"F32","shape":[1],"data_offsets":[0,4]}`
	cases := []struct {
		name    string
		file    []byte
		kind    error // nil: accepted
		mention string
	}{
		{"huge float in ignored field", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1e400}}`, make([]byte, 4)), ErrInvalidHeaderDeserialization, "out of range"},
		{"tiny float in ignored field", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":-1e-400}}`, make([]byte, 4)), nil, ""},
		{"array form too short", build(`{"a":["F32",[1]]}`, make([]byte, 4)), ErrInvalidHeaderDeserialization, "array form"},
		{"array form too long", build(`{"a":["F32",[1],[0,4],1]}`, make([]byte, 4)), ErrInvalidHeaderDeserialization, "more than 3"},
		{"dtype map with a value", build(`{"a":{"dtype":{"F32":1},"shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)), ErrInvalidHeaderDeserialization, "null"},
		{"dtype map with two keys", build(`{"a":{"dtype":{"F32":null,"F16":null},"shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)), ErrInvalidHeaderDeserialization, "one key"},
		{"offsets past u64", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551616]}}`, make([]byte, 4)), ErrInvalidHeaderDeserialization, "64 bits"},
		{"git lfs pointer", []byte("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 12\n"), ErrHeaderTooLarge, "Git LFS"},
		{"truncated", build(`{"a":`+entry+`}`, make([]byte, 2)), ErrMetadataIncompleteBuffer, "expected file size 66, actual 64"},
		{"error names the tensor and shape", build(`{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,4]}}`, make([]byte, 4)), ErrTensorInvalidInfo, `tensor "w": invalid shape, data type, or offset for tensor: F32 shape [2,3] needs 24 bytes`},
	}
	for _, c := range cases {
		f, err := openBytes(c.file)
		if c.kind == nil {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			} else {
				f.Close()
			}
			continue
		}
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.mention) || !strings.Contains(err.Error(), "mem.safetensors") {
			t.Errorf("%s: err = %v, want %v mentioning %q", c.name, err, c.kind, c.mention)
		}
	}
}

func TestHugeDimsAndDuplicates(t *testing.T) {
	hdr := `{"z":{"dtype":"U8","shape":[0,18446744073709551615],"data_offsets":[0,0]},` +
		`"a":{"dtype":"U8","shape":[2],"data_offsets":[9,99]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`
	f, err := openBytes(build(hdr, []byte{1, 2}))
	if err != nil {
		t.Fatal(err)
	}
	z, _ := f.Lookup("z")
	if z.Shape[0] != 0 || z.Shape[1] != -1 || z.Dims()[1] != 1<<64-1 || z.NumElements() != 0 || z.Size() != 0 {
		t.Errorf("z = %+v, dims %v", z, z.Dims())
	}
	if d := f.DuplicateNames(); len(d) != 1 || d[0] != "a" {
		t.Errorf("DuplicateNames = %v", d)
	}
	a, _ := f.Lookup("a")
	if a.Begin != 0 || a.End != 2 || f.Len() != 2 {
		t.Errorf("a = %+v, %d tensors", a, f.Len())
	}
}
