package kernels

import "fmt"

// matPool64 and matPool32 hold the accumulators' n×n matrices and row
// buffers, apart from the kernels' small scratch buffers so that a large
// matrix is not handed out as scratch.
var (
	matPool64 = BoundedPool[float64]{Slots: 4}
	matPool32 = BoundedPool[float32]{Slots: 4}
)

// GramAccumulator accumulates G = Σ x xᵀ over a stream of float32 rows x of
// n features (the Hessian of a linear layer's inputs, up to scaling) into a
// float64 lower triangle. Rows are buffered into blocks of 256, so that
// every SyrkLower64 call is compute-bound and, more importantly, the result
// depends only on the sequence of rows, not on how the caller splits it
// into batches: G is the float64 sum, in stream order, of the float32
// fused-multiply-add sums of consecutive blocks of 256 rows (the last
// block possibly shorter).
//
// A GramAccumulator is not safe for concurrent use.
type GramAccumulator struct {
	n     int
	buf   []float32 // blockK×n rows waiting
	nbuf  int
	rows  int64
	lower []float64 // n×n, lower triangle used
}

// NewGramAccumulator returns an empty accumulator for n features. It holds
// an n×n float64 matrix and a 256×n float32 row buffer, taken from a pool
// that Release, TakeScaled and RecycleMatrix refill, so that repeated
// accumulations (one Hessian per expert) allocate nothing once warm.
func NewGramAccumulator(n int) *GramAccumulator {
	if n <= 0 {
		panic(fmt.Sprintf("kernels: NewGramAccumulator: %d features", n))
	}
	lower := matPool64.Get(n * n)
	// Only the lower triangle is ever read.
	ParallelRows(n, n/2, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			clear(lower[i*n : i*n+i+1])
		}
	})
	return &GramAccumulator{n: n, buf: matPool32.Get(blockK * n), lower: lower}
}

// Release hands the accumulator's buffers back to the pool; it must not
// be used afterwards.
func (g *GramAccumulator) Release() {
	if g.lower != nil {
		matPool64.Put(g.lower)
	}
	if g.buf != nil {
		matPool32.Put(g.buf)
	}
	g.lower, g.buf = nil, nil
}

// RecycleMatrix hands an n×n matrix obtained from TakeScaled (or any
// float64 slice the caller no longer uses) to the pool that
// NewGramAccumulator draws from. m must not be used afterwards.
func RecycleMatrix(m []float64) {
	if cap(m) > 0 {
		matPool64.Put(m)
	}
}

// TakeScaled is MatrixScaled without the copy: it builds f times the full
// symmetric sum in the accumulator's own n×n storage (the same bits as
// MatrixScaled) and returns it, releasing the row buffer. The accumulator
// must not be used afterwards; hand the matrix to RecycleMatrix when done
// with it.
func (g *GramAccumulator) TakeScaled(f float64) []float64 {
	g.used("TakeScaled")
	g.flush()
	m := g.lower
	g.scaleInto(m, f)
	matPool32.Put(g.buf)
	g.lower, g.buf = nil, nil
	return m
}

// used panics when the accumulator was released.
func (g *GramAccumulator) used(fn string) {
	if g.lower == nil {
		panic("kernels: GramAccumulator." + fn + " after Release or TakeScaled")
	}
}

// N returns the number of features.
func (g *GramAccumulator) N() int { return g.n }

// Rows returns the number of rows added so far.
func (g *GramAccumulator) Rows() int64 { return g.rows }

// Add appends rows rows of x (row-major, leading dimension ldx ≥ n).
func (g *GramAccumulator) Add(x []float32, rows, ldx int) {
	g.used("Add")
	checkMatrix("GramAccumulator.Add", "X", rows, g.n, ldx, len(x))
	n := g.n
	for r := 0; r < rows; {
		if g.nbuf == 0 && rows-r >= blockK {
			// Whole blocks straight from the caller's memory.
			nb := (rows - r) / blockK * blockK
			for b := 0; b < nb; b += blockK {
				SyrkLower64(n, blockK, x[(r+b)*ldx:], ldx, g.lower, n)
			}
			r += nb
			g.rows += int64(nb)
			continue
		}
		take := min(blockK-g.nbuf, rows-r)
		for i := 0; i < take; i++ {
			copy(g.buf[(g.nbuf+i)*n:(g.nbuf+i+1)*n], x[(r+i)*ldx:(r+i)*ldx+n])
		}
		g.nbuf += take
		g.rows += int64(take)
		r += take
		if g.nbuf == blockK {
			g.flush()
		}
	}
}

func (g *GramAccumulator) flush() {
	if g.nbuf > 0 {
		SyrkLower64(g.n, g.nbuf, g.buf, g.n, g.lower, g.n)
		g.nbuf = 0
	}
}

// Merge adds the sum held by o (which must have the same number of
// features) to g, after flushing both partial blocks: merged results
// depend on where the streams were cut, unlike a single stream.
func (g *GramAccumulator) Merge(o *GramAccumulator) {
	if o.n != g.n {
		panic(fmt.Sprintf("kernels: GramAccumulator.Merge: %d features into %d", o.n, g.n))
	}
	g.used("Merge")
	o.used("Merge")
	g.flush()
	o.flush()
	for i := 0; i < g.n; i++ {
		dst := g.lower[i*g.n : i*g.n+i+1]
		for j, v := range o.lower[i*g.n : i*g.n+i+1] {
			dst[j] += v
		}
	}
	g.rows += o.rows
}

// Matrix flushes the pending rows and returns a new n×n row-major matrix
// holding the full symmetric sum.
func (g *GramAccumulator) Matrix() []float64 { return g.MatrixScaled(1) }

// MatrixScaled flushes the pending rows and returns a new n×n row-major
// matrix holding f times the full symmetric sum (each element is one
// float64 multiplication of the accumulated value, so the result does not
// depend on the number of workers that build it).
func (g *GramAccumulator) MatrixScaled(f float64) []float64 {
	g.used("MatrixScaled")
	g.flush()
	m := make([]float64, g.n*g.n)
	g.scaleInto(m, f)
	return m
}

// scaleInto writes f times the full symmetric sum into the n×n matrix m,
// which may be g.lower itself: every lower element is read and then
// written by the same goroutine, and the mirrored writes land in the
// strict upper triangle, which is never read.
func (g *GramAccumulator) scaleInto(m []float64, f float64) {
	n := g.n
	const bs = 64
	blocks := (n + bs - 1) / bs
	// Block row ib writes the lower-triangle rows ib…ib+bs and their
	// mirror, the upper-triangle columns ib…ib+bs: block rows never write
	// the same element.
	// Within a block, 8×8 tiles: the mirror writes of a tile then go to
	// 8 cache lines, each filled whole, instead of one value to each of
	// 64 rows n·8 bytes apart (which share cache sets and evict each
	// other). Every element gets the same product f·lower[i][j].
	const ts = 8
	ParallelFor(blocks, Workers(), func(b, _ int) {
		ib := b * bs
		for jb := 0; jb <= ib; jb += bs {
			for i0 := ib; i0 < min(ib+bs, n); i0 += ts {
				for j0 := jb; j0 < min(jb+bs, i0+ts); j0 += ts {
					for i := i0; i < min(i0+ts, n); i++ {
						row := g.lower[i*n : i*n+i+1]
						for j := j0; j < min(j0+ts, i+1); j++ {
							v := f * row[j]
							m[i*n+j] = v
							m[j*n+i] = v
						}
					}
				}
			}
		}
	})
}
