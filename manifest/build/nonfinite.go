package build

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sort"

	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/safetensors"
)

// ErrNonFinite is wrapped by the error a build returns when a source
// tensor holds NaN or Inf and BuildOptions.AllowNonFinite is not set.
var ErrNonFinite = errors.New("the source tensor holds a non-finite value")

// nonFiniteError names a tensor's first NaN or Inf: its index in the
// stored tensor's logical shape and its value.
func nonFiniteError(st *storedTensor, vals []float32) error {
	return nonFiniteErrorHint(st, vals, "Pass --allow-nonfinite (BuildOptions.AllowNonFinite) to store it anyway; the manifest then lists the tensor under ttquant.nonfinite_tensors")
}

// gptqNonFiniteHint explains why GPTQ refuses even when non-finite values
// are allowed.
const gptqNonFiniteHint = "GPTQ cannot quantize a matrix holding NaN or Inf, even with --allow-nonfinite; leave this layer out of --layers to round it to nearest instead"

func nonFiniteErrorHint(st *storedTensor, vals []float32, hint string) error {
	i := 0
	for i < len(vals) && !isNonFinite(vals[i]) {
		i++
	}
	if i == len(vals) {
		return nil
	}
	return fmt.Errorf("tensor %s: %w: element %v (flat index %d) is %v; a NaN or Inf in a weight is damage in the source, and rounding spreads it (a BFP block loses its other values). %s",
		st.name, ErrNonFinite, multiIndex(i, st.shape), i, vals[i], hint)
}

func isNonFinite(x float32) bool {
	return math.Float32bits(x)&0x7f800000 == 0x7f800000
}

// multiIndex turns a row-major flat index into an index in shape.
func multiIndex(flat int, shape []int64) []int64 {
	idx := make([]int64, len(shape))
	f := int64(flat)
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = f % shape[d]
			f /= shape[d]
		}
	}
	return idx
}

// checkSourceFinite refuses a tensor whose source values are not all
// finite, unless the build allows it.
func (b *builder) checkSourceFinite(st *storedTensor, vals []float32, finite bool) error {
	if finite || b.opt.AllowNonFinite {
		return nil
	}
	return nonFiniteError(st, vals)
}

// maxBadOffsets bounds the non-finite elements recorded per source tensor.
const maxBadOffsets = 4096

// sourceBad records a source tensor's non-finite elements found while
// hashing: their byte offsets within the tensor's data (at most
// maxBadOffsets; more says there were others).
type sourceBad struct {
	dtype   safetensors.DType
	offsets []int64
	values  []float64 // NaN, +Inf or -Inf, per offset
	more    bool
}

// badValue is the non-finite value of an element elemBad accepted: ±Inf
// when its mantissa is zero, NaN otherwise.
func badValue(dt safetensors.DType, b []byte) float64 {
	var sign bool
	var mant uint64
	switch dt {
	case safetensors.BF16:
		v := binary.LittleEndian.Uint16(b)
		sign, mant = v&0x8000 != 0, uint64(v&0x7f)
	case safetensors.F16:
		v := binary.LittleEndian.Uint16(b)
		sign, mant = v&0x8000 != 0, uint64(v&0x3ff)
	case safetensors.F32:
		v := binary.LittleEndian.Uint32(b)
		sign, mant = v&0x80000000 != 0, uint64(v&0x7fffff)
	case safetensors.F64:
		v := binary.LittleEndian.Uint64(b)
		sign, mant = v>>63 != 0, v&(1<<52-1)
	}
	switch {
	case mant != 0:
		return math.NaN()
	case sign:
		return math.Inf(-1)
	}
	return math.Inf(1)
}

// finiteScan finds the non-finite elements of a shard's float tensors in
// the chunks the hashing pass reads (manifest.HashFileScan): each tensor's
// elements are checked once, an element split between two chunks
// included.
type finiteScan struct {
	tensors []safetensors.TensorInfo // float tensors, by offset
	base    int64                    // the data section's offset in the file
	next    []int64                  // per tensor: the next element's file offset
	first   int                      // the first tensor not yet done
	carry   []byte                   // the previous chunk's last bytes
	carryAt int64
	bad     map[string]*sourceBad
}

func newFiniteScan(f *safetensors.File) *finiteScan {
	s := &finiteScan{base: f.DataOffset(), bad: map[string]*sourceBad{}}
	for _, t := range f.Tensors() {
		switch t.DType {
		case safetensors.BF16, safetensors.F16, safetensors.F32, safetensors.F64:
			s.tensors = append(s.tensors, t)
		}
	}
	sort.Slice(s.tensors, func(i, j int) bool { return s.tensors[i].Begin < s.tensors[j].Begin })
	for _, t := range s.tensors {
		s.next = append(s.next, s.base+t.Begin)
	}
	return s
}

func elemBad(dt safetensors.DType, b []byte) bool {
	switch dt {
	case safetensors.BF16:
		return binary.LittleEndian.Uint16(b)&0x7f80 == 0x7f80
	case safetensors.F16:
		return binary.LittleEndian.Uint16(b)&0x7c00 == 0x7c00
	case safetensors.F32:
		return binary.LittleEndian.Uint32(b)&0x7f800000 == 0x7f800000
	case safetensors.F64:
		return binary.LittleEndian.Uint64(b)&0x7ff0000000000000 == 0x7ff0000000000000
	}
	return false
}

func (s *finiteScan) chunk(off int64, p []byte) {
	data, at := p, off
	if len(s.carry) > 0 && s.carryAt+int64(len(s.carry)) == off {
		data, at = append(s.carry, p...), s.carryAt
	}
	end := at + int64(len(data))
	for i := s.first; i < len(s.tensors); i++ {
		t := s.tensors[i]
		tEnd := s.base + t.End
		if s.base+t.Begin >= end {
			break
		}
		es := int64(t.DType.Bits() / 8)
		if n := (min(tEnd, end) - s.next[i]) / es; n > 0 && s.next[i] >= at {
			from := s.next[i] - s.base - t.Begin
			seg := data[s.next[i]-at : s.next[i]-at+n*es]
			for k := 0; k < len(seg); k += int(es) {
				if !elemBad(t.DType, seg[k:]) {
					continue
				}
				b := s.bad[t.Name]
				if b == nil {
					b = &sourceBad{dtype: t.DType}
					s.bad[t.Name] = b
				}
				if len(b.offsets) < maxBadOffsets {
					b.offsets = append(b.offsets, from+int64(k))
					b.values = append(b.values, badValue(t.DType, seg[k:]))
				} else {
					b.more = true
				}
			}
			s.next[i] += n * es
		}
		if s.next[i]+es > tEnd && i == s.first {
			s.first++
		}
	}
	keep := min(int64(len(data)), 7)
	s.carry = append(s.carry[:0], data[int64(len(data))-keep:]...)
	s.carryAt = end - keep
}

// checkSourcesFinite refuses, before any work, a stored tensor whose
// source bytes hold NaN or Inf as the hashing pass found them: always for
// a GPTQ matrix, otherwise unless the build allows non-finite values.
func (b *builder) checkSourcesFinite() error {
	if len(b.srcBad) == 0 {
		return nil
	}
	for _, st := range b.tensors {
		pos := int64(0)
		for _, p := range st.parts {
			bad := b.srcBad[p.tensor]
			if bad == nil {
				pos += p.len
				continue
			}
			for bi, o := range bad.offsets {
				if o < p.off || o >= p.off+p.len {
					continue
				}
				es := int64(bad.dtype.Bits() / 8)
				flat := int((pos + o - p.off) / es)
				gptqMatrix := st.method == manifest.MethodGPTQ
				if b.opt.AllowNonFinite && !gptqMatrix {
					break
				}
				hint := "Pass --allow-nonfinite (BuildOptions.AllowNonFinite) to store it anyway; the manifest then lists the tensor under ttquant.nonfinite_tensors"
				if gptqMatrix {
					hint = gptqNonFiniteHint
				}
				return fmt.Errorf("tensor %s: %w: element %v (flat index %d; source tensor %s in %s) is %v, found while hashing the source, before any work; a NaN or Inf in a weight is damage in the source, and rounding spreads it (a BFP block loses its other values). %s",
					st.name, ErrNonFinite, multiIndex(flat, st.shape), flat, p.tensor, filepath.Base(p.file.Path()), float32(bad.values[bi]), hint)
			}
			pos += p.len
		}
	}
	return nil
}
