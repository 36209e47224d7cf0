package tokenizer

import (
	"errors"
	"fmt"
)

// Error kinds. Every error the loader returns wraps one of them (test with
// errors.Is) inside an *Error that names the file and the JSON field.
var (
	// ErrMissing: a required file or field is absent.
	ErrMissing = errors.New("missing")
	// ErrMalformed: a file that is not valid JSON, or a field of the wrong
	// JSON type or an impossible value (a merge whose parts are not in the
	// vocabulary, a duplicate id, ...).
	ErrMalformed = errors.New("malformed")
	// ErrUnsupported: a well-formed setting this tokenizer does not
	// implement. It is refused rather than approximated.
	ErrUnsupported = errors.New("unsupported")
)

// Error is a loader error: which file, which field, what kind, and why.
type Error struct {
	Path   string // the file, as given to the loader
	Field  string // the JSON path of the offending field, e.g. "model.merges[12]"; may be empty
	Kind   error  // ErrMissing, ErrMalformed or ErrUnsupported
	Detail string
}

func (e *Error) Error() string {
	s := "tokenizer: " + e.Path
	if e.Field != "" {
		s += ": " + e.Field
	}
	s += ": " + e.Kind.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the kind.
func (e *Error) Unwrap() error { return e.Kind }

func errorf(path, field string, kind error, format string, args ...any) *Error {
	return &Error{Path: path, Field: field, Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

// IDError reports a token id outside the vocabulary given to Decode.
type IDError struct {
	Index int // position in the id slice
	ID    int
	Size  int // ids must be in [0, Size)
}

func (e *IDError) Error() string {
	return fmt.Sprintf("tokenizer: id %d at position %d is not a token (vocabulary has ids 0..%d, with gaps for unused ids)", e.ID, e.Index, e.Size-1)
}
