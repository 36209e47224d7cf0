//go:build !amd64 || purego

package kernels

// useAsm is always false without the amd64 assembly.
const useAsm = false

func implName() string { return "go" }

func sgemmKern(kc int, a, b, c []float32, ldc int)             { sgemmKernGo(kc, a, b, c, ldc) }
func sgemmKern64(kc int, a, b []float32, c []float64, ldc int) { sgemmKern64Go(kc, a, b, c, ldc) }
func dgemmKern(kc int, a, b, c []float64, ldc int)             { dgemmKernGo(kc, a, b, c, ldc) }
func fmaLoop32(n int) float64                                  { return fmaLoop32Go(n) }
func fmaLoop64(n int) float64                                  { return fmaLoop64Go(n) }
