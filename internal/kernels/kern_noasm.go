//go:build !amd64 || purego

package kernels

// useAsm is always false without the amd64 assembly.
const useAsm = false

func implName() string { return "go" }

// useTile12 is false: the 6×16 tiles cover every product.
const useTile12 = false

func sgemmKern12(kc int, a, b, c []float32, ldc int) { sgemmKern12Go(kc, a, b, c, ldc) }
func sgemmKern12to64(kc int, a, b []float32, c []float64, ldc int) {
	sgemmKern12to64Go(kc, a, b, c, ldc)
}

// transpose8 leaves the interleave of packB to its Go loop.
func transpose8(n int, src []float32, lds int, dst []float32, ldd int) int { return 0 }

func sgemmKern(kc int, a, b, c []float32, ldc int)             { sgemmKernGo(kc, a, b, c, ldc) }
func sgemmKern64(kc int, a, b []float32, c []float64, ldc int) { sgemmKern64Go(kc, a, b, c, ldc) }
func dgemmKern(kc int, a, b, c []float64, ldc int)             { dgemmKernGo(kc, a, b, c, ldc) }
func fmaLoop32(n int) float64                                  { return fmaLoop32Go(n) }
func fmaLoop64(n int) float64                                  { return fmaLoop64Go(n) }

func axpy64(c float64, x, y []float64) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += float64(c * v)
	}
}

func dot8x64(x, y []float64) [8]float64 { return dot8Go(x[:len(x)&^7], y[:len(x)&^7]) }

func axpy32(c float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += float32(c * v)
	}
}

func dot8x32(x, y []float32) [8]float32 { return dot8Go(x[:len(x)&^7], y[:len(x)&^7]) }

func dotRows[T float32 | float64](x []T, ldx int, y []T, n8, rows int, s []T) {
	dotRowsGo(x, ldx, y, n8, rows, s)
}

func axpyTri[T float32 | float64](c, a []T, lda int, acc []T, m int) { axpyTriGo(c, a, lda, acc, m) }

func bfpRound32(x, q []float32, exps []uint8, w uint32) bool { return bfpRound32Go(x, q, exps, w) }
func bfpRoundGroups32(x, q []float32, w uint32) bool         { return bfpRoundGroups32Go(x, q, w) }

func bfpErrAcc32(x []float32, exps []uint8, per int, w uint32, wt float64, acc [][]float64) {
	bfpErrAcc32Go(x, exps, per, w, wt, acc)
}

func axpySubRows32(a, x, y []float32, ldy int) { axpySubRows32Go(a, x, y, ldy) }

func allFinite32(x []float32) bool { return allFinite32Go(x) }

func maxExponents32(x []float32, exp []uint8) { maxExponents32Go(x, exp) }

func groupMaxExponents32(x []float32, exps []uint8) { groupMaxExponents32Go(x, exps) }

func quantErr32(x, q, e []float32, acc []float64, d, d2 float32) {
	quantErr32Go(x, q, e, acc, d, d2)
}

func dot64Tile(k int, x, pn []float64, acc *[dotMR * dotNR]float64) { dot64TileGo(k, x, pn, acc) }
