package gptq

import (
	"math"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/kernels"
)

// colQuantizer is a grid bound to one solver run: it quantizes the rows
// [ch.r0, ch.r1) of working column k, whose current values are w, into q
// (both of length ch.r1−ch.r0). Calls for different chunks may run
// concurrently; calls for one chunk come in column order.
type colQuantizer[T float] interface {
	column(k int, w, q []T, ch *rowChunk[T])
	// blockLocal reports whether quantizing the columns of a block of
	// bs columns (blocks starting at multiples of bs) reads no weights of
	// a later block: then a block's column loop needs the lazy updates of
	// the earlier blocks only for its own columns.
	blockLocal(bs int) bool
}

// bind returns g's quantizer for the solver s.
func bind[T float](g Grid, s *solver[T]) colQuantizer[T] {
	switch g := g.(type) {
	case *IntGrid:
		return newIntState(g, s)
	case *BFPGrid:
		if g.Axis == bfp.AxisInput {
			return newBFPInputState(g, s)
		}
		rd := newBFPRounder(g.Format)
		return &bfpOutputState[T]{rd: rd, s: s, ec: newExpChoice(rd, s.opt.Exponent)}
	}
	panic("gptq: unknown grid type")
}

// IntParams are the grid parameters an integer-grid quantization chose, in
// the reference's conventions.
type IntParams struct {
	// Codes holds the integer code of every weight, rows×cols in original
	// column order; Q[r,c] == Scales[r,g]·(Codes[r,c] − Zeros[r,g]) with
	// g = GIdx[c].
	Codes []int32
	// Scales and Zeros are rows×Groups, row-major.
	Scales, Zeros []float64
	// Groups is the number of grids per row.
	Groups int
	// GIdx is the group of each original column: 0 without grouping,
	// column/GroupSize for plain and static groups, and the column's
	// position in the act-order permutation divided by GroupSize for
	// act-order without static groups.
	GIdx []int32
}

type intState[T float] struct {
	cfg         *IntConfig
	s           *solver[T]
	maxq        T
	scale, zero []T // current per-row grid
	staticScale []T // groups×rows, for static groups
	staticZero  []T
	buf         []T
	out         *IntParams
}

func newIntState[T float](g *IntGrid, s *solver[T]) *intState[T] {
	cfg := &g.cfg
	rows, cols := s.rows, s.cols
	st := &intState[T]{cfg: cfg, s: s, maxq: T(int(1)<<cfg.Bits - 1),
		scale: make([]T, rows), zero: make([]T, rows)}
	gs := cfg.GroupSize
	ng := 1
	if gs > 0 {
		ng = (cols + gs - 1) / gs
		st.buf = make([]T, gs)
	}
	st.out = &IntParams{Codes: make([]int32, rows*cols), Scales: make([]float64, rows*ng),
		Zeros: make([]float64, rows*ng), Groups: ng, GIdx: make([]int32, cols)}
	if gs <= 0 {
		// Whole-row grid from the weights before dead columns are zeroed.
		for r := 0; r < rows; r++ {
			st.scale[r], st.zero[r] = intParams(s.orig[r*cols:(r+1)*cols], cfg)
			st.out.Scales[r] = float64(st.scale[r])
			st.out.Zeros[r] = float64(st.zero[r])
		}
	} else if s.opt.StaticGroups {
		// Per group from the dead-zeroed weights in original column order.
		st.staticScale = make([]T, ng*rows)
		st.staticZero = make([]T, ng*rows)
		for gi := 0; gi < ng; gi++ {
			c0, c1 := gi*gs, min((gi+1)*gs, cols)
			for r := 0; r < rows; r++ {
				sc, z := intParams(s.w0[r*cols+c0:r*cols+c1], cfg)
				st.staticScale[gi*rows+r], st.staticZero[gi*rows+r] = sc, z
				st.out.Scales[r*ng+gi] = float64(sc)
				st.out.Zeros[r*ng+gi] = float64(z)
			}
		}
	}
	return st
}

// blockLocal is false: a group's grid is taken from the weights of its
// columns, which may lie in later blocks.
func (st *intState[T]) blockLocal(int) bool { return false }

// column quantizes a whole column: chunkRows gives integer grids a single
// chunk, since the grid state below is shared by all rows.
func (st *intState[T]) column(k int, w, q []T, ch *rowChunk[T]) {
	s := st.s
	if ch.r0 != 0 || len(w) != s.rows {
		panic("gptq: integer grid column quantized in row chunks")
	}
	rows, cols, gs := s.rows, s.cols, st.cfg.GroupSize
	c := s.perm[k]
	gi := 0
	if gs > 0 {
		if s.opt.StaticGroups {
			gi = c / gs
			copy(st.scale, st.staticScale[gi*rows:(gi+1)*rows])
			copy(st.zero, st.staticZero[gi*rows:(gi+1)*rows])
		} else {
			gi = k / gs
			if k%gs == 0 {
				// The reference reads the global weights here, which hold
				// the values of the start of the current block.
				m := min(gs, cols-k)
				buf := st.buf[:m]
				ng := st.out.Groups
				for r := 0; r < rows; r++ {
					for j := 0; j < m; j++ {
						buf[j] = s.wt[(k+j)*rows+r]
					}
					st.scale[r], st.zero[r] = intParams(buf, st.cfg)
					st.out.Scales[r*ng+gi] = float64(st.scale[r])
					st.out.Zeros[r*ng+gi] = float64(st.zero[r])
				}
			}
		}
	}
	st.out.GIdx[c] = int32(gi)
	for r := range w {
		v, code := intQuant(w[r], st.scale[r], st.zero[r], st.maxq)
		q[r] = v
		st.out.Codes[r*cols+c] = int32(code)
	}
}

// bfpNearest rounds x onto the BFP grid of shared exponent e in format f,
// flushing results the packer could not reproduce (float32 subnormals) to 0.
func bfpNearest(f bfp.Format, x float32, e uint8) float32 {
	v := f.Nearest(x, e)
	if math.Float32bits(v)&0x7f800000 == 0 {
		return 0
	}
	return v
}

type bfpOutputState[T float] struct {
	rd *bfpRounder
	s  *solver[T]
	ec expChoice
}

// blockLocal is true: a column's exponents come from the column alone.
func (st *bfpOutputState[T]) blockLocal(int) bool { return true }

// column fixes the exponent of each 16-row group of the column from its
// current values (from the original column with StaticGroups), then rounds
// onto it. Chunks start at multiples of 16 rows (chunkRows), so groups
// never straddle them. With an exponent rule other than ExpMax the
// exponent is chosen by the group's squared error: every row of a column
// has GPTQ's weight 1/U_kk², so the weighted and unweighted errors agree.
func (st *bfpOutputState[T]) column(k int, w, q []T, ch *rowChunk[T]) {
	if !st.s.opt.StaticGroups {
		if st.ec.steps == 0 {
			// Each 16-row group's exponent from its own current values.
			bfpRoundGroups(st.rd, w, q)
			return
		}
		n := len(w)
		ng := (n + bfp.GroupSize - 1) / bfp.GroupSize
		if len(ch.gexp) < ng {
			ch.gexp, ch.cols = make([]uint8, ng), make([][]T, 1)
		}
		exps := ch.gexp[:ng]
		if w32, ok := any(w).([]float32); ok {
			kernels.GroupMaxExponents32(w32, exps)
		} else {
			for i := range exps {
				exps[i] = maxExponent(w[i*bfp.GroupSize : min((i+1)*bfp.GroupSize, n)])
			}
		}
		ch.cols[0] = w
		chooseRows(&st.ec, &ch.es, ch.cols[:1], nil, bfp.GroupSize, exps)
		cand := ch.es.cand[:n]
		spreadExps(cand, exps, bfp.GroupSize, 0)
		bfpRoundVec(st.rd, w, q, cand)
		return
	}
	cols := st.s.cols
	src, stride := st.s.w0[ch.r0*cols+st.s.perm[k]:], cols
	var buf [bfp.GroupSize]float32
	for r0 := 0; r0 < len(w); r0 += bfp.GroupSize {
		r1 := min(r0+bfp.GroupSize, len(w))
		g := buf[:r1-r0]
		for r := r0; r < r1; r++ {
			g[r-r0] = float32(src[r*stride])
		}
		e := bfp.SharedExponent(g)
		if st.ec.steps > 0 {
			e = choose(&st.ec, g, nil, e)
		}
		bfpRoundConst(st.rd, w[r0:r1], q[r0:r1], e)
	}
}

type bfpInputState[T float] struct {
	rd    *bfpRounder
	ec    expChoice
	s     *solver[T]
	ng    int     // groups per row
	first []int   // working position at which each group's exponent is fixed
	exp   []uint8 // ng×rows: the exponents of group gi are exp[gi*rows:][:rows]
}

func newBFPInputState[T float](g *BFPGrid, s *solver[T]) *bfpInputState[T] {
	rows, cols := s.rows, s.cols
	ng := (cols + bfp.GroupSize - 1) / bfp.GroupSize
	rd := newBFPRounder(g.Format)
	st := &bfpInputState[T]{rd: rd, ec: newExpChoice(rd, s.opt.Exponent), s: s, ng: ng, first: make([]int, ng),
		exp: make([]uint8, rows*ng)}
	for gi := range st.first {
		st.first[gi] = math.MaxInt
	}
	for k, c := range s.perm {
		gi := c / bfp.GroupSize
		st.first[gi] = min(st.first[gi], k)
	}
	if s.opt.StaticGroups {
		var buf [bfp.GroupSize]float32
		var wts [bfp.GroupSize]float64
		for gi := 0; gi < ng; gi++ {
			c0, c1 := gi*bfp.GroupSize, min((gi+1)*bfp.GroupSize, cols)
			st.weights(c0, c1, wts[:])
			for r := 0; r < rows; r++ {
				for c := c0; c < c1; c++ {
					buf[c-c0] = float32(s.w0[r*cols+c])
				}
				e := bfp.SharedExponent(buf[:c1-c0])
				if st.ec.steps > 0 {
					e = choose(&st.ec, buf[:c1-c0], wts[:c1-c0], e)
				}
				st.exp[gi*rows+r] = e
			}
		}
		for gi := range st.first {
			st.first[gi] = -1 // already fixed
		}
	}
	return st
}

// blockLocal holds when the exponents are fixed before the loop
// (StaticGroups) or every 16-column group lies inside one block: columns in
// their original order and bs a multiple of the group size.
func (st *bfpInputState[T]) blockLocal(bs int) bool {
	return st.s.opt.StaticGroups || (!st.s.opt.ActOrder && bs%bfp.GroupSize == 0)
}

// weights sets wts[c−c0] to GPTQ's weight 1/U_kk² of each original column
// c in [c0, c1), k its working position: the factor by which the solver's
// error (and the proxy loss it equals) counts that column's squared
// rounding error when the column is quantized.
func (st *bfpInputState[T]) weights(c0, c1 int, wts []float64) {
	s := st.s
	for c := c0; c < c1; c++ {
		k := s.invperm[c]
		d := float64(s.u[k*s.cols+k])
		wts[c-c0] = 1 / (d * d)
	}
}

func (st *bfpInputState[T]) column(k int, w, q []T, ch *rowChunk[T]) {
	s := st.s
	c := s.perm[k]
	gi := c / bfp.GroupSize
	exp := st.exp[gi*s.rows+ch.r0 : gi*s.rows+ch.r1]
	if st.first[gi] == k {
		// Fix the group's exponents from the current values of its columns.
		c0, c1 := gi*bfp.GroupSize, min((gi+1)*bfp.GroupSize, s.cols)
		n := ch.r1 - ch.r0
		search := st.ec.steps > 0
		if search && ch.grp == nil {
			ch.grp = make([]T, bfp.GroupSize*n)
		}
		clear(exp)
		for cc := c0; cc < c1; cc++ {
			j := s.invperm[cc]
			var col []T
			if j == k {
				col = w
			} else {
				s.current(j, ch.cur, ch)
				col = ch.cur
			}
			if search {
				copy(ch.grp[(cc-c0)*n:(cc-c0+1)*n], col)
			}
			if c32, ok := any(col).([]float32); ok {
				kernels.MaxExponents32(c32, exp)
				continue
			}
			for r, v := range col {
				e := uint8(math.Float32bits(float32(v)) >> 23 & 0xff)
				exp[r] = max(exp[r], e)
			}
		}
		if search {
			// Per row, the exponent with the least error over the
			// group's columns at their current values, each weighted by
			// 1/U_kk² (docs/gptq.md: the columns not yet reached are
			// taken as they stand, before the feedback of the group's
			// earlier columns).
			var wts [bfp.GroupSize]float64
			m := c1 - c0
			st.weights(c0, c1, wts[:])
			if ch.cols == nil {
				ch.cols = make([][]T, bfp.GroupSize)
			}
			for jj := 0; jj < m; jj++ {
				ch.cols[jj] = ch.grp[jj*n : (jj+1)*n]
			}
			chooseRows(&st.ec, &ch.es, ch.cols[:m], wts[:m], 1, exp)
		}
	}
	bfpRoundVec(st.rd, w, q, exp)
}

// maxExponent is bfp.SharedExponent of the values of x as float32.
func maxExponent[T float](x []T) uint8 {
	var m uint32
	for _, v := range x {
		m = max(m, math.Float32bits(float32(v))>>23&0xff)
	}
	return uint8(m)
}
