package emulator

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ttquant/ttquant/bfp"
)

// The device matmul fast path computes exactly what MatMul (and TileMatmul,
// MVMULStep) compute, restructured for speed:
//
//   - Operands are prepared once into structure-of-arrays form: per datum
//     its exponent field (zeroExp for a datum the Matrix Unit reads as zero)
//     and its two multiplier slices with the datum's sign folded in, so that
//     a lane product is one signed multiplication.
//   - A lane's product exponent, and so its alignment shift within its
//     8-lane group, does not depend on the fidelity phase (a zero slice
//     still reports its exponent), so shifts and group maxima are computed
//     once per 16-deep block and reused by every phase.
//   - Rounding a signed product half up in magnitude is one add and one
//     arithmetic shift: (p + ((1<<d) + (p>>31))>>1) >> d.
//
// TestDeviceMatMulMatchesTileMatmul checks it against TileMatmul on random
// tiles at every fidelity, Dst format and architecture.

// zeroExp is the exponent given to a datum whose exponent field is 0: any
// product with it has a very negative exponent, so it never sets a group's
// maximum and always aligns to zero, as the device's zero lanes do.
const zeroExp = -4096

// srcOperand is an operand matrix prepared for the fast path: rows of kp
// values (the inner dimension padded with zeros to whole tiles).
type srcOperand struct {
	rows, kp int
	e        []int16 // exponent field, zeroExp for zero
	s        [2][]int16
}

func newSrcOperand(rows, kp int) srcOperand {
	n := rows * kp
	o := srcOperand{rows: rows, kp: kp, e: make([]int16, n)}
	o.s[0], o.s[1] = make([]int16, n), make([]int16, n)
	for i := range o.e {
		o.e[i] = zeroExp
	}
	return o
}

// set stores datum s at index i with the slices of SrcA (a) or SrcB.
func (o *srcOperand) set(i int, s Src, a bool) {
	if s.Exp() == 0 {
		o.e[i], o.s[0][i], o.s[1][i] = zeroExp, 0, 0
		return
	}
	var lo, hi uint32
	if a {
		lo, hi = sliceA(s, 0), sliceA(s, 1)
	} else {
		lo, hi = sliceB(s, 0), sliceB(s, 2)
	}
	sl, sh := int16(lo), int16(hi)
	if s.Sign() != 0 {
		sl, sh = -sl, -sh
	}
	o.e[i], o.s[0][i], o.s[1][i] = int16(s.Exp()), sl, sh
}

// DeviceWeights is a weight matrix W [out, in] prepared once for
// DeviceMatMul: the values the unpacker places in SrcA, sliced for the
// Matrix Unit. It holds 6 bytes per weight (the inner dimension padded to
// whole tiles), 12 once the vector kernel has used it. It is safe for
// concurrent use.
type DeviceWeights struct {
	out, in int
	a       srcOperand

	panelOnce sync.Once
	panel     []int16 // column blocks of 8 for the vector kernel
}

// Layouts of the vector kernel (device_amd64.s): per column block of 8 and
// per k, 8 exponents, 8 phase-even and 8 phase-odd slices (int16); per token
// and per k, exponent, phase-even and phase-odd slices and a pad (int32).
const (
	panelCols   = 8
	panelStride = 3 * panelCols
	rowStride   = 4
	scratchLen  = 340
)

// panels returns the weights in the vector kernel's layout, building it on
// first use. Columns past out are zero operands.
func (w *DeviceWeights) panels() []int16 {
	w.panelOnce.Do(func() {
		kp := w.a.kp
		blocks := (w.out + panelCols - 1) / panelCols
		p := make([]int16, blocks*kp*panelStride)
		for nb := 0; nb < blocks; nb++ {
			for j := 0; j < panelCols; j++ {
				n := nb*panelCols + j
				for k := 0; k < kp; k++ {
					o := (nb*kp+k)*panelStride + j
					if n >= w.out {
						p[o] = zeroExp
						continue
					}
					i := n*kp + k
					p[o], p[o+panelCols], p[o+2*panelCols] = w.a.e[i], w.a.s[0][i], w.a.s[1][i]
				}
			}
		}
		w.panel = p
	})
	return w.panel
}

// Shape returns the weight's [out, in] shape.
func (w *DeviceWeights) Shape() (out, in int) { return w.out, w.in }

// NewDeviceWeights prepares a weight matrix given as the BF16 patterns the
// unpacker places in SrcA (from DecodeBFP or EmulatedDecode), row-major
// [out, in].
func NewDeviceWeights(w []uint16, out, in int) (*DeviceWeights, error) {
	if out <= 0 || in <= 0 || len(w) != out*in {
		return nil, fmt.Errorf("emulator: %d weights for a %d×%d matrix", len(w), out, in)
	}
	kp := (in + TileDim - 1) / TileDim * TileDim
	d := &DeviceWeights{out: out, in: in, a: newSrcOperand(out, kp)}
	for n := 0; n < out; n++ {
		for k := 0; k < in; k++ {
			d.a.set(n*kp+k, SrcFromBF16(w[n*in+k]), true)
		}
	}
	return d, nil
}

// NewDeviceWeightsBFP prepares a packed BFP8_b or BFP4_b weight matrix
// [rows=out, cols=in] in the tile layout of package bfp, decoded as the
// device unpacker does (DecodeBFP).
func NewDeviceWeightsBFP(f bfp.Format, t bfp.Tile, packed []byte, rows, cols int) (*DeviceWeights, error) {
	w, err := DecodeBFP(f, t, packed, rows, cols)
	if err != nil {
		return nil, err
	}
	return NewDeviceWeights(w, rows, cols)
}

// ActivationFormat is how float32 activations reach SrcB.
type ActivationFormat int

const (
	// ActBF16 (the default): the activations are in L1 as BF16, written by
	// the packer of the operation that produced them (PackFP32ToBF16:
	// round to nearest, ties away from zero), and unpacked by bit copy.
	ActBF16 ActivationFormat = iota
	// ActTF32: the activations are in L1 as FP32 and unpacked to TF32
	// (SrcFromFP32TF32: the low 13 mantissa bits truncated).
	ActTF32
)

// String returns "bf16" or "tf32".
func (a ActivationFormat) String() string {
	switch a {
	case ActBF16:
		return "bf16"
	case ActTF32:
		return "tf32"
	}
	return fmt.Sprintf("ActivationFormat(%d)", int(a))
}

// OutputFormat is what DeviceMatMul returns for each output element.
type OutputFormat int

const (
	// OutDst (the default): the Dst contents, FP32 (or, with a BF16 Dst,
	// the BF16 value), as float32.
	OutDst OutputFormat = iota
	// OutBF16: Dst packed to a BF16 output by the packer (PackDstBF16).
	OutBF16
	// OutBFP8 and OutBFP4: Dst packed to a BFP8_b or BFP4_b output by the
	// packer's default path (PackDstBFP, blocks of 16 along each output
	// row; padding columns are +0), returned as the values the unpacker
	// reads back (UnpackBFP8, UnpackBFP4).
	OutBFP8
	OutBFP4
)

// String returns "dst", "bf16", "bfp8" or "bfp4".
func (o OutputFormat) String() string {
	switch o {
	case OutDst:
		return "dst"
	case OutBF16:
		return "bf16"
	case OutBFP8:
		return "bfp8"
	case OutBFP4:
		return "bfp4"
	}
	return fmt.Sprintf("OutputFormat(%d)", int(o))
}

// DeviceConfig selects the numerics of DeviceMatMul.
type DeviceConfig struct {
	Config // Matrix Unit: fidelity, Dst format, architecture
	Input  ActivationFormat
	Output OutputFormat
	// Workers is the number of goroutines (default GOMAXPROCS). Results do
	// not depend on it.
	Workers int
}

// Validate reports an invalid field.
func (c DeviceConfig) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	if c.Input != ActBF16 && c.Input != ActTF32 {
		return fmt.Errorf("emulator: invalid activation format %d", int(c.Input))
	}
	if c.Output < OutDst || c.Output > OutBFP4 {
		return fmt.Errorf("emulator: invalid output format %d", int(c.Output))
	}
	return nil
}

// String describes the configuration, e.g. "HiFi2/fp32/blackhole in bf16 out dst".
func (c DeviceConfig) String() string {
	return c.Config.String() + " in " + c.Input.String() + " out " + c.Output.String()
}

// ParseDeviceNumerics parses a device numerics specification "device" or
// "device:FIDELITY" (FIDELITY one of LoFi, HiFi2, HiFi3, HiFi4, any case;
// default HiFi2) into a configuration with an FP32 Dst on Blackhole.
func ParseDeviceNumerics(s string) (DeviceConfig, error) {
	var c DeviceConfig
	c.Fidelity = HiFi2
	name, fid, has := strings.Cut(s, ":")
	if !strings.EqualFold(name, "device") {
		return c, fmt.Errorf("emulator: numerics %q: want device or device:lofi|hifi2|hifi3|hifi4", s)
	}
	if has {
		f, err := ParseFidelity(fid)
		if err != nil {
			return c, fmt.Errorf("emulator: numerics %q: %w", s, err)
		}
		c.Fidelity = f
	}
	return c, nil
}

// PrepareActivations converts float32 activations x [tokens, in] to the
// source-register operand the fast path uses, as cfg.Input says. It is
// exposed so that one set of activations can be multiplied by several
// weights (DeviceMatMulPrepared).
func PrepareActivations(x []float32, tokens, in int, input ActivationFormat) (*DeviceActivations, error) {
	if tokens <= 0 || in <= 0 || len(x) != tokens*in {
		return nil, fmt.Errorf("emulator: %d activations for %d tokens of %d", len(x), tokens, in)
	}
	if input != ActBF16 && input != ActTF32 {
		return nil, fmt.Errorf("emulator: invalid activation format %d", int(input))
	}
	kp := (in + TileDim - 1) / TileDim * TileDim
	a := &DeviceActivations{tokens: tokens, in: in, b: newSrcOperand(tokens, kp)}
	for m := 0; m < tokens; m++ {
		for k := 0; k < in; k++ {
			bits := math.Float32bits(x[m*in+k])
			var s Src
			if input == ActBF16 {
				s = SrcFromBF16(PackFP32ToBF16(bits))
			} else {
				s = SrcFromFP32TF32(bits)
			}
			a.b.set(m*kp+k, s, false)
		}
	}
	return a, nil
}

// PrepareActivationsBF16 prepares BF16 activations (bit patterns) [tokens,
// in], placed in SrcB by bit copy.
func PrepareActivationsBF16(x []uint16, tokens, in int) (*DeviceActivations, error) {
	if tokens <= 0 || in <= 0 || len(x) != tokens*in {
		return nil, fmt.Errorf("emulator: %d activations for %d tokens of %d", len(x), tokens, in)
	}
	kp := (in + TileDim - 1) / TileDim * TileDim
	a := &DeviceActivations{tokens: tokens, in: in, b: newSrcOperand(tokens, kp)}
	for m := 0; m < tokens; m++ {
		for k := 0; k < in; k++ {
			a.b.set(m*kp+k, SrcFromBF16(x[m*in+k]), false)
		}
	}
	return a, nil
}

// DeviceActivations are activations prepared for the fast path (SrcB). They
// are safe for concurrent use.
type DeviceActivations struct {
	tokens, in int
	b          srcOperand

	rowsOnce sync.Once
	rows     []int32 // the vector kernel's layout
}

func (x *DeviceActivations) kernelRows() []int32 {
	x.rowsOnce.Do(func() {
		kp := x.b.kp
		r := make([]int32, x.tokens*kp*rowStride)
		for i := range x.b.e {
			r[i*rowStride], r[i*rowStride+1], r[i*rowStride+2] = int32(x.b.e[i]), int32(x.b.s[0][i]), int32(x.b.s[1][i])
		}
		x.rows = r
	})
	return x.rows
}

// DeviceMatMul computes y = x·Wᵀ for float32 activations x [tokens, in] as
// the Matrix Unit does (see MatMul for the accumulation order and what is
// not modelled), bit for bit, and returns y [tokens, out] as cfg.Output
// says.
func DeviceMatMul(ctx context.Context, x []float32, tokens int, w *DeviceWeights, cfg DeviceConfig) ([]float32, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a, err := PrepareActivations(x, tokens, w.in, cfg.Input)
	if err != nil {
		return nil, err
	}
	return DeviceMatMulPrepared(ctx, a, w, cfg)
}

// DeviceMatMulPrepared is DeviceMatMul on prepared activations (cfg.Input
// is not used).
func DeviceMatMulPrepared(ctx context.Context, x *DeviceActivations, w *DeviceWeights, cfg DeviceConfig) ([]float32, error) {
	dst, err := deviceDst(ctx, x, w, cfg)
	if err != nil {
		return nil, err
	}
	y := make([]float32, len(dst))
	switch cfg.Output {
	case OutBFP8, OutBFP4:
		if err := packBFPOutput(y, dst, x.tokens, w.out, cfg); err != nil {
			return nil, err
		}
		return y, nil
	}
	for i, d := range dst {
		if cfg.Output == OutBF16 {
			if cfg.Dst == DstBF16 {
				d = uint32(PackBF16(uint16(d>>16))) << 16
			} else {
				d = uint32(PackFP32ToBF16(d)) << 16
			}
		}
		y[i] = math.Float32frombits(d)
	}
	return y, nil
}

// packBFPOutput packs the Dst matrix [rows, cols] to BFP8_b or BFP4_b, 16
// values per block along each row (columns padded with +0 to a multiple of
// 16), and writes the values the unpacker reads back into y.
func packBFPOutput(y []float32, dst []uint32, rows, cols int, cfg DeviceConfig) error {
	f := BFP8b
	if cfg.Output == OutBFP4 {
		f = BFP4b
	}
	cp := (cols + 15) / 16 * 16
	padded := dst
	if cp != cols {
		padded = make([]uint32, rows*cp)
		for r := 0; r < rows; r++ {
			copy(padded[r*cp:], dst[r*cols:(r+1)*cols])
		}
	}
	exps, datums, err := PackDstBFP(padded, rows, cp, cfg.Dst, f, false)
	if err != nil {
		return err
	}
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			i := r*cp + c
			var h uint16
			if f == BFP4b {
				h = UnpackBFP4(datums[i], exps[i/16])
			} else {
				h = UnpackBFP8(datums[i], exps[i/16])
			}
			y[r*cols+c] = math.Float32frombits(uint32(h) << 16)
		}
	}
	return nil
}

// PackRoundTrip returns float32 values x [rows, cols], held in an FP32
// Dst, as the packer writes them to a BFP8_b or BFP4_b tensor (OutBFP8,
// OutBFP4: the default path of PackDstBFP, one block per 16 values along a
// row, a partial block padded with +0) and the unpacker reads them back,
// or to BF16 (OutBF16: PackFP32ToBF16). OutDst returns x unchanged.
// Non-finite values are refused.
func PackRoundTrip(x []float32, rows, cols int, out OutputFormat) ([]float32, error) {
	if rows < 0 || cols <= 0 || len(x) != rows*cols {
		return nil, fmt.Errorf("emulator: %d values for a %d×%d matrix", len(x), rows, cols)
	}
	bits := make([]uint32, len(x))
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("emulator: non-finite value %v at element %d", v, i)
		}
		bits[i] = math.Float32bits(v)
	}
	y := make([]float32, len(x))
	switch out {
	case OutDst:
		copy(y, x)
	case OutBF16:
		for i, b := range bits {
			y[i] = math.Float32frombits(uint32(PackFP32ToBF16(b)) << 16)
		}
	case OutBFP8, OutBFP4:
		if err := packBFPOutput(y, bits, rows, cols, DeviceConfig{Output: out}); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("emulator: invalid output format %d", int(out))
	}
	return y, nil
}

// DeviceMatMulDst is DeviceMatMulPrepared returning the raw Dst values (FP32
// bit patterns, or BF16<<16 with a BF16 Dst), as MatMul does.
func DeviceMatMulDst(ctx context.Context, x *DeviceActivations, w *DeviceWeights, cfg Config) ([]uint32, error) {
	return deviceDst(ctx, x, w, DeviceConfig{Config: cfg})
}

func deviceDst(ctx context.Context, x *DeviceActivations, w *DeviceWeights, cfg DeviceConfig) ([]uint32, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if x.in != w.in {
		return nil, fmt.Errorf("emulator: activations have %d inputs, the weight [%d, %d] %d", x.in, w.out, w.in, w.in)
	}
	tokens, out, kp := x.tokens, w.out, w.a.kp
	y := make([]uint32, tokens*out)
	phases := cfg.Fidelity.Phases()
	workers := cfg.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	// Work items: blocks of 8 output columns by up to 64 tokens.
	const tokenBlock = 64
	colBlocks := (out + panelCols - 1) / panelCols
	tokBlocks := (tokens + tokenBlock - 1) / tokenBlock
	items := colBlocks * tokBlocks
	workers = min(workers, items)
	vector := deviceAsm && cfg.Dst == DstFP32 && cfg.Arch == Blackhole
	var panel []int16
	var rows []int32
	if vector {
		panel, rows = w.panels(), x.kernelRows()
	}
	var wg sync.WaitGroup
	var next atomic.Int64
	var stop atomic.Bool
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var scratch []int32
			if vector {
				scratch = make([]int32, scratchLen)
			}
			var d8 [panelCols]uint32
			for !stop.Load() {
				it := int(next.Add(1) - 1)
				if it >= items {
					return
				}
				if it%16 == 0 && ctx.Err() != nil {
					stop.Store(true)
					return
				}
				cb, tb := it%colBlocks, it/colBlocks
				n0, n1 := cb*panelCols, min(cb*panelCols+panelCols, out)
				m0, m1 := tb*tokenBlock, min(tb*tokenBlock+tokenBlock, tokens)
				if vector {
					pa := panel[cb*kp*panelStride : (cb+1)*kp*panelStride]
					for m := m0; m < m1; m++ {
						devKern(kp/TileDim, pa, rows[m*kp*rowStride:(m+1)*kp*rowStride], phases, scratch, &d8)
						copy(y[m*out+n0:m*out+n1], d8[:n1-n0])
					}
					continue
				}
				for n := n0; n < n1; n++ {
					ao := n * kp
					for m := m0; m < m1; m++ {
						bo := m * kp
						y[m*out+n] = deviceDot(&w.a, ao, &x.b, bo, kp, phases, cfg.Dst, cfg.Arch)
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return y, nil
}

// deviceDot accumulates one output element from +0, in the device's order:
// K-tile after K-tile, each running the fidelity phases in order over its
// two 16-deep blocks.
func deviceDot(a *srcOperand, ao int, b *srcOperand, bo int, kp, phases int, dfmt DstFormat, arch Arch) uint32 {
	var dst uint32
	var G [4]int32     // per 8-lane group of the K-tile: maximum exponent sum (no phase adjustment)
	var sh [4][8]int32 // per lane: alignment shift to its group's maximum
	for kt := 0; kt < kp; kt += TileDim {
		ea := (*[TileDim]int16)(a.e[ao+kt:])
		eb := (*[TileDim]int16)(b.e[bo+kt:])
		for g := 0; g < 4; g++ {
			var e [8]int32
			m := int32(math.MinInt32)
			for i := 0; i < 8; i++ {
				e[i] = int32(ea[g*8+i]) + int32(eb[g*8+i])
				m = max(m, e[i])
			}
			G[g] = m
			for i := 0; i < 8; i++ {
				sh[g][i] = min(m-e[i], 30)
			}
		}
		for ph := 0; ph < phases; ph++ {
			adj := phaseExpAdj(ph)
			pa := (*[TileDim]int16)(a.s[ph&1][ao+kt:])
			pb := (*[TileDim]int16)(b.s[ph>>1][bo+kt:])
			for kb := 0; kb < 2; kb++ {
				var gs [2]uint32
				var ge [2]int32
				var gm [2]uint64
				for h := 0; h < 2; h++ {
					g := 2*kb + h
					Gp := G[g] + adj
					if Gp <= 0 {
						continue
					}
					la := (*[8]int16)(pa[g*8:])
					lb := (*[8]int16)(pb[g*8:])
					d := &sh[g]
					var T int32
					for i := 0; i < 8; i++ {
						p := int32(la[i]) * int32(lb[i])
						s := uint32(d[i])
						T += (p + (int32(1)<<s+p>>31)>>1) >> s
					}
					ge[h] = Gp
					if T < 0 {
						gs[h], gm[h] = 1, uint64(-T)<<13
					} else {
						gm[h] = uint64(T) << 13
					}
				}
				dst = combine(dst, gs, ge, gm, dfmt, arch)
			}
		}
	}
	return dst
}
