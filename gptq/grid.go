package gptq

import (
	"fmt"

	"github.com/ttquant/ttquant/bfp"
)

// Grid is a quantization grid: the set of values a weight may take, and the
// rule that decides, column by column, where that set lies. Quantize and RTN
// accept the grids of this package: IntGrid (the uniform integer grid of the
// reference GPTQ implementation) and BFPGrid (Tenstorrent block floating
// point). The solver sees a grid only as "quantize this column given its
// current values", so the error-feedback loop does not depend on the format.
//
// The interface is sealed: its unexported method keeps implementations in
// this package, where each grid has a float32 and a float64 variant.
type Grid interface {
	// String describes the grid, e.g. "int4 sym g128" or "BFP4_b input-axis".
	String() string
	// Validate reports whether the grid's parameters are usable.
	Validate() error
	isGrid()
}

// BFPGrid quantizes onto a Tenstorrent block-floating-point format: groups of
// bfp.GroupSize values share one exponent byte, and every value is a signed
// magnitude of Format.MantissaBits() bits scaled by that exponent.
//
// Every output of Quantize or RTN on a BFPGrid is exactly representable: for
// input-axis grids bfp.Pack of Q ([out, in]) followed by bfp.Unpack returns Q
// bit for bit, and for output-axis grids the same holds for the transpose of
// Q ([in, out]).
//
// Exponents. With the output axis a group lies within one column, so the
// solver fixes each group's exponent when it reaches that column, from the
// column's current (error-updated) values. With the input axis a group spans
// 16 columns; its exponent (one per row) is fixed when the solver reaches the
// first of those columns in its processing order, from the current values of
// all 16 columns, and later columns of the group are rounded on that fixed
// exponent (saturating if the error feedback pushed them above its range)
// while their error is still compensated by the columns after them, inside
// the group and beyond it. With Options.StaticGroups every exponent is
// instead taken from the original weights before the loop starts.
type BFPGrid struct {
	Format bfp.Format
	Axis   bfp.Axis
}

// NewBFPGrid returns a BFP grid of format f whose shared-exponent groups run
// along axis. Invalid arguments are reported by Validate (and by Quantize and
// RTN).
func NewBFPGrid(f bfp.Format, axis bfp.Axis) Grid { return &BFPGrid{Format: f, Axis: axis} }

// String returns e.g. "BFP4_b input-axis".
func (g *BFPGrid) String() string { return g.Format.String() + " " + g.Axis.String() + "-axis" }

// Validate reports an invalid format or axis.
func (g *BFPGrid) Validate() error {
	if err := g.Format.Valid(); err != nil {
		return fmt.Errorf("gptq: BFP grid: %w", err)
	}
	if err := g.Axis.Valid(); err != nil {
		return fmt.Errorf("gptq: BFP grid: %w", err)
	}
	return nil
}

func (g *BFPGrid) isGrid() {}

// IntConfig configures the uniform integer grid of the reference GPTQ
// implementation: per output row (and per group of input columns, if
// GroupSize > 0) a scale s and zero point z, with values s·(c − z) for the
// integer codes c in 0 … 2^Bits−1.
type IntConfig struct {
	// Bits per code, 2 to 8.
	Bits int
	// Sym selects the symmetric grid: z = 2^(Bits−1) and s = 2·absmax/maxq
	// (a row without negative values keeps its minimum at 0, as in the
	// reference). Otherwise the grid spans [min(x,0), max(x,0)].
	Sym bool
	// GroupSize is the number of consecutive input columns sharing one
	// scale and zero point; 0 or negative means one grid per whole row.
	GroupSize int
	// MSE enables the reference's shrinking grid search, which picks the
	// range factor p = 1 − i/MSEGrid (i < MaxShrink·MSEGrid) minimising
	// Σ |q − x|^Norm.
	MSE bool
	// Norm is the error exponent of the MSE search; 0 means 2.4.
	Norm float64
	// MSEGrid is the number of shrink steps per unit; 0 means 100.
	MSEGrid int
	// MaxShrink is the largest shrink fraction searched; 0 means 0.8.
	MaxShrink float64
}

// IntGrid is the reference's uniform integer grid (see IntConfig). Grids for
// groups are computed as the reference does: without grouping, from the whole
// row of the original weights (before dead columns are zeroed); with groups,
// when the solver reaches a group's first column, from the weights as they
// stood at the start of the current lazy-update block (the reference's
// behaviour, kept so that results match it); with Options.StaticGroups, from
// the original weights (dead columns zeroed) in original column order.
type IntGrid struct {
	cfg IntConfig
}

// NewIntGrid returns the integer grid described by cfg, with the defaults of
// IntConfig filled in. Invalid settings are reported by Validate (and by
// Quantize and RTN).
func NewIntGrid(cfg IntConfig) Grid {
	if cfg.Norm == 0 {
		cfg.Norm = 2.4
	}
	if cfg.MSEGrid == 0 {
		cfg.MSEGrid = 100
	}
	if cfg.MaxShrink == 0 {
		cfg.MaxShrink = 0.8
	}
	if cfg.GroupSize < 0 {
		cfg.GroupSize = 0
	}
	return &IntGrid{cfg: cfg}
}

// Config returns the grid's configuration with defaults filled in.
func (g *IntGrid) Config() IntConfig { return g.cfg }

// String returns e.g. "int4 sym g128 mse" or "int4 asym per-channel".
func (g *IntGrid) String() string {
	s := fmt.Sprintf("int%d", g.cfg.Bits)
	if g.cfg.Sym {
		s += " sym"
	} else {
		s += " asym"
	}
	if g.cfg.GroupSize > 0 {
		s += fmt.Sprintf(" g%d", g.cfg.GroupSize)
	} else {
		s += " per-channel"
	}
	if g.cfg.MSE {
		s += " mse"
	}
	return s
}

// Validate reports settings outside the supported range.
func (g *IntGrid) Validate() error {
	c := g.cfg
	if c.Bits < 2 || c.Bits > 8 {
		return fmt.Errorf("gptq: integer grid: bits %d out of range 2..8", c.Bits)
	}
	if c.MSE {
		if !(c.Norm > 0) || c.Norm > 64 {
			return fmt.Errorf("gptq: integer grid: MSE norm %g out of range (0, 64]", c.Norm)
		}
		if c.MSEGrid < 1 || c.MSEGrid > 1<<20 {
			return fmt.Errorf("gptq: integer grid: MSE grid %d out of range 1..%d", c.MSEGrid, 1<<20)
		}
		if !(c.MaxShrink > 0) || c.MaxShrink > 1 {
			return fmt.Errorf("gptq: integer grid: max shrink %g out of range (0, 1]", c.MaxShrink)
		}
	}
	return nil
}

func (g *IntGrid) isGrid() {}
