package bfp

import (
	"fmt"
	"strings"
)

// Format is one of the Tenstorrent block-floating-point element formats with
// an 8-bit shared exponent (the "_b" variants). The zero value is not a valid
// format, so an uninitialised Format is reported rather than silently taken
// as BFP8.
type Format int

// The supported formats. Every element is a sign bit above a magnitude of
// MantissaBits bits; 16 elements of one face row share an exponent byte.
const (
	// BFP8 is BFP8_b: 8 bits per element, 7-bit magnitude.
	BFP8 Format = iota + 1
	// BFP4 is BFP4_b: 4 bits per element, 3-bit magnitude.
	BFP4
	// BFP2 is BFP2_b: 2 bits per element, 1-bit magnitude.
	BFP2
)

// Formats lists every supported format, widest first.
func Formats() []Format { return []Format{BFP8, BFP4, BFP2} }

// Valid reports whether f is one of the supported formats; the error wraps
// ErrUnknownFormat.
func (f Format) Valid() error {
	switch f {
	case BFP8, BFP4, BFP2:
		return nil
	}
	return &FormatError{Value: fmt.Sprintf("Format(%d)", int(f))}
}

// String returns the tt-metal name of the format ("BFP8_b", "BFP4_b",
// "BFP2_b"), or "Format(n)" for an invalid value.
func (f Format) String() string {
	switch f {
	case BFP8:
		return "BFP8_b"
	case BFP4:
		return "BFP4_b"
	case BFP2:
		return "BFP2_b"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Bits returns the number of bits per element: 8, 4 or 2. It panics on an
// invalid format.
func (f Format) Bits() int {
	return f.MantissaBits() + 1
}

// MantissaBits returns the width W of the element magnitude: 7, 3 or 1. It
// panics on an invalid format.
func (f Format) MantissaBits() int {
	switch f {
	case BFP8:
		return 7
	case BFP4:
		return 3
	case BFP2:
		return 1
	}
	panic("bfp: invalid format " + f.String())
}

// MaxMagnitude returns the largest element magnitude, 2^W - 1.
func (f Format) MaxMagnitude() uint8 {
	return uint8(1)<<f.MantissaBits() - 1
}

// ParseFormat parses a format name. It accepts, case-insensitively, the
// tt-metal names "BFP8_b", "BFP4_b", "BFP2_b", the ttnn names "bfloat8_b",
// "bfloat4_b", "bfloat2_b", and the short forms "bfp8", "bfp4", "bfp2". The
// error for anything else wraps ErrUnknownFormat.
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "bfp8_b", "bfp8", "bfloat8_b":
		return BFP8, nil
	case "bfp4_b", "bfp4", "bfloat4_b":
		return BFP4, nil
	case "bfp2_b", "bfp2", "bfloat2_b":
		return BFP2, nil
	}
	return 0, &FormatError{Value: s}
}

// MarshalText implements encoding.TextMarshaler with the String form.
func (f Format) MarshalText() ([]byte, error) {
	if err := f.Valid(); err != nil {
		return nil, err
	}
	return []byte(f.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseFormat.
func (f *Format) UnmarshalText(b []byte) error {
	v, err := ParseFormat(string(b))
	if err != nil {
		return err
	}
	*f = v
	return nil
}
