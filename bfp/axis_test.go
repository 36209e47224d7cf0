package bfp

import (
	"errors"
	"testing"
)

func TestAxis(t *testing.T) {
	for s, want := range map[string]Axis{"input": AxisInput, " Output ": AxisOutput, "in": AxisInput, "OUT": AxisOutput} {
		if a, err := ParseAxis(s); err != nil || a != want {
			t.Errorf("ParseAxis(%q) = %q, %v; want %q", s, a, err, want)
		}
	}
	for _, bad := range []string{"", "rows", "inputs"} {
		_, err := ParseAxis(bad)
		var ae *AxisError
		if !errors.Is(err, ErrUnknownAxis) || !errors.As(err, &ae) || ae.Value != bad {
			t.Errorf("ParseAxis(%q): error %v, want an AxisError wrapping ErrUnknownAxis", bad, err)
		}
	}
	var zero Axis
	if err := zero.Valid(); !errors.Is(err, ErrUnknownAxis) {
		t.Errorf("zero axis: Valid() = %v, want ErrUnknownAxis", err)
	}
	if _, err := Axis("Input").MarshalText(); err == nil {
		t.Error("a non-canonical axis was encoded")
	}
	if b, err := AxisOutput.MarshalText(); err != nil || string(b) != "output" {
		t.Errorf("AxisOutput.MarshalText() = %q, %v", b, err)
	}
}
