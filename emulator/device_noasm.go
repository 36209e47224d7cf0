//go:build !amd64 || purego

package emulator

// deviceAsm is always false without the amd64 assembly.
var deviceAsm = false

func devKern(ktiles int, a []int16, b []int32, phases int, scratch []int32, dst *[8]uint32) {
	panic("emulator: no device matmul kernel in this build")
}
