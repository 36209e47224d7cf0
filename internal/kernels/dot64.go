package kernels

import "fmt"

// Dot64T sets c[i·ldc+j] (i < m, j < n) to the dot product of row i of a
// and row j of b (both k values wide, leading dimensions lda and ldb),
// each one sum in float64 over p = 0..k−1 in that order, every product
// rounded to float64 before it is added, the sum rounded once to float32:
// the bits of the plain loop
//
//	var s float64
//	for p := range k { s += float64(float64(a[i*lda+p]) * float64(b[j*ldb+p])) }
//	c[i*ldc+j] = float32(s)
//
// (a float32 product is exact in float64). It is the MoE router's
// product: x·routerᵀ with float64 accumulation. The rows of a are spread
// over up to Workers() goroutines; the split changes no bit.
func Dot64T(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("kernels: Dot64T: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	checkMatrix("Dot64T", "A", m, k, lda, len(a))
	checkMatrix("Dot64T", "B", n, k, ldb, len(b))
	checkMatrix("Dot64T", "C", m, n, ldc, len(c))
	if m == 0 || n == 0 {
		return
	}
	// b widened into panels of dotNR rows, interleaved by p: panel q
	// holds bt[q·dotNR·k + p·dotNR + j] = b[(q·dotNR+j)·ldb + p], zero
	// past row n.
	nq := ceilDiv(n, dotNR)
	btBuf := getBuf[float64](nq * dotNR * k)
	defer putBuf(btBuf)
	bt := *btBuf
	for q := 0; q < nq; q++ {
		pn := bt[q*dotNR*k : (q+1)*dotNR*k]
		for j := 0; j < dotNR; j++ {
			if r := q*dotNR + j; r < n {
				for p, v := range b[r*ldb : r*ldb+k] {
					pn[p*dotNR+j] = float64(v)
				}
			} else {
				for p := 0; p < k; p++ {
					pn[p*dotNR+j] = 0
				}
			}
		}
	}
	// Tasks of dotGroup tiles of dotMR rows: their rows widened once, then
	// panel by panel (a panel stays in the cache for the group's tiles).
	tiles := ceilDiv(m, dotMR)
	tasks := ceilDiv(tiles, dotGroup)
	workers := Workers()
	if 2*float64(m)*float64(n)*float64(k) < smallWork {
		workers = 1
	}
	ParallelFor(tasks, workers, func(t, _ int) {
		t0, t1 := t*dotGroup, min(tiles, (t+1)*dotGroup)
		xBuf := getBuf[float64]((t1 - t0) * dotMR * k)
		defer putBuf(xBuf)
		xs := *xBuf
		for ti := t0; ti < t1; ti++ {
			for r := 0; r < dotMR; r++ {
				i := min(ti*dotMR+r, m-1) // rows past m repeat the last; their sums are dropped
				dst := xs[((ti-t0)*dotMR+r)*k:][:k]
				for p, v := range a[i*lda : i*lda+k] {
					dst[p] = float64(v)
				}
			}
		}
		var acc [dotMR * dotNR]float64
		for q := 0; q < nq; q++ {
			pn := bt[q*dotNR*k : (q+1)*dotNR*k]
			for ti := t0; ti < t1; ti++ {
				dot64Tile(k, xs[(ti-t0)*dotMR*k:(ti-t0+1)*dotMR*k], pn, &acc)
				for r := 0; r < min(dotMR, m-ti*dotMR); r++ {
					row := c[(ti*dotMR+r)*ldc:]
					for j := 0; j < min(dotNR, n-q*dotNR); j++ {
						row[q*dotNR+j] = float32(acc[r*dotNR+j])
					}
				}
			}
		}
	})
}

// Tiles of Dot64T: dotMR rows of a against a panel of dotNR rows of b,
// dotGroup tiles per task.
const (
	dotMR    = 4
	dotNR    = 8
	dotGroup = 4
)

// dot64TileGo is the twin of the Dot64T tile: acc[r·dotNR+j] = Σ_p
// x[r·k+p]·pn[p·dotNR+j] for r < dotMR, j < dotNR, from +0 in increasing
// p, each product rounded before the addition (no fusion).
func dot64TileGo(k int, x, pn []float64, acc *[dotMR * dotNR]float64) {
	*acc = [dotMR * dotNR]float64{}
	for r := 0; r < dotMR; r++ {
		xr := x[r*k : (r+1)*k]
		s := acc[r*dotNR : (r+1)*dotNR]
		for p, v := range xr {
			b := pn[p*dotNR : p*dotNR+dotNR]
			for j := range s {
				s[j] += float64(v * b[j])
			}
		}
	}
}
