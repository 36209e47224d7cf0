package kernels

import "math"

var (
	negZero32 = math.Float32frombits(1 << 31)
	negZero64 = math.Float64frombits(1 << 63)
)
