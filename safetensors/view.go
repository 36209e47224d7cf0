package safetensors

import (
	"fmt"
	"unsafe"
)

// Element is a fixed-size numeric type that tensor bytes can be viewed as.
type Element interface {
	~uint8 | ~int8 | ~uint16 | ~int16 | ~uint32 | ~int32 | ~uint64 | ~int64 | ~float32 | ~float64
}

// littleEndianHost reports whether the machine stores integers
// little-endian, like safetensors data.
var littleEndianHost = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// View reinterprets b (tensor bytes, for example from ReadTensor) as a
// slice of T without copying: F32 data as []float32, BF16 or F16 bits as
// []uint16, and so on. It fails when len(b) is not a multiple of T's size,
// when b is not aligned for T (ReadTensor's buffers always are), or on a
// big-endian machine; use DecodeFloat32s or encoding/binary then. The
// result shares b's memory.
func View[T Element](b []byte) ([]T, error) {
	var zero T
	size := int(unsafe.Sizeof(zero))
	if len(b)%size != 0 {
		return nil, fmt.Errorf("safetensors: %d bytes are not a whole number of %d-byte elements", len(b), size)
	}
	if len(b) == 0 {
		return []T{}, nil
	}
	if !littleEndianHost && size > 1 {
		return nil, fmt.Errorf("safetensors: cannot view little-endian data in place on a big-endian machine")
	}
	if uintptr(unsafe.Pointer(&b[0]))%unsafe.Alignof(zero) != 0 {
		return nil, fmt.Errorf("safetensors: buffer is not aligned for %d-byte elements", size)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/size), nil
}
