package manifest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
)

// FileAlignment is the alignment of the data section of every safetensors
// file this package writes: the header is padded with spaces so the data
// section starts on a multiple of it.
const FileAlignment = 64

// HeaderTensor is one tensor of a file to be written, in data order.
type HeaderTensor struct {
	Name  string
	DType string
	Shape []int64
	Size  int64
}

// EncodeSTHeader returns the complete prefix of a safetensors file (the
// 8-byte length and the JSON header padded with spaces so that the data
// section starts at a multiple of FileAlignment) and the absolute file offset
// of each tensor's data. Tensors are laid out back to back in the given
// order; the JSON lists __metadata__ first (keys sorted) and then the
// tensors in data order, compact, so the bytes depend only on the input.
func EncodeSTHeader(ts []HeaderTensor, md map[string]string) ([]byte, []int64, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	first := true
	if len(md) > 0 {
		keys := make([]string, 0, len(md))
		for k := range md {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString(`"__metadata__":{`)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(&b, k)
			b.WriteByte(':')
			writeJSONString(&b, md[k])
		}
		b.WriteByte('}')
		first = false
	}
	seen := make(map[string]bool, len(ts))
	var off int64
	rel := make([]int64, len(ts))
	for i, t := range ts {
		if t.Name == "__metadata__" || seen[t.Name] {
			return nil, nil, fmt.Errorf("manifest: tensor name %q repeated or reserved", t.Name)
		}
		seen[t.Name] = true
		if !first {
			b.WriteByte(',')
		}
		first = false
		writeJSONString(&b, t.Name)
		b.WriteString(`:{"dtype":`)
		writeJSONString(&b, t.DType)
		b.WriteString(`,"shape":[`)
		for j, d := range t.Shape {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		b.WriteString(`],"data_offsets":[`)
		rel[i] = off
		b.WriteString(strconv.FormatInt(off, 10))
		b.WriteByte(',')
		off += t.Size
		b.WriteString(strconv.FormatInt(off, 10))
		b.WriteString("]}")
	}
	b.WriteByte('}')
	n := 8 + b.Len()
	if pad := (FileAlignment - n%FileAlignment) % FileAlignment; pad > 0 {
		b.Write(bytes.Repeat([]byte{' '}, pad))
	}
	out := make([]byte, 8, 8+b.Len())
	binary.LittleEndian.PutUint64(out, uint64(b.Len()))
	out = append(out, b.Bytes()...)
	base := int64(len(out))
	for i := range rel {
		rel[i] += base
	}
	return out, rel, nil
}

func writeJSONString(w io.Writer, s string) {
	enc, _ := json.Marshal(s) // a string always marshals
	w.Write(enc)
}
