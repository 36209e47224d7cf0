package safetensors

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Tensor is a tensor held in memory, for WriteFile.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
}

// Writer writes a safetensors file. Tensors are registered with Add or
// AddFunc; nothing is written until Close, which lays the file out as the
// reference writer does:
//
//   - tensors sorted by dtype, most-aligned first (U64, I64, F64, C64, F32,
//     ..., BOOL; the reverse of the DType constants), then by name bytewise,
//     packed back to back from data offset 0;
//   - a compact JSON header: "__metadata__" first when SetMetadata was
//     called (its keys sorted, so the output is deterministic), then the
//     tensors in data order, fields in the order dtype, shape, data_offsets,
//     strings escaped as the reference does (only '"', '\\' and control
//     characters);
//   - the header padded with spaces to a multiple of 8 bytes, so the data
//     section is 8-byte aligned.
//
// The file is written under a temporary name in the target's directory,
// synced, and renamed over the target only when complete; a reader holding
// the old file keeps seeing the old contents. The same tensors and metadata
// always give the same bytes. The writer refuses anything the reader would
// reject: duplicate names, a tensor called "__metadata__", invalid UTF-8,
// data whose length does not match shape and dtype, sub-byte tensors that
// are not a whole number of bytes, and headers over MaxHeaderSize.
//
// A Writer is not safe for concurrent use.
type Writer struct {
	path    string
	tmp     *os.File
	entries []wentry
	names   map[string]bool
	md      map[string]string
	hasMD   bool
	done    bool
	err     error
}

type wentry struct {
	name  string
	dtype DType
	shape []uint64
	size  uint64
	data  []byte
	write func(io.Writer) error
}

// createTemp creates the temporary file that becomes path when renamed:
// hidden, in path's directory (so that the rename stays on one file system).
func createTemp(path string) (*os.File, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	return tmp, nil
}

// Create starts a new file that will be renamed to path on Close.
func Create(path string) (*Writer, error) {
	tmp, err := createTemp(path)
	if err != nil {
		return nil, err
	}
	return &Writer{path: path, tmp: tmp, names: map[string]bool{}}, nil
}

// SetMetadata sets the __metadata__ map (copied). A nil map means no
// __metadata__ entry; an empty non-nil map writes "__metadata__":{}.
func (w *Writer) SetMetadata(md map[string]string) {
	if md == nil {
		w.md, w.hasMD = nil, false
		return
	}
	w.md, w.hasMD = maps.Clone(md), true
}

// tensorErrf is tensorErrf naming the file being written.
func (w *Writer) tensorErrf(kind error, name, format string, args ...any) *Error {
	e := tensorErrf(kind, name, format, args...)
	e.Path = w.path
	return e
}

func (w *Writer) check(name string, dtype DType, shape []int64) ([]uint64, uint64, error) {
	if w.done {
		return nil, 0, fmt.Errorf("safetensors: %s: writer already closed", w.path)
	}
	fail := func(kind error, format string, args ...any) ([]uint64, uint64, error) {
		return nil, 0, w.tensorErrf(kind, name, format, args...)
	}
	if name == "__metadata__" {
		return fail(ErrInvalidHeaderDeserialization, "the name __metadata__ is reserved for the metadata map")
	}
	if !utf8.ValidString(name) {
		return fail(ErrInvalidHeader, "name is not valid UTF-8")
	}
	if w.names[name] {
		return fail(ErrDuplicateTensor, "added twice")
	}
	if !dtype.Valid() {
		return fail(ErrInvalidHeaderDeserialization, "invalid dtype %d", int(dtype))
	}
	dims := make([]uint64, len(shape))
	numel := uint64(1)
	for i, d := range shape {
		if d < 0 {
			return fail(ErrValidationOverflow, "negative dimension in shape %v", shape)
		}
		dims[i] = uint64(d)
		hi, lo := bits.Mul64(numel, uint64(d))
		if hi != 0 {
			return fail(ErrValidationOverflow, "shape %v", shape)
		}
		numel = lo
	}
	hi, nbits := bits.Mul64(numel, uint64(dtype.Bits()))
	if hi != 0 {
		return fail(ErrValidationOverflow, "%s shape %v", dtype, shape)
	}
	if nbits%8 != 0 {
		return fail(ErrMisalignedSlice, "%s shape %v is %d bits, not a whole number of bytes", dtype, shape, nbits)
	}
	return dims, nbits / 8, nil
}

// Add registers a tensor whose bytes are data (little-endian, row-major).
// data is retained, not copied, until Close: do not modify it before then.
func (w *Writer) Add(name string, dtype DType, shape []int64, data []byte) error {
	dims, size, err := w.check(name, dtype, shape)
	if err != nil {
		return err
	}
	if uint64(len(data)) != size {
		return w.tensorErrf(ErrTensorInvalidInfo, name, "%s shape %v needs %d bytes, got %d", dtype, shape, size, len(data))
	}
	w.names[name] = true
	w.entries = append(w.entries, wentry{name: name, dtype: dtype, shape: dims, size: size, data: data})
	return nil
}

// AddFunc registers a tensor of size bytes whose data are produced at Close
// by write, which must write exactly size bytes to its argument. Use it to
// stream tensors that are not held in memory.
func (w *Writer) AddFunc(name string, dtype DType, shape []int64, size int64, write func(io.Writer) error) error {
	dims, want, err := w.check(name, dtype, shape)
	if err != nil {
		return err
	}
	if size < 0 || uint64(size) != want {
		return w.tensorErrf(ErrTensorInvalidInfo, name, "%s shape %v needs %d bytes, size given %d", dtype, shape, want, size)
	}
	if write == nil {
		panic("safetensors: AddFunc with a nil write function")
	}
	w.names[name] = true
	w.entries = append(w.entries, wentry{name: name, dtype: dtype, shape: dims, size: want, write: write})
	return nil
}

// AddReader registers a tensor whose bytes are read from r at Close; r must
// hold at least the tensor's size (shape × dtype) in bytes, and only that
// many are read. A File's SectionReader copies a tensor between files
// without holding it in memory.
func (w *Writer) AddReader(name string, dtype DType, shape []int64, r io.Reader) error {
	_, size, err := w.check(name, dtype, shape)
	if err != nil {
		return err
	}
	if size > 1<<63-1 {
		return w.tensorErrf(ErrValidationOverflow, name, "size overflows int64")
	}
	return w.AddFunc(name, dtype, shape, int64(size), func(dst io.Writer) error {
		n, err := io.CopyN(dst, r, int64(size))
		if err == io.EOF {
			return fmt.Errorf("source ended after %d of %d bytes", n, size)
		}
		return err
	})
}

// layout sorts the entries as the reference writer does and returns the
// header bytes, padded to a multiple of 8.
func layout(entries []wentry, md map[string]string, hasMD bool) ([]byte, error) {
	slices.SortFunc(entries, func(a, b wentry) int {
		if a.dtype != b.dtype {
			return cmp.Compare(b.dtype, a.dtype)
		}
		return cmp.Compare(a.name, b.name)
	})
	h := make([]byte, 0, 64+96*len(entries))
	h = append(h, '{')
	first := true
	if hasMD {
		h = append(h, `"__metadata__":{`...)
		for i, k := range slices.Sorted(maps.Keys(md)) {
			if i > 0 {
				h = append(h, ',')
			}
			if !utf8.ValidString(k) || !utf8.ValidString(md[k]) {
				return nil, errf(ErrInvalidHeader, "metadata entry %q is not valid UTF-8", k)
			}
			h = appendJSONString(h, k)
			h = append(h, ':')
			h = appendJSONString(h, md[k])
		}
		h = append(h, '}')
		first = false
	}
	var off uint64
	for _, e := range entries {
		if !first {
			h = append(h, ',')
		}
		first = false
		h = appendJSONString(h, e.name)
		h = append(h, `:{"dtype":"`...)
		h = append(h, e.dtype.String()...)
		h = append(h, `","shape":[`...)
		for i, d := range e.shape {
			if i > 0 {
				h = append(h, ',')
			}
			h = strconv.AppendUint(h, d, 10)
		}
		h = append(h, `],"data_offsets":[`...)
		h = strconv.AppendUint(h, off, 10)
		h = append(h, ',')
		end, carry := bits.Add64(off, e.size, 0)
		if carry != 0 {
			return nil, errf(ErrValidationOverflow, "total data size overflows 64 bits")
		}
		off = end
		h = strconv.AppendUint(h, off, 10)
		h = append(h, "]}"...)
	}
	h = append(h, '}')
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	if len(h) > MaxHeaderSize {
		return nil, errf(ErrHeaderTooLarge, "header would be %d bytes, over the %d-byte limit", len(h), MaxHeaderSize)
	}
	return h, nil
}

// appendJSONString appends s as a JSON string escaped the way the reference
// writer does: '"' and '\\' backslashed, \b \f \n \r \t in short form, other
// C0 controls as \u00xx (lowercase hex), everything else raw.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Close writes the file, syncs it and renames it into place. On error the
// temporary file is removed and the target is left untouched.
func (w *Writer) Close() error {
	if w.done {
		return w.err
	}
	w.done = true
	w.err = w.finish()
	if w.err != nil {
		w.tmp.Close()
		os.Remove(w.tmp.Name())
	}
	return w.err
}

func (w *Writer) finish() error {
	hdr, err := layout(w.entries, w.md, w.hasMD)
	if err != nil {
		return withPath(err, w.path)
	}
	var total uint64
	for _, e := range w.entries {
		total += e.size
	}
	// Never write what the reader rejects: decide the header as Open would.
	fileLen := 8 + uint64(len(hdr)) + total
	if fileLen > 1<<63-1 {
		return &Error{Path: w.path, Kind: ErrValidationOverflow, Detail: "file size overflows int64"}
	}
	if _, err := parseAndValidate(hdr, int64(fileLen)); err != nil {
		return fmt.Errorf("safetensors: internal error: writer produced a header the reader rejects: %w", withPath(err, w.path))
	}
	bw := bufio.NewWriterSize(w.tmp, 1<<20)
	var prefix [8]byte
	binary.LittleEndian.PutUint64(prefix[:], uint64(len(hdr)))
	bw.Write(prefix[:])
	bw.Write(hdr)
	for _, e := range w.entries {
		if e.write == nil {
			if _, err := bw.Write(e.data); err != nil {
				return fmt.Errorf("safetensors: writing %s: %w", w.path, err)
			}
			continue
		}
		cw := &countingWriter{w: bw}
		if err := e.write(cw); err != nil {
			return fmt.Errorf("safetensors: %s: tensor %q: %w", w.path, e.name, err)
		}
		if cw.n != e.size {
			return fmt.Errorf("safetensors: %s: tensor %q: source wrote %d bytes, expected %d", w.path, e.name, cw.n, e.size)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: writing %s: %w", w.path, err)
	}
	// CreateTemp makes the file private; give it ordinary permissions.
	if err := w.tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := w.tmp.Sync(); err != nil {
		return fmt.Errorf("safetensors: syncing %s: %w", w.path, err)
	}
	if err := w.tmp.Close(); err != nil {
		return fmt.Errorf("safetensors: closing %s: %w", w.path, err)
	}
	if err := os.Rename(w.tmp.Name(), w.path); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	syncDir(filepath.Dir(w.path))
	return nil
}

// syncDir makes a rename durable where the platform allows it; failures are
// ignored (some systems cannot sync directories).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

type countingWriter struct {
	w io.Writer
	n uint64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += uint64(n)
	return n, err
}

// Abort discards the file: the temporary file is removed and the target is
// not touched. Abort after a successful Close does nothing.
func (w *Writer) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	w.err = errors.New("safetensors: writer aborted")
	w.tmp.Close()
	if err := os.Remove(w.tmp.Name()); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// WriteFile writes tensors and metadata (nil for none) to path with a
// Writer.
func WriteFile(path string, tensors []Tensor, md map[string]string) error {
	w, err := Create(path)
	if err != nil {
		return err
	}
	for _, t := range tensors {
		if err := w.Add(t.Name, t.DType, t.Shape, t.Data); err != nil {
			w.Abort()
			return err
		}
	}
	w.SetMetadata(md)
	return w.Close()
}
