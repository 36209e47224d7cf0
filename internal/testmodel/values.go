package testmodel

import (
	"encoding/binary"
	"fmt"
	"github.com/ttquant/ttquant/internal/rng"
	"math"
	"strconv"
)

// SeedPrefix versions the value recipe. Changing anything in Values must
// change it (and the golden hashes of the tests).
const SeedPrefix = "qwen36-tiny/v1:"

// fnv1a64 is the 64-bit FNV-1a hash of s.
func fnv1a64(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001b3
	}
	return h
}

// SplitMix64 is the generator every stream draws from.
type SplitMix64 = rng.SplitMix64

func newStream(kind, name string) *SplitMix64 {
	return &SplitMix64{State: fnv1a64(SeedPrefix + kind + name)}
}

// pow2 returns 2^k as a float32 for small |k| (exact).
func pow2(k int) float32 { return float32(math.Ldexp(1, k)) }

// fanInShift returns k = round(log2(sqrt(n))) computed with integers:
// k is the unique integer with 2^(2k-1) <= n < 2^(2k+1).
func fanInShift(n int64) int {
	k := 0
	for int64(1)<<(2*k+1) <= n {
		k++
	}
	return k
}

// MatrixScale returns c = 2^-round(log2(sqrt(fanIn))), the base scale of a
// matrix whose last dimension is fanIn.
func MatrixScale(fanIn int64) float32 { return pow2(-fanInShift(fanIn)) }

// rowShift maps 3 random bits to a per-row power-of-two exponent.
var rowShift = [8]int{-2, -1, -1, 0, 0, 0, 1, 2}

// OutlierFactor multiplies the values chosen as outliers.
const OutlierFactor = 16

// Edge cases injected into the tiny model (see Values).
const (
	ZeroGateLayer, ZeroGateExpert     = 0, 3 // layer 0, expert 3: gate rows all zero
	OutlierDownLayer, OutlierDownExpt = 1, 5 // layer 1, expert 5: down_proj[0][0] = 64·c
	SubnormalSharedUpLayer            = 2    // layer 2 shared_expert.up_proj[0][0] = BF16 0x0001
	NegZeroMTPFCRow, NegZeroMTPFCCol  = 0, 1 // mtp.fc.weight[0][1] = -0.0
)

// float32s generates the float32 values of a BF16/F32 tensor before any
// rounding or bit-level edit.
func float32s(cfg Config, s TensorSpec) []float32 {
	n := s.NumElements()
	v := make([]float32, n)
	r := newStream("", s.Name)
	switch s.Init {
	case InitMatrix, InitEmbedding:
		last := s.Shape[len(s.Shape)-1]
		var c float32
		if s.Init == InitMatrix {
			c = MatrixScale(last)
		} else {
			c = 1.0 / 32
		}
		rows := r2(n, last)
		rs := newStream("rows/", s.Name)
		for row := int64(0); row < rows; row++ {
			k := rowShift[rs.Next()>>61]
			rc := float32(c * pow2(k))
			base := row * last
			for j := int64(0); j < last; j++ {
				v[base+j] = float32(r.Signed() * rc)
			}
		}
		os := newStream("outliers/", s.Name)
		count := 1 + n/65536
		for i := int64(0); i < count; i++ {
			p := int64(os.Next() % uint64(n))
			v[p] = float32(v[p] * OutlierFactor)
		}
	case InitNorm:
		for i := range v {
			v[i] = float32(r.Signed() * (1.0 / 16))
		}
	case InitGatedNorm:
		for i := range v {
			v[i] = float32(1 + float32(r.Signed()*(1.0/16)))
		}
	case InitDTBias:
		for i := range v {
			v[i] = float32(1 + float32(r.Signed()*(1.0/8)))
		}
	case InitALog:
		for i := range v {
			v[i] = float32(2.75 * r.Unit())
		}
	case InitBias:
		for i := range v {
			v[i] = float32(r.Signed() * (1.0 / 16))
		}
	case InitScaleInv:
		for i := range v {
			v[i] = pow2(-8 - int(r.Next()>>62))
		}
	default:
		panic("testmodel: float32s called for init " + strconv.Itoa(int(s.Init)))
	}
	// Edge cases on fused names (the per-expert layout slices these).
	layerName := func(i int) string { return cfg.Prefix() + "layers." + strconv.Itoa(i) + "." }
	I, H := int64(cfg.MoEIntermediate), int64(cfg.Hidden)
	switch {
	case cfg.Layers > ZeroGateLayer && cfg.Experts > ZeroGateExpert &&
		s.Name == layerName(ZeroGateLayer)+"mlp.experts.gate_up_proj":
		off := int64(ZeroGateExpert) * 2 * I * H
		clear(v[off : off+I*H])
	case cfg.Layers > OutlierDownLayer && cfg.Experts > OutlierDownExpt &&
		s.Name == layerName(OutlierDownLayer)+"mlp.experts.down_proj":
		v[int64(OutlierDownExpt)*H*I] = float32(64 * MatrixScale(I))
	}
	return v
}

// r2 is the number of rows of a tensor with n elements and last dim last.
func r2(n, last int64) int64 {
	if last == 0 {
		return 0
	}
	return n / last
}

// BF16 returns the bfloat16 bits of f rounded to nearest, ties to even.
// f must not be NaN (the generator never produces one).
func BF16(f float32) uint16 {
	b := math.Float32bits(f)
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// tensorBytes returns the little-endian data of a tensor whose values are
// generated directly (not sliced from a fused tensor).
func tensorBytes(cfg Config, s TensorSpec) []byte {
	n := s.NumElements()
	switch s.DType {
	case "F8_E4M3":
		out := make([]byte, n)
		r := newStream("", s.Name)
		for i := range out {
			b := byte(r.Next() >> 56)
			if b&0x7f == 0x7f { // the two NaN codes of e4m3fn
				b--
			}
			out[i] = b
		}
		return out
	case "F32":
		v := float32s(cfg, s)
		out := make([]byte, 4*n)
		for i, f := range v {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		}
		return out
	case "BF16":
		v := float32s(cfg, s)
		out := make([]byte, 2*n)
		for i, f := range v {
			binary.LittleEndian.PutUint16(out[2*i:], BF16(f))
		}
		switch s.Name {
		case cfg.Prefix() + "layers." + strconv.Itoa(SubnormalSharedUpLayer) + ".mlp.shared_expert.up_proj.weight":
			if cfg.Layers > SubnormalSharedUpLayer {
				binary.LittleEndian.PutUint16(out[0:], 0x0001)
			}
		case MTPPrefix + "fc.weight":
			i := NegZeroMTPFCRow*s.Shape[1] + NegZeroMTPFCCol
			binary.LittleEndian.PutUint16(out[2*i:], 0x8000)
		}
		return out
	}
	panic("testmodel: no generator for dtype " + s.DType)
}

// generator produces tensor bytes, caching the fused tensors of the
// current MoE block so that the per-expert layout slices them instead of
// regenerating them per expert.
type generator struct {
	cfg   Config
	fused map[string][]byte
}

func (g *generator) bytes(s TensorSpec) []byte {
	if s.From == "" {
		return tensorBytes(g.cfg, s)
	}
	fused, ok := g.fused[s.From]
	if !ok {
		if len(g.fused) >= 2 || g.fused == nil {
			g.fused = map[string][]byte{} // a new block: drop the previous one
		}
		E, I, H := g.cfg.Experts, g.cfg.MoEIntermediate, g.cfg.Hidden
		var shape []int64
		if s.Shape[0] == int64(H) { // down_proj [E, H, I]
			shape = sh(E, H, I)
		} else {
			shape = sh(E, 2*I, H)
		}
		fused = tensorBytes(g.cfg, TensorSpec{Name: s.From, DType: s.DType, Shape: shape, Init: InitMatrix, Expert: -1})
		g.fused[s.From] = fused
	}
	rows, cols := s.Shape[0], s.Shape[1]
	perExpertRows := int64(len(fused)) / 2 / cols / int64(g.cfg.Experts)
	off := (int64(s.Expert)*perExpertRows + s.FromRow) * cols * 2
	out := make([]byte, rows*cols*2)
	copy(out, fused[off:off+rows*cols*2])
	return out
}

// Values returns the values of tensor name of the checkpoint generated
// from cfg, exactly as stored (BF16 and F32 decoded to float32; F8 codes
// are refused). It regenerates the tensor; it does not read files.
//
// The recipe, for a tensor named n:
//   - a SplitMix64 stream seeded with FNV-1a-64(SeedPrefix + n) gives, in
//     row-major order, u = (x>>40)·2^-24 and s = 2u − 1;
//   - matrices (rank ≥ 2, last dimension = fan-in): s·c·2^k, with
//     c = MatrixScale(fan-in) and a per-row exponent k in {-2..2} drawn from
//     the stream seeded with SeedPrefix+"rows/"+n; then 1 + numel/65536
//     positions drawn from SeedPrefix+"outliers/"+n are multiplied by
//     OutlierFactor. Embedding and lm_head use c = 1/32;
//   - zero-centred norms s/16; linear_attn.norm 1 + s/16; dt_bias 1 + s/8;
//     A_log 2.75·u; biases s/16;
//   - BF16 by round-to-nearest-even;
//   - edge cases: layer 0 expert 3 gate rows all zero; layer 1 expert 5
//     down_proj[0][0] = 64·c; layer 2 shared_expert.up_proj[0][0] = BF16
//     0x0001 (the smallest subnormal); mtp.fc.weight[0][1] = -0.0.
//
// Per-expert tensors carry the rows of the fused tensor they come from.
func Values(cfg Config, layout ExpertLayout, name string) ([]float32, error) {
	specs, err := Specs(cfg, layout, false)
	if err != nil {
		return nil, err
	}
	for _, s := range specs {
		if s.Name != name {
			continue
		}
		g := &generator{cfg: cfg}
		b := g.bytes(s)
		n := s.NumElements()
		out := make([]float32, n)
		switch s.DType {
		case "BF16":
			for i := range out {
				out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
			}
		case "F32":
			for i := range out {
				out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
		default:
			return nil, fmt.Errorf("testmodel: tensor %s has dtype %s, not a float type", name, s.DType)
		}
		return out, nil
	}
	return nil, fmt.Errorf("testmodel: config %q has no tensor %q", cfg.Name, name)
}
