package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestGramAccumulatorBatchingIndependent(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	n, rows := 37, 1100
	x := randMat32(r, rows*n)
	// Reference: one call per 256-row block, float64 sum, mirrored.
	want := make([]float64, n*n)
	for b := 0; b < rows; b += blockK {
		SyrkLower64(n, min(blockK, rows-b), x[b*n:], n, want, n)
	}
	SymmetrizeLower64(n, want, n)
	for _, batches := range [][]int{{rows}, {1, 2, 3, 250, 300, 544}, {256, 256, 256, 256, 76}, {700, 400}} {
		g := NewGramAccumulator(n)
		at := 0
		for _, b := range batches {
			g.Add(x[at*n:], b, n)
			at += b
		}
		if g.Rows() != int64(rows) {
			t.Fatalf("Rows = %d", g.Rows())
		}
		got := g.Matrix()
		for i := range got {
			if !bitsEqual64(got[i], want[i]) {
				t.Fatalf("batches %v: element %d = %g, want %g", batches, i, got[i], want[i])
			}
		}
	}
	// Strided input and Merge.
	ld := n + 3
	xs := make([]float32, 10*ld)
	for i := 0; i < 10; i++ {
		copy(xs[i*ld:i*ld+n], x[i*n:i*n+n])
	}
	a, b := NewGramAccumulator(n), NewGramAccumulator(n)
	a.Add(xs, 4, ld)
	b.Add(xs[4*ld:], 6, ld)
	a.Merge(b)
	c := NewGramAccumulator(n)
	c.Add(x, 4, n)
	d := NewGramAccumulator(n)
	d.Add(x[4*n:], 6, n)
	c.Merge(d)
	ma, mc := a.Matrix(), c.Matrix()
	for i := range ma {
		if !bitsEqual64(ma[i], mc[i]) {
			t.Fatalf("strided input differs at %d", i)
		}
	}
	if a.Rows() != 10 || a.N() != n {
		t.Errorf("Rows %d N %d", a.Rows(), a.N())
	}
}

// TestGramAccumulatorMatrixScaled checks the blocked, parallel expansion of
// the triangle over several 64-wide blocks: every element is f times the
// mirrored accumulated value, whatever the number of workers.
func TestGramAccumulatorMatrixScaled(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	n, rows := 150, 300
	x := randMat32(r, rows*n)
	want := make([]float64, n*n)
	for b := 0; b < rows; b += blockK {
		SyrkLower64(n, min(blockK, rows-b), x[b*n:], n, want, n)
	}
	const f = 2.0 / 300
	for i := 0; i < n; i++ {
		for j := 0; j <= i; j++ {
			want[i*n+j] *= f
			want[j*n+i] = want[i*n+j]
		}
	}
	defer SetWorkers(SetWorkers(1))
	for _, w := range []int{1, 3} {
		SetWorkers(w)
		g := NewGramAccumulator(n)
		g.Add(x, rows, n)
		got := g.MatrixScaled(f)
		for i := range got {
			if !bitsEqual64(got[i], want[i]) {
				t.Fatalf("%d workers: element [%d,%d] = %g, want %g", w, i/n, i%n, got[i], want[i])
			}
		}
	}
}

// TestGramAccumulatorTakeScaled: the in-place matrix equals MatrixScaled
// bit for bit, pooled buffers come back clean (a recycled matrix full of
// garbage does not leak into the next sum), and use after TakeScaled
// panics.
func TestGramAccumulatorTakeScaled(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, n := range []int{3, 70, 130} {
		x := make([]float32, 300*n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		a := NewGramAccumulator(n)
		a.Add(x, 300, n)
		want := a.MatrixScaled(0.5)
		for round := 0; round < 3; round++ {
			b := NewGramAccumulator(n)
			b.Add(x[:77*n], 77, n)
			b.Add(x[77*n:], 223, n)
			got := b.TakeScaled(0.5)
			for i := range want {
				if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
					t.Fatalf("n=%d round %d: [%d] = %v, want %v", n, round, i, got[i], want[i])
				}
			}
			for i := range got {
				got[i] = math.NaN()
			}
			RecycleMatrix(got)
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("Add after TakeScaled did not panic")
					}
				}()
				b.Add(x[:n], 1, n)
			}()
		}
		a.Release()
	}
}
