package safetensors

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
)

// TensorInfo describes one tensor of a file. Begin and End are byte offsets
// within the data section (which starts at DataOffset in the file).
type TensorInfo struct {
	Name  string
	DType DType
	// Shape holds the dimensions. A dimension larger than the largest int64
	// (possible only in a tensor with no elements, since another dimension
	// is then 0) is reported as -1; Dims returns the exact values.
	Shape      []int64
	Begin, End int64

	dims []uint64 // exact dims, only when some dimension exceeds int64
}

// Dims returns the exact dimensions as unsigned 64-bit values.
func (t TensorInfo) Dims() []uint64 {
	if t.dims != nil {
		return slices.Clone(t.dims)
	}
	out := make([]uint64, len(t.Shape))
	for i, d := range t.Shape {
		out[i] = uint64(d)
	}
	return out
}

// NumElements returns the number of elements (1 for a scalar).
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		if d == 0 {
			return 0
		}
	}
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Size returns the tensor's size in bytes.
func (t TensorInfo) Size() int64 { return t.End - t.Begin }

// File is an open, fully validated safetensors file. Tensor data are read
// on demand with positional reads; nothing but the header is held in memory.
// A File is safe for concurrent use.
type File struct {
	path   string
	r      io.ReaderAt
	closer io.Closer
	size   int64
	h      *header
	index  map[string]int
}

// Open opens and validates the safetensors file at path. Only the 8-byte
// prefix and the header are read. Errors about the file's contents wrap one
// of the Err* kinds and name the file and, where there is one, the tensor.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.Mode().IsRegular() {
		fh.Close()
		return nil, fmt.Errorf("safetensors: %s: not a regular file", path)
	}
	f, err := OpenReader(fh, st.Size(), path)
	if err != nil {
		fh.Close()
		return nil, err
	}
	f.closer = fh
	return f, nil
}

// OpenReader validates the safetensors data of size bytes readable from r.
// name is used in errors and returned by Path. If r is an io.Closer, Close
// does not close it.
func OpenReader(r io.ReaderAt, size int64, name string) (*File, error) {
	if size < 0 {
		return nil, fmt.Errorf("safetensors: %s: negative size %d", name, size)
	}
	var prefix [8]byte
	np := int64(8)
	if size < np {
		np = size
	}
	if np > 0 {
		if _, err := r.ReadAt(prefix[:np], 0); err != nil && err != io.EOF {
			return nil, fmt.Errorf("safetensors: %s: %w", name, err)
		}
	}
	n, err := checkPrefix(prefix[:np], size)
	if err != nil {
		return nil, withPath(err, name)
	}
	sc := getScratch()
	defer sc.put()
	if uint64(cap(sc.hdr)) < n {
		sc.hdr = make([]byte, n)
	}
	hdr := sc.hdr[:n]
	if n > 0 {
		got, err := r.ReadAt(hdr, 8)
		if got < len(hdr) {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("safetensors: %s: reading header: %w", name, err)
		}
	}
	h, err := parseAndValidateWith(sc, hdr, size)
	if err != nil {
		return nil, withPath(err, name)
	}
	return &File{path: name, r: r, size: size, h: h, index: h.index}, nil
}

// Close releases the underlying file (for files from Open).
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	err := f.closer.Close()
	f.closer = nil
	return err
}

// Path returns the path (or name) the file was opened with.
func (f *File) Path() string { return f.path }

// Size returns the file size in bytes.
func (f *File) Size() int64 { return f.size }

// HeaderSize returns N, the length of the JSON header (padding included).
func (f *File) HeaderSize() int64 { return int64(f.h.n) }

// DataOffset returns the file offset of the data section, 8 + N.
func (f *File) DataOffset() int64 { return 8 + int64(f.h.n) }

// Tensors returns the tensors in data-offset order (ties, which only
// zero-size tensors can have, broken by name). The slice is a copy; the
// shapes are shared and must not be modified.
func (f *File) Tensors() []TensorInfo { return slices.Clone(f.h.tensors) }

// Names returns the tensor names sorted bytewise.
func (f *File) Names() []string {
	out := make([]string, 0, len(f.h.tensors))
	for _, t := range f.h.tensors {
		out = append(out, t.Name)
	}
	slices.Sort(out)
	return out
}

// Len returns the number of tensors.
func (f *File) Len() int { return len(f.h.tensors) }

// Lookup returns the tensor called name.
func (f *File) Lookup(name string) (TensorInfo, bool) {
	i, ok := f.index[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.h.tensors[i], true
}

// Metadata returns a copy of the __metadata__ map, or nil when the header
// has none (absent or null). An empty map means "__metadata__":{}.
func (f *File) Metadata() map[string]string {
	if !f.h.hasMeta {
		return nil
	}
	return maps.Clone(f.h.metadata)
}

// DuplicateNames returns the tensor names the header gives more than once.
// The reference format's reader keeps the last entry of each and so does
// this package; the list lets stricter callers reject such files.
func (f *File) DuplicateNames() []string { return slices.Clone(f.h.dups) }

func (f *File) lookup(name string) (TensorInfo, error) {
	t, ok := f.Lookup(name)
	if !ok {
		return t, &Error{Path: f.path, Tensor: name, hasT: true, Kind: ErrTensorNotFound}
	}
	return t, nil
}

// SectionReader returns a reader over the tensor's bytes in the file. It
// reads directly from the file with positional reads.
func (f *File) SectionReader(name string) (*io.SectionReader, error) {
	t, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	return io.NewSectionReader(f.r, f.DataOffset()+t.Begin, t.Size()), nil
}

// ReadTensor returns a fresh copy of the tensor's bytes.
func (f *File) ReadTensor(name string) ([]byte, error) {
	t, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, t.Size())
	if err := f.readAt(buf, t, 0); err != nil {
		return nil, err
	}
	return buf, nil
}

// ReadTensorAt reads len(dst) bytes of the tensor starting at byte off of
// the tensor into dst. It is the way to read one slice (an expert, a row
// block) of a large tensor without reading the rest.
func (f *File) ReadTensorAt(name string, dst []byte, off int64) error {
	t, err := f.lookup(name)
	if err != nil {
		return err
	}
	return f.readAt(dst, t, off)
}

func (f *File) readAt(dst []byte, t TensorInfo, off int64) error {
	if off < 0 || off > t.Size() || int64(len(dst)) > t.Size()-off {
		return fmt.Errorf("safetensors: %s: tensor %q: byte range [%d,%d) outside the tensor's %d bytes",
			f.path, t.Name, off, off+int64(len(dst)), t.Size())
	}
	if len(dst) == 0 {
		return nil
	}
	n, err := f.r.ReadAt(dst, f.DataOffset()+t.Begin+off)
	if n == len(dst) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("safetensors: %s: tensor %q: reading %d bytes at data offset %d: %w (was the file modified after opening?)",
		f.path, t.Name, len(dst), t.Begin+off, err)
}
