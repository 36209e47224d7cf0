package safetensors

import "fmt"

// DType is the element type of a tensor. The zero value is not a valid
// dtype. The constants are declared in the order of the format's own dtype
// list, which is ascending by alignment; the writer lays tensors out in the
// reverse of this order.
type DType int

// The 22 dtypes of the format. String returns the exact on-disk name.
const (
	BOOL        DType = iota + 1 // boolean, one byte
	F4                           // MXFP4 E2M1, 4 bits, two per byte
	F6_E2M3                      // MXFP6 E2M3, 6 bits
	F6_E3M2                      // MXFP6 E3M2, 6 bits
	U8                           // unsigned 8-bit integer
	I8                           // signed 8-bit integer
	F8_E5M2                      // OCP FP8 E5M2 (with infinities)
	F8_E4M3                      // OCP FP8 E4M3 "fn" (no infinities, one NaN pattern per sign)
	F8_E8M0                      // MX scale: 2^(e-127), 0xFF is NaN
	F8_E4M3FNUZ                  // FP8 E4M3, bias 8, no negative zero, 0x80 is NaN
	F8_E5M2FNUZ                  // FP8 E5M2, bias 16, no negative zero, 0x80 is NaN
	I16                          // signed 16-bit integer
	U16                          // unsigned 16-bit integer
	F16                          // IEEE 754 binary16
	BF16                         // bfloat16
	I32                          // signed 32-bit integer
	U32                          // unsigned 32-bit integer
	F32                          // IEEE 754 binary32
	C64                          // complex64: two F32 (real, imaginary)
	F64                          // IEEE 754 binary64
	I64                          // signed 64-bit integer
	U64                          // unsigned 64-bit integer
	numDTypes   = iota
)

var dtypeNames = [numDTypes + 1]string{
	BOOL: "BOOL", F4: "F4", F6_E2M3: "F6_E2M3", F6_E3M2: "F6_E3M2", U8: "U8", I8: "I8",
	F8_E5M2: "F8_E5M2", F8_E4M3: "F8_E4M3", F8_E8M0: "F8_E8M0", F8_E4M3FNUZ: "F8_E4M3FNUZ",
	F8_E5M2FNUZ: "F8_E5M2FNUZ", I16: "I16", U16: "U16", F16: "F16", BF16: "BF16", I32: "I32",
	U32: "U32", F32: "F32", C64: "C64", F64: "F64", I64: "I64", U64: "U64",
}

var dtypeBits = [numDTypes + 1]int{
	BOOL: 8, F4: 4, F6_E2M3: 6, F6_E3M2: 6, U8: 8, I8: 8, F8_E5M2: 8, F8_E4M3: 8, F8_E8M0: 8,
	F8_E4M3FNUZ: 8, F8_E5M2FNUZ: 8, I16: 16, U16: 16, F16: 16, BF16: 16, I32: 32, U32: 32,
	F32: 32, C64: 64, F64: 64, I64: 64, U64: 64,
}

// Valid reports whether d is one of the 22 dtypes.
func (d DType) Valid() bool { return d >= BOOL && d <= U64 }

// String returns the on-disk name of d ("BF16", "F8_E4M3", ...).
func (d DType) String() string {
	if d.Valid() {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// Bits returns the size of one element in bits (4 for F4, 6 for the F6
// types, 64 for C64), or 0 for an invalid dtype.
func (d DType) Bits() int {
	if d.Valid() {
		return dtypeBits[d]
	}
	return 0
}

// IsFloat reports whether d is a real floating-point type (including the
// sub-byte and FP8 types, excluding C64).
func (d DType) IsFloat() bool {
	switch d {
	case F4, F6_E2M3, F6_E3M2, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F16, BF16, F32, F64:
		return true
	}
	return false
}

// ParseDType returns the dtype with the exact (case-sensitive) on-disk name s.
func ParseDType(s string) (DType, error) {
	if d := lookupDType(s); d != 0 {
		return d, nil
	}
	return 0, fmt.Errorf("safetensors: unknown dtype %q", s)
}

func lookupDType(s string) DType {
	// A switch on constant strings compiles to a length-then-value search.
	switch s {
	case "BOOL":
		return BOOL
	case "F4":
		return F4
	case "F6_E2M3":
		return F6_E2M3
	case "F6_E3M2":
		return F6_E3M2
	case "U8":
		return U8
	case "I8":
		return I8
	case "F8_E5M2":
		return F8_E5M2
	case "F8_E4M3":
		return F8_E4M3
	case "F8_E8M0":
		return F8_E8M0
	case "F8_E4M3FNUZ":
		return F8_E4M3FNUZ
	case "F8_E5M2FNUZ":
		return F8_E5M2FNUZ
	case "I16":
		return I16
	case "U16":
		return U16
	case "F16":
		return F16
	case "BF16":
		return BF16
	case "I32":
		return I32
	case "U32":
		return U32
	case "F32":
		return F32
	case "C64":
		return C64
	case "F64":
		return F64
	case "I64":
		return I64
	case "U64":
		return U64
	}
	return 0
}

// MarshalText implements encoding.TextMarshaler with the on-disk name.
func (d DType) MarshalText() ([]byte, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("safetensors: invalid dtype %d", int(d))
	}
	return []byte(dtypeNames[d]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with the on-disk name.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}
