package harness

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/ttquant/ttquant/emulator"
	"github.com/ttquant/ttquant/internal/model/forward"
)

// KV cache formats of Options.KVCache.
const (
	// KVCacheF32 (or ""): keys and values in float32.
	KVCacheF32 = "f32"
	// KVCacheBFP8 stores the keys and values of full-attention layers as
	// BFP8_b (blocks of 16 along the head dimension, as the packer writes
	// them from an FP32 Dst) and reads them back.
	KVCacheBFP8 = "bfp8"
)

// Numerics is how a candidate computes: a numerics mode and a KV cache
// format, parsed once (ParseNumerics). The zero value is float32 on the
// CPU with a float32 cache.
type Numerics struct {
	// Device, when not nil, runs the candidates' weight products as the
	// Matrix Unit computes them (activations packed to BF16, the weights
	// as the unpacker delivers them, FP32 Dst, outputs packed to BF16).
	Device *emulator.DeviceConfig
	// KVBFP8 rounds the keys and values of full-attention layers through
	// BFP8_b.
	KVBFP8 bool
}

// Errors of ParseNumerics: which of its two arguments is wrong.
var (
	ErrNumerics = errors.New("unknown numerics mode")
	ErrKVCache  = errors.New("unknown KV cache format")
)

// ParseNumerics parses a numerics mode ("" or "cpu", "device" or
// "device:LoFi|HiFi2|HiFi3|HiFi4"; emulator.ParseDeviceNumerics gives the
// default fidelity) and a KV cache format ("", "f32" or "bfp8"). An error
// wraps ErrNumerics or ErrKVCache, saying which is wrong.
func ParseNumerics(numerics, kvCache string) (Numerics, error) {
	var n Numerics
	switch {
	case numerics == "" || numerics == NumericsCPU:
	case strings.EqualFold(numerics, "device") || strings.HasPrefix(strings.ToLower(numerics), "device:"):
		c, err := emulator.ParseDeviceNumerics(numerics)
		if err != nil {
			return n, fmt.Errorf("harness: %w: %w", ErrNumerics, err)
		}
		c.Input, c.Output = emulator.ActBF16, emulator.OutBF16
		n.Device = &c
	default:
		return n, fmt.Errorf("harness: %w %q: want cpu, device or device:LoFi|HiFi2|HiFi3|HiFi4", ErrNumerics, numerics)
	}
	switch kvCache {
	case "", KVCacheF32:
	case KVCacheBFP8:
		n.KVBFP8 = true
	default:
		return n, fmt.Errorf("harness: %w %q: want f32 or bfp8", ErrKVCache, kvCache)
	}
	return n, nil
}

// validate refuses a device configuration the emulator cannot run (a
// value built by hand rather than by ParseNumerics).
func (n Numerics) validate() error {
	if n.Device != nil {
		if err := n.Device.Validate(); err != nil {
			return fmt.Errorf("harness: %w: %w", ErrNumerics, err)
		}
	}
	return nil
}

// String describes the numerics as results record them: "cpu-fp32", or
// e.g. "device:HiFi2 (fp32 dst, blackhole; bf16 activations and outputs)",
// with ", kv bfp8" for a BFP8 KV cache.
func (n Numerics) String() string {
	s := "cpu-fp32"
	if d := n.Device; d != nil {
		s = fmt.Sprintf("device:%v (%v dst, %v; %v activations and outputs)", d.Fidelity, d.Dst, d.Arch, d.Input)
	}
	if n.KVBFP8 {
		s += ", kv bfp8"
	}
	return s
}

// apply sets m's products and KV rounding for a candidate whose stored
// tensors come from ns (nil: none, the source's BF16 weights only). With
// keep, prepared device weights are kept for the model's lifetime.
func (n Numerics) apply(m *forward.Model, ns *Native, workers int, keep bool) error {
	if n.Device != nil {
		cfg := *n.Device
		cfg.Workers = workers
		d, err := NewDeviceLinears(cfg, ns, keep)
		if err != nil {
			return err
		}
		m.Linears = d
	}
	if n.KVBFP8 {
		m.KV = bfp8KV{}
	}
	return nil
}

// DeviceLinears is a forward.Linears that multiplies as the Tensix Matrix
// Unit does, with emulator's fast path (bit-identical to its tile model):
// activations packed to the configured input format, each weight matrix as
// the unpacker places it in SrcA (a tensor the checkpoint stores, BFP8_b,
// BFP4_b or BF16, through emulator.EmulatedDecode; one it takes from the
// source model as BF16), the fidelity phases, FP32 accumulation over the
// whole inner dimension in the device's order, and outputs packed as
// configured.
type DeviceLinears struct {
	cfg    emulator.DeviceConfig
	native *Native
	keep   bool

	mu    sync.Mutex
	cache map[string]*deviceEntry

	dmu        sync.Mutex // the last decoded stored tensor
	lastStored string
	last       []uint16
}

type deviceEntry struct {
	once sync.Once
	lin  *deviceLinear
	err  error
}

// NewDeviceLinears returns device products for a model whose stored
// tensors come from ns (nil: every weight from the source as BF16). With
// keep, every prepared matrix is kept for the model's lifetime (for a
// resident model); without, only the LM head is.
func NewDeviceLinears(cfg emulator.DeviceConfig, ns *Native, keep bool) (*DeviceLinears, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &DeviceLinears{cfg: cfg, native: ns, keep: keep, cache: map[string]*deviceEntry{}}, nil
}

// Linear implements forward.Linears.
func (d *DeviceLinears) Linear(w *forward.LinearWeight) (forward.Linear, error) {
	// The LM head is kept whatever keep says: the forward pass keeps its
	// float32 values too, and asks for it for every chunk of logits.
	if !d.keep && w.Role != forward.RoleLMHead {
		return d.prepare(w)
	}
	key := w.Name()
	d.mu.Lock()
	e := d.cache[key]
	if e == nil {
		e = &deviceEntry{}
		d.cache[key] = e
	}
	d.mu.Unlock()
	e.once.Do(func() { e.lin, e.err = d.prepare(w) })
	if e.err != nil {
		return nil, e.err
	}
	if o, i := e.lin.w.Shape(); o != w.Out || i != w.In {
		return nil, fmt.Errorf("harness: prepared device weight is [%d, %d], the forward pass asks for [%d, %d]", o, i, w.Out, w.In)
	}
	return e.lin, nil
}

// prepare builds the SrcA operand of w.
func (d *DeviceLinears) prepare(w *forward.LinearWeight) (*deviceLinear, error) {
	bf, err := d.operand(w)
	if err != nil {
		return nil, err
	}
	dw, err := emulator.NewDeviceWeights(bf, w.Out, w.In)
	if err != nil {
		return nil, err
	}
	return &deviceLinear{w: dw, cfg: d.cfg}, nil
}

// operand returns w as the BF16 patterns the unpacker places in SrcA, row
// by row in the forward pass's order.
func (d *DeviceLinears) operand(w *forward.LinearWeight) ([]uint16, error) {
	if w.Out <= 0 || w.In <= 0 || len(w.W) != w.Out*w.In {
		return nil, fmt.Errorf("harness: %d weights for a [%d, %d] matrix", len(w.W), w.Out, w.In)
	}
	bf := make([]uint16, w.Out*w.In)
	row := 0
	for _, rr := range w.Rows {
		if rr.Rows < 0 || row+rr.Rows > w.Out {
			return nil, fmt.Errorf("harness: the row ranges of the matrix cover more than its %d rows", w.Out)
		}
		dst := bf[row*w.In : (row+rr.Rows)*w.In]
		done, err := d.storedRows(dst, rr, w.In)
		if err != nil {
			return nil, err
		}
		if !done {
			// From the source model: BF16 weights, exact; any other value
			// is written to BF16 as a packer would.
			for i, v := range w.W[row*w.In : (row+rr.Rows)*w.In] {
				dst[i] = emulator.PackFP32ToBF16(math.Float32bits(v))
			}
		}
		row += rr.Rows
	}
	if row != w.Out {
		return nil, fmt.Errorf("harness: the row ranges of the matrix cover %d of its %d rows", row, w.Out)
	}
	return bf, nil
}

// storedRows fills dst with rows of a tensor the checkpoint stores, as the
// unpacker delivers them; false when the checkpoint does not store it.
func (d *DeviceLinears) storedRows(dst []uint16, rr forward.RowRange, in int) (bool, error) {
	if d.native == nil {
		return false, nil
	}
	stored, off, shape, ok := d.native.Locate(rr.Tensor)
	if !ok {
		return false, nil
	}
	if len(shape) != 2 || shape[1] != int64(in) || off%int64(in) != 0 || int64(rr.Row0+rr.Rows) > shape[0] || rr.Row0 < 0 {
		return false, fmt.Errorf("harness: rows %d..%d of %s (stored as %s, shape %v): not a [rows, %d] matrix holding them", rr.Row0, rr.Row0+rr.Rows, rr.Tensor, stored, shape, in)
	}
	d.dmu.Lock()
	defer d.dmu.Unlock()
	if d.lastStored != stored {
		st, err := emulator.CheckpointLookup(d.native.c)(stored)
		if err != nil {
			return false, err
		}
		v, err := emulator.EmulatedDecode(st)
		if err != nil {
			return false, err
		}
		d.lastStored, d.last = stored, v
	}
	o := off + int64(rr.Row0)*int64(in)
	if o+int64(len(dst)) > int64(len(d.last)) {
		return false, fmt.Errorf("harness: rows %d..%d of %s lie outside the stored %s", rr.Row0, rr.Row0+rr.Rows, rr.Tensor, stored)
	}
	copy(dst, d.last[o:])
	return true, nil
}

// deviceLinear is one prepared weight matrix.
type deviceLinear struct {
	w   *emulator.DeviceWeights
	cfg emulator.DeviceConfig
}

// MatMulT implements forward.Linear.
func (l *deviceLinear) MatMulT(dst []float32, ldd int, x []float32, rows int) error {
	out, in := l.w.Shape()
	if len(x) != rows*in || ldd < out || len(dst) < (rows-1)*ldd+out {
		return fmt.Errorf("harness: device product of [%d, %d] activations with a [%d, %d] weight into %d values (stride %d)", rows, len(x)/max(rows, 1), out, in, len(dst), ldd)
	}
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("harness: non-finite activation %v (row %d) entering a device product", v, i/in)
		}
	}
	y, err := emulator.DeviceMatMul(context.Background(), x, rows, l.w, l.cfg)
	if err != nil {
		return err
	}
	for r := 0; r < rows; r++ {
		copy(dst[r*ldd:r*ldd+out], y[r*out:(r+1)*out])
	}
	return nil
}

// bfp8KV rounds keys and values through BFP8_b.
type bfp8KV struct{}

// RoundKV implements forward.KVStore.
func (bfp8KV) RoundKV(x []float32, headDim int) error {
	if headDim <= 0 || len(x)%headDim != 0 {
		return fmt.Errorf("harness: %d key or value elements are not whole heads of %d", len(x), headDim)
	}
	if len(x) == 0 {
		return nil
	}
	y, err := emulator.PackRoundTrip(x, len(x)/headDim, headDim, emulator.OutBFP8)
	if err != nil {
		return err
	}
	copy(x, y)
	return nil
}
