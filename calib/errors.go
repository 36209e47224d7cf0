package calib

import (
	"errors"
	"fmt"
	"strings"
)

// Store error kinds. Every error of OpenStore, Store's readers and Check
// about the store's contents is a *StoreError whose Kind is one of them,
// so callers test the kind with errors.Is and get the file, layer and site
// with errors.As.
var (
	// ErrStoreIndex: the index (calibration.json) is missing, not valid
	// JSON of the store format, of an unsupported version, or does not
	// agree with itself (sequence lengths, sites, shard lists).
	ErrStoreIndex = errors.New("invalid store index")
	// ErrStoreShard: a shard file is missing, not a regular file,
	// unreadable, or its header does not match what the index lists.
	ErrStoreShard = errors.New("invalid store shard")
	// ErrStoreTokens: the stored token ids do not match the provenance.
	ErrStoreTokens = errors.New("invalid store token ids")
	// ErrStoreValues: an activation is NaN or infinite (Check).
	ErrStoreValues = errors.New("non-finite activation")
	// ErrNoSite: a read asks for a site the store does not hold, or rows
	// outside it.
	ErrNoSite = errors.New("no such site or rows")
)

// StoreError describes a problem with a calibration store: the file
// concerned (the index, a shard, or the store directory), the layer and
// site when one is concerned, the kind, and what was found. It unwraps to
// Kind and to Err, the underlying error (a safetensors.Error, an
// fs.PathError), when there is one.
type StoreError struct {
	Path   string // file or directory concerned
	Layer  int    // meaningful when Site is set
	Site   string // site concerned; empty when none
	Kind   error  // one of the ErrStore… / ErrNoSite kinds
	Detail string // what was found, may be empty
	Err    error  // underlying error, may be nil
}

func (e *StoreError) Error() string {
	var b strings.Builder
	b.WriteString("calib: ")
	if e.Path != "" {
		b.WriteString(e.Path + ": ")
	}
	if e.Site != "" {
		fmt.Fprintf(&b, "layer %d site %s: ", e.Layer, e.Site)
	}
	b.WriteString(e.Kind.Error())
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the kind and the underlying error.
func (e *StoreError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// storeErr returns a StoreError of kind about path, with no site.
func storeErr(kind error, path string, err error, format string, args ...any) *StoreError {
	return &StoreError{Kind: kind, Path: path, Err: err, Detail: fmt.Sprintf(format, args...)}
}

// siteErr returns a StoreError of kind about path and one site.
func siteErr(kind error, path string, layer int, site string, err error, format string, args ...any) *StoreError {
	return &StoreError{Kind: kind, Path: path, Layer: layer, Site: site, Err: err, Detail: fmt.Sprintf(format, args...)}
}

// Fallback kinds: why a matrix meant for GPTQ was rounded to nearest (or,
// ErrNoFeedback, quantized without error feedback) instead. Every
// fallback reason, calib's and the build's, is a *FallbackError whose Kind
// is one of them.
var (
	// ErrGPTQFailed: the solver returned an error (never an invalid
	// option: that stops the run).
	ErrGPTQFailed = errors.New("GPTQ failed")
	// ErrNonFiniteResult: the solver's output holds NaN or Inf.
	ErrNonFiniteResult = errors.New("GPTQ produced a non-finite value")
	// ErrNonFiniteLoss: the solver reported a non-finite loss or damping.
	ErrNonFiniteLoss = errors.New("GPTQ reported a non-finite loss")
	// ErrNoFeedback: no damping gave a usable factorization; the matrix
	// was quantized without error feedback (it stays a GPTQ matrix).
	ErrNoFeedback = errors.New("no damping gave a usable factorization; quantized without error feedback")
	// ErrStarved: the expert received too few routed calibration tokens.
	ErrStarved = errors.New("starved expert")
	// ErrNotMatrix: the tensor is not one matrix (GPTQ needs one).
	ErrNotMatrix = errors.New("GPTQ needs a matrix")
	// ErrNoCalibration: the build has no calibration data at all.
	ErrNoCalibration = errors.New("no calibration data")
	// ErrNoInputs: the calibration data hold no usable inputs for this
	// matrix (no site for its role, a site the store lacks, or one of
	// another width).
	ErrNoInputs = errors.New("no calibration inputs for this matrix")
)

// FallbackError is a fallback reason. Its text, what the statistics and
// the manifest record, is Reason (Kind's text when empty), followed by
// ": " and Err's text when there is an underlying error. It unwraps to
// Kind and Err.
type FallbackError struct {
	Kind   error  // one of the fallback kinds
	Reason string // the recorded reason; empty: Kind's text
	Err    error  // the underlying error, may be nil
}

func (e *FallbackError) Error() string {
	s := e.Reason
	if s == "" {
		s = e.Kind.Error()
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the kind and the underlying error.
func (e *FallbackError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// MarshalText records the reason's text.
func (e *FallbackError) MarshalText() ([]byte, error) { return []byte(e.Error()), nil }

// Fallback returns a FallbackError of kind with the given reason (Kind's
// text when empty) and underlying error (may be nil).
func Fallback(kind error, reason string, err error) *FallbackError {
	return &FallbackError{Kind: kind, Reason: reason, Err: err}
}
