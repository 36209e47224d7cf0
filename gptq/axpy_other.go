//go:build !amd64 || purego

package gptq

// axpySub32 computes y -= a·x elementwise with every product rounded to
// float32 before the subtraction (the pure-Go twin of the amd64 assembly).
func axpySub32(a float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] -= float32(a * v)
	}
}

const simdName = "go"

func simdActive() bool { return false }
