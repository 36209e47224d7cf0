package kernels

import "fmt"

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
// an n×n float64 matrix and a 256×n float32 row buffer.
func NewGramAccumulator(n int) *GramAccumulator {
	if n <= 0 {
		panic(fmt.Sprintf("kernels: NewGramAccumulator: %d features", n))
	}
	return &GramAccumulator{n: n, buf: make([]float32, blockK*n), lower: make([]float64, n*n)}
}

// N returns the number of features.
func (g *GramAccumulator) N() int { return g.n }

// Rows returns the number of rows added so far.
func (g *GramAccumulator) Rows() int64 { return g.rows }

// Add appends rows rows of x (row-major, leading dimension ldx ≥ n).
func (g *GramAccumulator) Add(x []float32, rows, ldx int) {
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
	g.flush()
	n := g.n
	m := make([]float64, n*n)
	const bs = 64
	blocks := (n + bs - 1) / bs
	// Block row ib writes the lower-triangle rows ib…ib+bs and their
	// mirror, the upper-triangle columns ib…ib+bs: block rows never write
	// the same element.
	ParallelFor(blocks, Workers(), func(b, _ int) {
		ib := b * bs
		for jb := 0; jb <= ib; jb += bs {
			for i := ib; i < min(ib+bs, n); i++ {
				row := g.lower[i*n : i*n+i+1]
				for j := jb; j < min(jb+bs, i+1); j++ {
					v := f * row[j]
					m[i*n+j] = v
					m[j*n+i] = v
				}
			}
		}
	})
	return m
}
