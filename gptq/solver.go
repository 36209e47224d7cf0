package gptq

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/ttquant/ttquant/internal/kernels"
)

// Options configures Quantize.
type Options struct {
	// BlockSize is the number of columns per lazy-update block; 0 means 128.
	BlockSize int
	// SubBlock, when positive and smaller than BlockSize, propagates each
	// column's error column by column only within sub-blocks of this many
	// columns; the rest of the block receives a sub-block's update as one
	// matrix product, like the columns after the block. In exact arithmetic
	// this is the same algorithm; it is faster for matrices with many rows,
	// but its float32 rounding is further from the reference's. 0 means
	// column by column over the whole block, as the reference does.
	SubBlock int
	// PercDamp is the damping added to every diagonal entry of H, as a
	// fraction of the mean diagonal (after dead columns are set to 1). When
	// the Cholesky factorization fails the damping is raised automatically;
	// Result.PercDamp reports the value used. DefaultOptions sets 0.01.
	PercDamp float64
	// ActOrder processes columns in order of decreasing H diagonal (ties in
	// original column order, so the permutation is deterministic).
	ActOrder bool
	// StaticGroups computes every group's grid from the original weights
	// before the loop (integer grids with GroupSize > 0, BFP exponents).
	StaticGroups bool
	// Float64 runs the solver in float64 arithmetic, factorization
	// included; otherwise the damped Hessian, its factorization, the
	// weights, the inverse factor and all updates are float32 like the
	// reference.
	Float64 bool
	// KeepDead keeps the weights of dead input columns (H_jj = 0, never
	// active in the calibration data) and rounds them to the grid without
	// error feedback, instead of zeroing them as the reference does. Use it
	// when unseen inputs may still occur at inference, e.g. for rarely
	// routed experts; a Hessian with no tokens then gives exactly RTN.
	KeepDead bool
	// NoProxyLoss skips computing Result.ProxyLoss and Result.RTNProxyLoss,
	// which are then 0. Each costs about rows·cols² multiply-adds, as much
	// as the solver's own block updates.
	NoProxyLoss bool
	// Exponent is the rule choosing each BFP group's shared exponent when
	// the solver reaches the group (see ExponentRule); 0 means ExpMax, the
	// packer's rule. Setting a rule for an integer grid is an error
	// (ValidateFor, Quantize). Result.RTNProxyLoss stays that of RTN with
	// ExpMax, the baseline.
	Exponent ExponentRule
	// Name identifies the matrix in error messages (e.g. a tensor name).
	Name string
}

// Limits of Options checked by Validate.
const (
	// MaxBlockSize is the largest lazy-update block size accepted.
	MaxBlockSize = 1 << 16
	// MaxPercDamp is the largest damping fraction accepted: the whole
	// mean diagonal. Larger values are not a GPTQ setting but a typo; the
	// automatic increases after a failed factorization may go beyond it.
	MaxPercDamp = 1.0
)

// Validate reports an option out of range, wrapping ErrOptions: Exponent
// must be 0 or a valid ExponentRule, BlockSize
// and SubBlock must be 0 (the default) to MaxBlockSize, PercDamp a finite
// value from 0 to MaxPercDamp. Quantize and NewFactor call it; an invalid
// option is an error, never a fallback.
func (o Options) Validate() error {
	switch {
	case o.BlockSize < 0 || o.BlockSize > MaxBlockSize:
		return fmt.Errorf("%w: block size %d%s: want 1 to %d (0 for the default 128)", ErrOptions, o.BlockSize, label(o.Name), MaxBlockSize)
	case o.SubBlock < 0 || o.SubBlock > MaxBlockSize:
		return fmt.Errorf("%w: sub-block %d%s: want 0 to %d", ErrOptions, o.SubBlock, label(o.Name), MaxBlockSize)
	case math.IsNaN(o.PercDamp) || o.PercDamp < 0 || o.PercDamp > MaxPercDamp:
		return fmt.Errorf("%w: damping %g%s: want 0 to %g", ErrOptions, o.PercDamp, label(o.Name), MaxPercDamp)
	}
	return checkRule(o.Exponent, nil, o.Name)
}

// ValidateFor is Validate plus the checks that depend on the grid: an
// exponent rule needs a BFP grid.
func (o Options) ValidateFor(g Grid) error {
	if err := o.Validate(); err != nil {
		return err
	}
	return checkRule(o.Exponent, g, o.Name)
}

// DefaultOptions returns block size 128, 1% damping, no act-order, float32.
func DefaultOptions() Options { return Options{BlockSize: 128, PercDamp: 0.01} }

// Result is the outcome of Quantize for one matrix.
type Result struct {
	// Q is the quantized weight, rows×cols row-major in original column
	// order; every value lies on the grid.
	Q []float32
	// Error is the reference's reported error: Σ (w−q)²/(2·U_kk²) over all
	// weights, w being the error-updated weight when its column was
	// quantized. In exact arithmetic it equals ½·tr(Δ·H′·Δᵀ) with
	// Δ = W₀ − Q (W₀: dead columns zeroed) and H′ the damped Hessian.
	Error float64
	// RowError is the per-row share of Error.
	RowError []float64
	// ProxyLoss is ½·tr(Δ·H·Δᵀ) with Δ = W − Q and the undamped H that was
	// passed in: with H = (2/n)·Σ x·xᵀ it is the mean squared output error
	// per token, (1/n)·Σ‖Δ·x‖². It is derived from Error, which equals
	// it plus the damping's share ½·Σ_c (H′_cc − H_cc)·‖Δ₀[:, c]‖² in
	// exact arithmetic, so it costs no matrix product (agreement with the
	// explicit trace: about 1e-6 relative in float32 mode); without error
	// feedback (NoFeedback) the trace is formed explicitly.
	ProxyLoss float64
	// RTNProxyLoss is the same quantity for RTN on the same grid.
	RTNProxyLoss float64
	// PercDamp is the damping fraction finally used and Damp the absolute
	// value λ added to every diagonal entry.
	PercDamp, Damp float64
	// DampIncreases counts the automatic damping increases after failed
	// factorizations.
	DampIncreases int
	// NoFeedback is set when no damping level gave a usable factorization
	// (only possible for an H that is far from positive semidefinite): the
	// matrix was then quantized column by column without error feedback.
	NoFeedback bool
	// DeadCols is the number of input columns with H_jj = 0; their weights
	// are set to zero, as in the reference, unless Options.KeepDead.
	DeadCols int
	// Perm is the act-order permutation (working position → original
	// column), nil without act-order.
	Perm []int
	// Int holds the chosen integer grid, nil for other grids.
	Int *IntParams
	// Duration is the wall-clock time of the call.
	Duration time.Duration
}

// Sentinel errors wrapped by the errors of this package.
var (
	// ErrShape: dimensions not positive or not matching the data.
	ErrShape = errors.New("gptq: shape mismatch")
	// ErrNotFinite: a NaN or Inf in the weights, the inputs or the Hessian.
	ErrNotFinite = errors.New("gptq: value not finite")
	// ErrHessian: a Hessian that cannot be a Gram matrix (negative diagonal,
	// not symmetric).
	ErrHessian = errors.New("gptq: invalid Hessian")
	// ErrOptions: invalid options or grid.
	ErrOptions = errors.New("gptq: invalid options")
	// ErrNumeric: the computation overflowed.
	ErrNumeric = errors.New("gptq: numerical failure")
)

func label(name string) string {
	if name == "" {
		return ""
	}
	return " (" + name + ")"
}

// checkWeights validates the weight matrix.
func checkWeights(w []float32, rows, cols int, name string) error {
	if rows <= 0 || cols <= 0 || rows > math.MaxInt32 || cols > math.MaxInt32 || rows > math.MaxInt/cols {
		return fmt.Errorf("%w: weight%s shape %d×%d", ErrShape, label(name), rows, cols)
	}
	if len(w) != rows*cols {
		return fmt.Errorf("%w: weight%s has %d values, want %d×%d = %d", ErrShape, label(name), len(w), rows, cols, rows*cols)
	}
	// A vector scan on all cores; the first bad value in row-major order
	// is then located by a serial pass.
	if kernels.AllFinite32(w) {
		return nil
	}
	for i, v := range w {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: weight%s [%d,%d] of %d×%d is %v", ErrNotFinite, label(name), i/cols, i%cols, rows, cols, v)
		}
	}
	return nil
}

// checkHessian validates an n×n Hessian.
func checkHessian(h []float64, n int, name string) error {
	if len(h) != n*n {
		return fmt.Errorf("%w: Hessian%s has %d values, want a square %d×%d matrix over the %d input columns", ErrShape, label(name), len(h), n, n, n)
	}
	// The scans run over row ranges on all cores; a range that finds a
	// problem stops, and the problem reported is the first in row-major
	// order whatever the split (a second, serial pass locates it).
	procs := min(runtime.GOMAXPROCS(0), max(1, n/256))
	maxes := make([]float64, procs)
	bad := make([]bool, procs)
	kernels.ParallelFor(procs, procs, func(p, _ int) {
		m := 0.0
		for _, v := range h[p*n/procs*n : (p+1)*n/procs*n] {
			// One comparison catches NaN and ±Inf.
			a := math.Abs(v)
			if !(a <= math.MaxFloat64) {
				bad[p] = true
				return
			}
			if a > m {
				m = a
			}
		}
		maxes[p] = m
	})
	if slices.Contains(bad, true) {
		for i, v := range h {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("%w: Hessian%s [%d,%d] of %d×%d is %v", ErrNotFinite, label(name), i/n, i%n, n, n, v)
			}
		}
	}
	maxAbs := slices.Max(maxes)
	for j := 0; j < n; j++ {
		if h[j*n+j] < 0 {
			return fmt.Errorf("%w: Hessian%s diagonal [%d,%d] = %g is negative", ErrHessian, label(name), j, j, h[j*n+j])
		}
	}
	// Symmetry, tile by tile so that the transposed reads stay in cache;
	// the tile rows are dealt out so that every core gets a similar share
	// of the triangle.
	const tile = 32
	tol := 1e-4 * maxAbs
	nt := (n + tile - 1) / tile
	asym := func(t int) (int, int, bool) {
		i0 := t * tile
		for j0 := 0; j0 <= i0; j0 += tile {
			for i := i0; i < min(i0+tile, n); i++ {
				row := h[i*n+j0 : i*n+min(j0+tile, i)]
				for jj, v := range row {
					if j := j0 + jj; math.Abs(v-h[j*n+i]) > tol {
						return i, j, true
					}
				}
			}
		}
		return 0, 0, false
	}
	clear(bad)
	kernels.ParallelFor(procs, procs, func(p, _ int) {
		for t := p; t < nt; t += procs {
			if _, _, ok := asym(t); ok {
				bad[p] = true
				return
			}
		}
	})
	if slices.Contains(bad, true) {
		for t := 0; t < nt; t++ {
			if i, j, ok := asym(t); ok {
				return fmt.Errorf("%w: Hessian%s is not symmetric: [%d,%d] = %g, [%d,%d] = %g", ErrHessian, label(name), i, j, h[i*n+j], j, i, h[j*n+i])
			}
		}
	}
	return nil
}

func checkGrid(g Grid, name string) error {
	if g == nil {
		return fmt.Errorf("%w: no grid%s", ErrOptions, label(name))
	}
	switch g.(type) {
	case *IntGrid, *BFPGrid:
	default:
		return fmt.Errorf("%w: unsupported grid type %T%s", ErrOptions, g, label(name))
	}
	if err := g.Validate(); err != nil {
		return fmt.Errorf("%w%s: %w", ErrOptions, label(name), err)
	}
	return nil
}

// Quantize quantizes the weight matrix w (rows = outputs, cols = inputs,
// row-major) onto grid g with GPTQ, using the Hessian h (cols×cols,
// row-major, typically Hessian.Matrix()). The algorithm follows the
// reference implementation step by step (see the package documentation);
// the result is deterministic. Bad input (shapes, NaN/Inf, an H that is not
// square or has a negative diagonal) is reported as an error.
//
// Quantize is NewFactor followed by Factor.Quantize; to quantize several
// matrices with the same H, build the Factor once.
func Quantize(w []float32, rows, cols int, h []float64, g Grid, opt Options) (*Result, error) {
	start := time.Now()
	if err := checkWeights(w, rows, cols, opt.Name); err != nil {
		return nil, err
	}
	if err := checkGrid(g, opt.Name); err != nil {
		return nil, err
	}
	if err := opt.ValidateFor(g); err != nil {
		return nil, err
	}
	// RTN's proxy loss needs neither the factorization nor the solve: it
	// runs alongside them and fills the cores their serial parts leave
	// idle.
	var rl *asyncLoss
	if !opt.NoProxyLoss && len(h) == cols*cols {
		rl = startRTNLoss(g, w, rows, cols, h, opt.Float64)
	}
	f, err := NewFactor(h, cols, opt)
	if err != nil {
		rl.wait()
		return nil, err
	}
	res, err := f.quantize(w, rows, g, f.opt, rl)
	// The Factor never leaves this call: its inverse factor can serve the
	// next one.
	f.Release()
	if err != nil {
		return nil, err
	}
	res.Duration = time.Since(start)
	return res, nil
}

// Factor is a Hessian prepared for GPTQ: validated, dead columns found,
// columns ordered, damped and factored into the inverse factor U. One Factor
// quantizes any number of weight matrices that share the Hessian (for
// example the gate and up projections of an expert, which see the same
// inputs), saving the O(cols³) factorization for all but the first. A
// Factor is immutable and safe for concurrent use.
type Factor struct {
	cols          int
	opt           Options
	h             []float64 // the Hessian as given (not copied; must not change)
	dead          []bool
	deadCols      int
	perm, invperm []int
	u32           []float32 // U in working order, float32 mode
	u64           []float64 // U in working order, float64 mode

	percDamp, damp float64
	increases      int
	noFeedback     bool
	// extra is H′_cc − H_cc per original column c: what damping (and the
	// dead-column fill) added to the diagonal, as the solver's arithmetic
	// rounded it. The proxy loss is derived from the solve's error with it.
	extra []float64
}

// setExtra records H′_cc − H_cc for the final damping λ, with the damped
// diagonal rounded to T as permuteRev rounds it.
func setExtra[T float](f *Factor, h, diag []float64, lam T) {
	n := f.cols
	f.extra = make([]float64, n)
	for c := range f.extra {
		f.extra[c] = float64(T(diag[c])+lam) - h[c*n+c]
	}
}

// NewFactor validates the cols×cols Hessian h and the options and prepares
// the factorization Quantize needs (see Options for damping, act-order and
// precision). h is retained, not copied, and must not be modified while the
// Factor is in use.
func NewFactor(h []float64, cols int, opt Options) (*Factor, error) {
	if cols <= 0 || cols > math.MaxInt32 {
		return nil, fmt.Errorf("%w: Hessian%s over %d columns", ErrShape, label(opt.Name), cols)
	}
	if err := checkHessian(h, cols, opt.Name); err != nil {
		return nil, err
	}
	opt, err := normalizeSolveOptions(opt)
	if err != nil {
		return nil, err
	}
	is32 := !opt.Float64
	f := &Factor{cols: cols, opt: opt, h: h}
	// Dead columns: H_jj = 0 → H_jj = 1 (and W[:, j] = 0 when quantizing).
	f.dead = make([]bool, cols)
	diag := make([]float64, cols)
	for j := 0; j < cols; j++ {
		diag[j] = h[j*cols+j]
		if diag[j] == 0 {
			f.dead[j] = true
			diag[j] = 1
			f.deadCols++
		}
	}
	// Column order.
	f.perm = make([]int, cols)
	for j := range f.perm {
		f.perm[j] = j
	}
	if opt.ActOrder {
		slices.SortStableFunc(f.perm, func(a, b int) int {
			switch {
			case diag[a] > diag[b]:
				return -1
			case diag[a] < diag[b]:
				return 1
			}
			return 0
		})
	}
	f.invperm = make([]int, cols)
	for k, c := range f.perm {
		f.invperm[c] = k
	}
	// Inverse factor of the damped, permuted Hessian.
	var mean float64
	for _, d := range diag {
		mean += d
	}
	mean /= float64(cols)
	if is32 {
		f.factor32(h, diag, mean)
	} else {
		f.factor64(h, diag, mean)
	}
	return f, nil
}

// factor64 damps the permuted Hessian and factors it in float64, raising
// the damping on failure (float64 mode).
func (f *Factor) factor64(h, diag []float64, mean float64) {
	cols := f.cols
	hp := getBuf[float64](cols * cols)
	defer putBuf(hp)
	var u []float64
	var lam float64
	for try, p := range dampSchedule(f.opt.PercDamp) {
		lam = p * mean
		permuteRev(f, hp, h, diag, lam)
		f.percDamp, f.damp, f.increases = p, lam, try
		if v, ok := inverseFactorRev(hp, cols); ok {
			u = v
			break
		}
	}
	if u == nil {
		f.noFeedback = true
		u = diagonalFactor(f, diag, lam)
	}
	setExtra(f, h, diag, lam)
	f.u64 = u
}

// permuteRev writes into hp the lower triangle of the damped, permuted
// Hessian H′ in reverse order, R[a][b] = H′[n-1-a][n-1-b] (the input of
// kernels.CholInvUpperRev), rounded to T, with λ added to its
// (dead-fixed) diagonal, the diagonal entry rounded to T before the
// addition. The values are those of the lower triangle of H′, read from h
// at [perm[x]][perm[y]] with x > y, so an H that is symmetric only within
// checkHessian's tolerance gives the same bits as a lower-triangle read.
// Column b of R is one row of h read backwards: the copy runs in tiles so
// that the strided writes stay in cache, tile rows on all cores.
func permuteRev[T float](f *Factor, hp []T, h, diag []float64, lam T) {
	n := f.cols
	const bs = 64
	nt := (n + bs - 1) / bs
	procs := runtime.GOMAXPROCS(0)
	if n < 256 {
		procs = 1
	}
	kernels.ParallelFor(nt, procs, func(t, _ int) {
		ia := (nt - 1 - t) * bs // longest tile rows first
		for jb := 0; jb <= ia; jb += bs {
			for b := jb; b < min(jb+bs, n); b++ {
				src := h[f.perm[n-1-b]*n : (f.perm[n-1-b]+1)*n]
				for a := max(ia, b+1); a < min(ia+bs, n); a++ {
					if f.opt.ActOrder {
						hp[a*n+b] = T(src[f.perm[n-1-a]])
					} else {
						hp[a*n+b] = T(src[n-1-a])
					}
				}
			}
		}
		for a := ia; a < min(ia+bs, n); a++ {
			hp[a*n+a] = T(diag[f.perm[n-1-a]]) + lam
		}
	})
}

// diagonalFactor is the factor used when no damping level gave a usable
// factorization: no error feedback, U = diag(H′_kk^(-1/2)) with no
// coupling.
func diagonalFactor[T float](f *Factor, diag []float64, lam T) []T {
	cols := f.cols
	u := make([]T, cols*cols)
	for k := 0; k < cols; k++ {
		u[k*cols+k] = T(1 / math.Sqrt(float64(T(diag[f.perm[k]])+lam)))
	}
	return u
}

// factor32 is factor64 in float32, the precision of the reference
// implementation (float32 mode): the damping λ, the damped diagonal and the
// Hessian are rounded to float32 and factored by the float32 kernels, which
// is about twice as fast as float64.
func (f *Factor) factor32(h, diag []float64, mean float64) {
	cols := f.cols
	// Only the lower triangle is written and read (CholInvUpper32 reads
	// the lower triangle of its input), so a reused buffer needs no
	// clearing.
	hp := getBuf[float32](cols * cols)
	defer putBuf(hp)
	var u []float32
	var lam float32
	for try, p := range dampSchedule(f.opt.PercDamp) {
		lam = float32(float32(p) * float32(mean))
		permuteRev(f, hp, h, diag, lam)
		f.percDamp, f.damp, f.increases = p, float64(lam), try
		if v, ok := inverseFactorRev(hp, cols); ok {
			u = v
			break
		}
	}
	if u == nil {
		f.noFeedback = true
		u = diagonalFactor(f, diag, lam)
	}
	setExtra(f, h, diag, lam)
	f.u32 = u
}

// Release hands the Factor's inverse factor (cols² values) to the buffer
// pool for later factorizations; f must not be used afterwards. Optional:
// without it the garbage collector reclaims the memory.
func (f *Factor) Release() {
	putBuf(f.u32)
	putBuf(f.u64)
	f.u32, f.u64 = nil, nil
}

// Cols returns the number of input columns of the Factor's Hessian.
func (f *Factor) Cols() int { return f.cols }

// Quantize quantizes the rows×Cols() weight matrix w onto grid g with the
// prepared Hessian, exactly as the package-level Quantize does. opt gives
// the per-matrix options (BlockSize, SubBlock, StaticGroups, KeepDead,
// NoProxyLoss, Name); its PercDamp, ActOrder and Float64 must equal the
// Factor's, since the factorization depends on them. Result.Duration covers
// this call only.
func (f *Factor) Quantize(w []float32, rows int, g Grid, opt Options) (*Result, error) {
	start := time.Now()
	if err := checkWeights(w, rows, f.cols, opt.Name); err != nil {
		return nil, err
	}
	if err := checkGrid(g, opt.Name); err != nil {
		return nil, err
	}
	if err := opt.ValidateFor(g); err != nil {
		return nil, err
	}
	if opt.PercDamp != f.opt.PercDamp || opt.ActOrder != f.opt.ActOrder || opt.Float64 != f.opt.Float64 {
		return nil, fmt.Errorf("%w%s: damping %g, act-order %v, float64 %v differ from the factor's %g, %v, %v",
			ErrOptions, label(opt.Name), opt.PercDamp, opt.ActOrder, opt.Float64, f.opt.PercDamp, f.opt.ActOrder, f.opt.Float64)
	}
	opt, err := normalizeSolveOptions(opt)
	if err != nil {
		return nil, err
	}
	var rl *asyncLoss
	if !opt.NoProxyLoss {
		rl = startRTNLoss(g, w, rows, f.cols, f.h, f.opt.Float64)
	}
	res, err := f.quantize(w, rows, g, opt, rl)
	if err != nil {
		return nil, err
	}
	res.Duration = time.Since(start)
	return res, nil
}

// normalizeSolveOptions fills in the default block size and checks the
// per-matrix options.
func normalizeSolveOptions(opt Options) (Options, error) {
	if err := opt.Validate(); err != nil {
		return opt, err
	}
	if opt.BlockSize == 0 {
		opt.BlockSize = 128
	}
	return opt, nil
}

// quantize runs the solver on validated input with the per-matrix options
// opt. rl is RTN's proxy loss being computed concurrently (startRTNLoss),
// nil with opt.NoProxyLoss; quantize waits for it before returning.
func (f *Factor) quantize(w []float32, rows int, g Grid, opt Options, rl *asyncLoss) (*Result, error) {
	var res *Result
	var err error
	if f.opt.Float64 {
		res, err = run(f, f.u64, w, rows, g, opt)
	} else {
		res, err = run(f, f.u32, w, rows, g, opt)
	}
	rtnLoss := rl.wait()
	if err != nil {
		return nil, err
	}
	res.RTNProxyLoss = rtnLoss
	res.PercDamp, res.Damp, res.DampIncreases, res.NoFeedback = f.percDamp, f.damp, f.increases, f.noFeedback
	res.DeadCols = f.deadCols
	if f.opt.ActOrder {
		res.Perm = slices.Clone(f.perm)
	}
	return res, nil
}

// solver holds the state of one GPTQ run in arithmetic T.
type solver[T float] struct {
	rows, cols    int
	opt           Options
	orig          []T   // W as given, row-major, original order
	w0            []T   // W with dead columns zeroed, row-major, original order
	perm, invperm []int // working position → original column, and back
	wt            []T   // working weights, column-major in working order
	u             []T   // upper inverse factor, cols×cols row-major, working order

	// current block [i1, i2)
	i1, i2 int
	e      []T // scaled errors of the block's columns, column-major
}

// rowChunk is the progress of the in-block loop over the rows [r0, r1):
// rows are independent problems within a block (every grid fixes its
// parameters per row, or per 16-row group on the output axis), so chunks
// of rows run the block concurrently.
type rowChunk[T float] struct {
	r0, r1 int
	s1, s2 int // current sub-block [i1+s1, i1+s2)
	done   int // columns of the block already quantized (block-local)
	cur    []T // scratch column of r1−r0 values
	// Scratch of the exponent search, allocated on first use: the 16
	// columns of a group (input axis), views of them, group exponents
	// (output axis) and chooseRows's space.
	grp  []T
	cols [][]T
	gexp []uint8
	es   expScratch[T]
	// w1 holds the chunk's rows of the block's columns with the
	// in-block updates, column-major with leading dimension r1−r0: the
	// chunk's own contiguous copy, so that the column loop's updates stay
	// in the core's cache (columns of a matrix-wide buffer lie rows·4
	// bytes apart and compete for the same cache sets).
	w1 []T
}

// chunkRows is the number of rows per chunk of the in-block loop: whole
// 16-row groups, at least 128 rows per chunk, up to four chunks for up to
// two cores and two per core beyond; one chunk for integer grids, whose
// state is shared across rows. The chunking never changes the result: the
// in-block arithmetic is elementwise per row, BFP groups never straddle a
// chunk, and the sub-block products give every element the same chain
// whatever the split of their columns (TestChunkingIndependent).
func chunkRows(rows int, g Grid, procs int) int {
	if _, ok := g.(*IntGrid); ok {
		return rows
	}
	n := min(max(4, 2*procs), max(1, rows/128))
	c := (rows + n - 1) / n
	return (c + 15) &^ 15
}

// current writes the current (error-updated) values of working column j,
// which must not be quantized yet, for the rows of chunk ch into dst: the
// stored values minus the updates still pending from the columns of the
// current block (or sub-block) already quantized.
func (s *solver[T]) current(j int, dst []T, ch *rowChunk[T]) {
	rows, r0, r1 := s.rows, ch.r0, ch.r1
	from := 0 // first block-local column whose update j has not received
	if jl := j - s.i1; jl >= 0 && j < s.i2 {
		n := r1 - r0
		copy(dst, ch.w1[jl*n:(jl+1)*n])
		if jl < ch.s2 {
			return
		}
		from = ch.s1
	} else {
		copy(dst, s.wt[j*rows+r0:j*rows+r1])
	}
	for i := from; i < ch.done; i++ {
		if u := s.u[(s.i1+i)*s.cols+j]; u != 0 {
			axpySub(u, s.e[i*rows+r0:i*rows+r1], dst)
		}
	}
}

// block runs the column loop of the current block [s.i1, s.i2) over the
// rows of ch: quantize each column, record its error and propagate it to
// the block's later columns.
func (s *solver[T]) block(ch *rowChunk[T], cq colQuantizer[T], qt []T, rowLoss []float64, sb int) {
	rows, cols, i1 := s.rows, s.cols, s.i1
	r0, r1 := ch.r0, ch.r1
	n := r1 - r0
	nb := s.i2 - i1
	rl := rowLoss[r0:r1]
	ch.done = 0
	// This chunk's rows of the block: current weights in, errors cleared.
	w1 := ch.w1
	for i := 0; i < nb; i++ {
		copy(w1[i*n:(i+1)*n], s.wt[(i1+i)*rows+r0:(i1+i)*rows+r1])
		clear(s.e[i*rows+r0 : i*rows+r1])
	}
	for j1 := 0; j1 < nb; j1 += sb {
		j2 := min(j1+sb, nb)
		ch.s1, ch.s2 = j1, j2
		for i := j1; i < j2; i++ {
			k := i1 + i
			col := w1[i*n : (i+1)*n]
			q := qt[k*rows+r0 : k*rows+r1]
			cq.column(k, col, q, ch)
			d := s.u[k*cols+k]
			d2 := d * d
			ei := s.e[i*rows+r0 : i*rows+r1]
			if c32, ok := any(col).([]float32); ok {
				// The loop below, eight rows at a time.
				kernels.QuantErr32(c32, any(q).([]float32), any(ei).([]float32), rl, float32(d), float32(d2))
			} else {
				for r, wv := range col {
					diff := wv - q[r]
					rl[r] += float64(diff*diff/d2) / 2
					ei[r] = diff / d
				}
			}
			ch.done = i + 1
			// W1[:, i+1:j2] -= e ⊗ U[k, i1+i+1 : i1+j2]
			if m := j2 - i - 1; m > 0 {
				rank1Sub(m, n, s.u[k*cols+k+1:k*cols+k+1+m], ei, w1[(i+1)*n:], n)
			}
		}
		if j2 < nb {
			// The sub-block's update of the rest of the block, as one
			// product: W1[:, j2:] -= E[:, j1:j2]·U[j1:j2, j2:nb].
			gemmSubTN(nb-j2, n, j2-j1, s.u[(i1+j1)*cols+i1+j2:], cols, s.e[j1*rows+r0:], rows, w1[j2*n:], n)
		}
	}
}

// dampSchedule is the sequence of damping fractions tried: the requested one,
// then increasing steps up to about 10 times the mean diagonal.
func dampSchedule(p float64) []float64 {
	s := []float64{p}
	for step := 0.01; step <= 10.24; step *= 2 {
		s = append(s, p+step)
	}
	return s
}

func run[T float](f *Factor, u []T, w32 []float32, rows int, g Grid, opt Options) (*Result, error) {
	cols, name := f.cols, opt.Name
	h := f.h
	s := &solver[T]{rows: rows, cols: cols, opt: opt, perm: f.perm, invperm: f.invperm, u: u}
	res := &Result{}

	procs := runtime.GOMAXPROCS(0)
	// The working copies come from a pool and go back at the end: every
	// element is written before it is read.
	s.wt = getBuf[T](rows * cols)
	defer putBuf(s.wt)
	s.load(f, w32, procs)
	const tb = 16
	cq := bind(g, s)
	qt := getBuf[T](rows * cols)
	defer putBuf(qt)
	rowLoss := make([]float64, rows)
	s.solve(g, cq, qt, rowLoss, procs)

	// Outputs in original column order.
	res.Q = make([]float32, rows*cols)
	nrt := (rows + tb - 1) / tb
	// With the proxy loss, each row tile also sums Σ_c extra_c·Δ₀[r][c]²
	// (Δ₀ = W₀ − Q in the solver's arithmetic), the part of the reported
	// error that comes from the damping; per tile, then over the tiles in
	// order, so the value does not depend on the number of cores.
	incremental := !opt.NoProxyLoss && !f.noFeedback
	var tileExtra []float64
	if incremental {
		tileExtra = make([]float64, nrt)
	}
	s.store(f, qt, res.Q, tileExtra, procs)
	if !kernels.AllFinite32(res.Q) {
		for i, v := range res.Q {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("%w: quantized weight%s [%d,%d] of %d×%d is %v (overflow)", ErrNumeric, label(name), i/cols, i%cols, rows, cols, v)
			}
		}
	}
	res.RowError = rowLoss
	for _, l := range rowLoss {
		res.Error += l
	}
	if math.IsNaN(res.Error) || math.IsInf(res.Error, 0) {
		return nil, fmt.Errorf("%w: reported error%s is %v (overflow)", ErrNumeric, label(name), res.Error)
	}
	if is, ok := cq.(*intState[T]); ok {
		res.Int = is.out
	}
	// Report: GPTQ's proxy loss on the undamped H (RTN's is computed by
	// the caller, Factor.quantize). The reported error is ½·tr(Δ₀·H′·Δ₀ᵀ)
	// in exact arithmetic, H′ = H + diag(extra), and the columns where Δ₀
	// and W − Q differ (dead ones) have zero rows and columns in H, so
	// ½·tr(Δ·H·Δᵀ) = Error − ½·Σ_c extra_c·‖Δ₀[:, c]‖²: no product needed.
	// Without error feedback that identity does not hold and the trace
	// is formed explicitly.
	switch {
	case opt.NoProxyLoss:
	case incremental:
		var ex float64
		for _, v := range tileExtra {
			ex += v
		}
		// Rounding can leave a tiny negative value where the loss is 0.
		res.ProxyLoss = max(0, res.Error-ex/2)
	default:
		res.ProxyLoss = proxyLoss(w32, res.Q, rows, cols, h)
	}
	return res, nil
}

// solve runs GPTQ's column loop over the working weights block by block,
// writing the quantized columns into qt and each row's loss into rowLoss.
func (s *solver[T]) solve(g Grid, cq colQuantizer[T], qt []T, rowLoss []float64, procs int) {
	rows, cols, opt := s.rows, s.cols, s.opt
	bs := min(opt.BlockSize, cols)
	sb := bs
	if opt.SubBlock > 0 {
		sb = min(opt.SubBlock, bs)
	}
	// Two error buffers: with lookahead (below) a block's errors are
	// still being read by the lazy update while the next block writes
	// its own.
	eBufs := [2][]T{getBuf[T](bs * rows), getBuf[T](bs * rows)}
	defer putBuf(eBufs[0])
	defer putBuf(eBufs[1])
	s.e = eBufs[0]
	cr := chunkRows(rows, g, procs)
	var chunks []rowChunk[T]
	for r0 := 0; r0 < rows; r0 += cr {
		r1 := min(r0+cr, rows)
		// Each block fills the chunk's w1 before reading it.
		chunks = append(chunks, rowChunk[T]{r0: r0, r1: r1, cur: make([]T, r1-r0), w1: getBuf[T](bs * (r1 - r0))})
	}
	defer func() {
		for _, ch := range chunks {
			putBuf(ch.w1)
		}
	}()
	workers := min(len(chunks), procs)
	columnLoop := func() {
		kernels.ParallelFor(len(chunks), workers, func(c, _ int) { s.block(&chunks[c], cq, qt, rowLoss, sb) })
	}
	if workers > 1 && cq.blockLocal(bs) {
		// Lookahead: once block [i1, i2) is done, the lazy update of
		// the next block's columns runs first, then the next block's
		// column loop runs alongside the update of the columns after
		// it, which that loop does not read. Every element still gets
		// the same product chains in the same block order (a product's
		// rows are independent), so the result is that of the loop
		// below, with one synchronisation point per block instead of
		// two and the column loop's uneven end filled with product
		// work. On one worker there is nothing to overlap and the plain
		// loop runs (TestChunkingIndependent compares the two paths).
		s.i1, s.i2 = 0, min(bs, cols)
		columnLoop()
		pb := new(kernels.PackedB32)
		for i1 := 0; i1+bs < cols; i1 += bs {
			i2 := i1 + bs
			i3 := min(i2+bs, cols)
			e := s.e
			next := func() {
				s.i1, s.i2 = i2, i3
				if &s.e[0] == &eBufs[0][0] {
					s.e = eBufs[1]
				} else {
					s.e = eBufs[0]
				}
				columnLoop()
			}
			if u32, ok := any(s.u).([]float32); ok {
				// Both products share op(B) = E: packed once, as the
				// single product of the plain loop packs it (packing it
				// twice cost 4 ms per 2048×768 solve).
				pb.Repack(false, bs, rows, any(e).([]float32), rows)
				wt32 := any(s.wt).([]float32)
				kernels.SgemmPacked(true, i3-i2, -1, u32[i1*cols+i2:], cols, pb, 1, wt32[i2*rows:], rows)
				kernels.SgemmPackedAcc(true, cols-i3, -1, u32[i1*cols+i3:], cols, pb, wt32[i3*rows:], rows, next)
				continue
			}
			gemmSubTN(i3-i2, rows, bs, s.u[i1*cols+i2:], cols, e, rows, s.wt[i2*rows:], rows)
			gemmSubTNSide(cols-i3, rows, bs, s.u[i1*cols+i3:], cols, e, rows, s.wt[i3*rows:], rows, next)
		}
	} else {
		for i1 := 0; i1 < cols; i1 += bs {
			i2 := min(i1+bs, cols)
			nb := i2 - i1
			s.i1, s.i2 = i1, i2
			columnLoop()
			if i2 < cols {
				// Lazy batch update: W[:, i2:] -= E·U[i1:i2, i2:], here
				// in column-major form Wt[i2:] -= U[i1:i2, i2:]ᵀ·Eᵀ.
				gemmSubTN(cols-i2, rows, nb, s.u[i1*cols+i2:], cols, s.e, rows, s.wt[i2*rows:], rows)
			}
		}
	}

}

// load sets the solver's weights from w32: orig (w32 itself in float32
// mode), w0 (orig with the dead columns zeroed unless KeepDead) and the
// working copy wt, column-major in permuted column order.
func (s *solver[T]) load(f *Factor, w32 []float32, procs int) {
	rows, cols, opt := s.rows, s.cols, s.opt
	// orig and w0 are only read: in float32 mode without dead columns to
	// zero they are the caller's w itself.
	if o, ok := any(w32).([]T); ok {
		s.orig = o
	} else {
		s.orig = make([]T, rows*cols)
		for i, v := range w32 {
			s.orig[i] = T(v)
		}
	}
	s.w0 = s.orig
	if f.deadCols > 0 && !opt.KeepDead {
		s.w0 = slices.Clone(s.orig)
		for r := 0; r < rows; r++ {
			for j, d := range f.dead {
				if d {
					s.w0[r*cols+j] = 0
				}
			}
		}
	}

	// Working weights, column-major, transposed in tiles of 16 rows
	// (16 sequential read streams), the tiles shared among the cores
	// (plain copies, so the split cannot change the result).
	const tb = 16
	kernels.ParallelFor(procs, procs, func(p, _ int) {
		// 16×16 blocks through a buffer, so that each cache line of Wt
		// is written whole (see the output transposition below).
		var buf [tb * tb]T
		nrt := (rows + tb - 1) / tb
		for rt := p * nrt / procs; rt < (p+1)*nrt/procs; rt++ {
			r0, r1 := rt*tb, min(rt*tb+tb, rows)
			for k0 := 0; k0 < cols; k0 += tb {
				k1 := min(k0+tb, cols)
				perm := s.perm[k0:k1]
				for r := r0; r < r1; r++ {
					src := s.w0[r*cols : (r+1)*cols]
					for kk, c := range perm {
						buf[kk*tb+r-r0] = src[c]
					}
				}
				for kk := range perm {
					copy(s.wt[(k0+kk)*rows+r0:(k0+kk)*rows+r1], buf[kk*tb:kk*tb+r1-r0])
				}
			}
		}
	})
}

// store writes the quantized weights qt (column-major, permuted) into q in
// the original row-major order; with tileExtra (the proxy loss) it also
// sums, per row tile of 16, Σ_c extra_c·Δ₀[r][c]² into it.
func (s *solver[T]) store(f *Factor, qt []T, q []float32, tileExtra []float64, procs int) {
	rows, cols := s.rows, s.cols
	const tb = 16
	nrt := (rows + tb - 1) / tb
	incremental := tileExtra != nil
	kernels.ParallelFor(procs, procs, func(p, _ int) {
		// The tile's rows go through 16×16 blocks in registers-sized
		// buffers: every cache line of Q and W₀ is then touched once per
		// block rather than once per column (rows cols·4 bytes apart
		// share cache sets, so 16 row streams at once keep evicting each
		// other).
		var qb [tb * tb]T
		for rt := p * nrt / procs; rt < (p+1)*nrt/procs; rt++ {
			r0, r1 := rt*tb, min(rt*tb+tb, rows)
			nr := r1 - r0
			var ex float64
			for k0 := 0; k0 < cols; k0 += tb {
				k1 := min(k0+tb, cols)
				perm := s.perm[k0:k1]
				for kk := range perm {
					copy(qb[kk*tb:kk*tb+nr], qt[(k0+kk)*rows+r0:(k0+kk)*rows+r1])
				}
				// With the proxy loss, also each column's Σ_r Δ₀[r][c]²
				// over the tile's rows in order (the sums of a
				// column-at-a-time loop), the columns' sums side by side
				// so that their additions overlap.
				var sq [tb]float64
				for r := 0; r < nr; r++ {
					row := (r0 + r) * cols
					if !s.opt.ActOrder {
						// Columns in their own order: contiguous runs.
						qrow := q[row+k0 : row+k1]
						if !incremental {
							for kk := range qrow {
								qrow[kk] = float32(qb[kk*tb+r])
							}
							continue
						}
						wrow := s.w0[row+k0 : row+k1]
						wrow = wrow[:len(qrow)]
						for kk := range qrow {
							v := qb[kk*tb+r]
							qrow[kk] = float32(v)
							d := float64(wrow[kk]) - float64(v)
							sq[kk] += d * d
						}
						continue
					}
					qrow, wrow := q[row:row+cols], s.w0[row:row+cols]
					for kk, c := range perm {
						v := qb[kk*tb+r]
						qrow[c] = float32(v)
						if incremental {
							d := float64(wrow[c]) - float64(v)
							sq[kk] += d * d
						}
					}
				}
				if !incremental {
					continue
				}
				for kk, c := range perm {
					ex += f.extra[c] * sq[kk]
				}
			}
			if incremental {
				tileExtra[rt] = ex
			}
		}
	})
}

// asyncLoss is a proxy loss computed in its own goroutine.
type asyncLoss struct {
	done chan struct{}
	v    float64
}

// wait returns the loss once computed; a nil asyncLoss gives 0.
func (a *asyncLoss) wait() float64 {
	if a == nil {
		return 0
	}
	<-a.done
	return a.v
}

// startRTNLoss starts computing rtnProxyLoss in a new goroutine. The
// arithmetic is the same as in the calling goroutine, so the value does
// not depend on the scheduling.
func startRTNLoss(g Grid, w []float32, rows, cols int, h []float64, f64 bool) *asyncLoss {
	a := &asyncLoss{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.v = rtnProxyLoss(g, w, rows, cols, h, f64)
	}()
	return a
}

// rtnProxyLoss is ½·tr(Δ·H·Δᵀ) for Δ = W − RTN(W), RTN rounding in the
// solver's arithmetic (float64 with f64).
func rtnProxyLoss(g Grid, w []float32, rows, cols int, h []float64, f64 bool) float64 {
	if f64 {
		w64 := getBuf[float64](len(w))
		defer putBuf(w64)
		for i, v := range w {
			w64[i] = float64(v)
		}
		q := rtnTo(getBuf[float64](len(w)), g, w64, rows, cols)
		defer putBuf(q)
		return proxyLoss(w, q, rows, cols, h)
	}
	q := rtnTo(getBuf[float32](len(w)), g, w, rows, cols)
	defer putBuf(q)
	return proxyLoss(w, q, rows, cols, h)
}
