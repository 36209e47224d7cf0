// Package quant holds the words the quantizer and the checkpoint format
// share, defined once below both: how a tensor's stored values were
// obtained (Method). It imports nothing of the module, so that the
// checkpoint format (manifest, which must not link the quantizer) and the
// calibration driver (calib, which must not link the format) can both use
// it.
package quant

import (
	"fmt"
	"strings"
)

// Method is how a tensor's stored values were obtained. The zero value is
// invalid. Its text form is its value.
type Method string

// Methods recorded per tensor, named in plan rules, and applied by the
// calibration driver (GPTQ or RTN).
const (
	GPTQ Method = "gptq"
	RTN  Method = "rtn"
	None Method = "none"
)

// ParseMethod returns the method named s (any case, surrounding space
// ignored).
func ParseMethod(s string) (Method, error) {
	switch m := Method(strings.ToLower(strings.TrimSpace(s))); m {
	case GPTQ, RTN, None:
		return m, nil
	}
	return "", fmt.Errorf("unknown method %q (want gptq, rtn or none)", s)
}

// Valid reports whether m is a method in its canonical spelling.
func (m Method) Valid() bool { return m == GPTQ || m == RTN || m == None }

func (m Method) String() string { return string(m) }

// MarshalText gives the canonical spelling and refuses an invalid method.
func (m Method) MarshalText() ([]byte, error) {
	if !m.Valid() {
		return nil, fmt.Errorf("quant: invalid method %q", string(m))
	}
	return []byte(m), nil
}
