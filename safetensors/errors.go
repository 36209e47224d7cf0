package safetensors

import (
	"errors"
	"fmt"
	"strconv"
)

// Error kinds. Every error returned by Open and OpenReader for a malformed
// file wraps exactly one of the first ten values, the one the reference
// implementation reports for the same bytes, so callers can test with
// errors.Is. They are listed in the order in which the checks run.
var (
	// ErrHeaderTooSmall: the file is shorter than the 8-byte length prefix.
	ErrHeaderTooSmall = errors.New("header too small")
	// ErrHeaderTooLarge: the header length exceeds MaxHeaderSize.
	ErrHeaderTooLarge = errors.New("header too large")
	// ErrInvalidHeaderLength: the header extends past the end of the file.
	ErrInvalidHeaderLength = errors.New("invalid header length")
	// ErrInvalidHeader: the header bytes are not valid UTF-8.
	ErrInvalidHeader = errors.New("invalid UTF-8 in header")
	// ErrInvalidHeaderDeserialization: the header is not valid JSON or does
	// not follow the header schema.
	ErrInvalidHeaderDeserialization = errors.New("invalid JSON in header")
	// ErrInvalidOffset: a tensor does not start where the previous one (in
	// data-offset order) ends, or ends before it begins.
	ErrInvalidOffset = errors.New("invalid offset")
	// ErrValidationOverflow: a size computed from a shape and dtype overflows
	// 64 bits.
	ErrValidationOverflow = errors.New("overflow computing buffer size from shape and/or element type")
	// ErrMisalignedSlice: a sub-byte tensor does not fill a whole number of
	// bytes.
	ErrMisalignedSlice = errors.New("misaligned slice: tensor size is not a whole number of bytes")
	// ErrTensorInvalidInfo: a tensor's byte range does not match its shape
	// and dtype.
	ErrTensorInvalidInfo = errors.New("invalid shape, data type, or offset for tensor")
	// ErrMetadataIncompleteBuffer: the tensors do not cover the data section
	// exactly (trailing bytes, or a truncated file).
	ErrMetadataIncompleteBuffer = errors.New("incomplete metadata, file not fully covered")

	// ErrTensorNotFound: a looked-up tensor name does not exist.
	ErrTensorNotFound = errors.New("tensor not found")
	// ErrInvalidIndex: a sharded checkpoint's index is malformed or
	// inconsistent with its shards (missing shard, tensor in another shard,
	// tensor missing from the index).
	ErrInvalidIndex = errors.New("invalid checkpoint index")
	// ErrDuplicateTensor: the same tensor name is present in two files of a
	// checkpoint, or given twice to a Writer.
	ErrDuplicateTensor = errors.New("duplicate tensor")
	// ErrUnsupportedDType: a conversion was requested for a dtype it does
	// not handle (for example C64 to float32).
	ErrUnsupportedDType = errors.New("unsupported dtype")
)

// Error describes a problem with a file, optionally with one tensor in it.
// Kind is one of the Err* values above and is what errors.Is matches.
type Error struct {
	Path   string // file (or index) concerned; may be empty for in-memory data
	Tensor string // tensor concerned; empty when none
	Kind   error  // one of the Err* kinds
	Detail string // human-readable specifics, may be empty
	hasT   bool
}

func (e *Error) Error() string {
	s := "safetensors: "
	if e.Path != "" {
		s += e.Path + ": "
	}
	if e.hasT || e.Tensor != "" {
		s += "tensor " + strconv.Quote(e.Tensor) + ": "
	}
	s += e.Kind.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the error kind.
func (e *Error) Unwrap() error { return e.Kind }

func errf(kind error, format string, args ...any) *Error {
	return &Error{Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

func tensorErrf(kind error, tensor string, format string, args ...any) *Error {
	return &Error{Kind: kind, Tensor: tensor, hasT: true, Detail: fmt.Sprintf(format, args...)}
}

// withPath sets the path on err when it is an *Error without one.
func withPath(err error, path string) error {
	var e *Error
	if errors.As(err, &e) && e.Path == "" {
		c := *e
		c.Path = path
		return &c
	}
	return err
}

// KindName returns the reference name of the error kind wrapped by err
// ("InvalidOffset", "HeaderTooLarge", ...), or "" when err wraps none of the
// ten file-format kinds.
func KindName(err error) string {
	for _, k := range kindNames {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return ""
}

var kindNames = []struct {
	err  error
	name string
}{
	{ErrHeaderTooSmall, "HeaderTooSmall"},
	{ErrHeaderTooLarge, "HeaderTooLarge"},
	{ErrInvalidHeaderLength, "InvalidHeaderLength"},
	{ErrInvalidHeader, "InvalidHeader"},
	{ErrInvalidHeaderDeserialization, "InvalidHeaderDeserialization"},
	{ErrInvalidOffset, "InvalidOffset"},
	{ErrValidationOverflow, "ValidationOverflow"},
	{ErrMisalignedSlice, "MisalignedSlice"},
	{ErrTensorInvalidInfo, "TensorInvalidInfo"},
	{ErrMetadataIncompleteBuffer, "MetadataIncompleteBuffer"},
}
