package bfp

import "strings"

// Axis is the direction of a weight matrix [out, in] along which a BFP
// format's 16-value exponent groups run. The zero value is invalid (and
// means "no axis" where a field is optional). Its text form is its value.
type Axis string

// Block axes.
const (
	// AxisInput: the 16 values sharing an exponent are 16 consecutive input
	// features of one output, i.e. 16 consecutive columns of one row of the
	// [out, in] weight. The packed matrix is stored [out, in].
	AxisInput Axis = "input"
	// AxisOutput: the 16 values sharing an exponent are 16 consecutive
	// outputs of one input feature, i.e. 16 consecutive rows of one column
	// of the [out, in] weight. The packed matrix is stored transposed,
	// [in, out], the layout a Tenstorrent matmul reads as its second
	// operand.
	AxisOutput Axis = "output"
)

// DefaultAxis is the axis taken where an optional axis is not given (a
// plan rule without one, calib.LayerOptions' zero Axis): the output axis,
// whose packed [in, out] matrix is what tt-metal's linear reads, so that
// such a tensor exports to ttnn without moving exponent groups.
const DefaultAxis = AxisOutput

// ParseAxis returns the axis named s: "input" or "output", or "in" and
// "out" (any case, surrounding space ignored). The error for anything else
// wraps ErrUnknownAxis.
func ParseAxis(s string) (Axis, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "input", "in":
		return AxisInput, nil
	case "output", "out":
		return AxisOutput, nil
	}
	return "", &AxisError{Value: s}
}

// Valid returns nil for AxisInput and AxisOutput and an error wrapping
// ErrUnknownAxis for anything else.
func (a Axis) Valid() error {
	if a != AxisInput && a != AxisOutput {
		return &AxisError{Value: string(a)}
	}
	return nil
}

func (a Axis) String() string { return string(a) }

// MarshalText gives the canonical spelling and refuses an invalid axis.
func (a Axis) MarshalText() ([]byte, error) {
	if err := a.Valid(); err != nil {
		return nil, err
	}
	return []byte(a), nil
}
