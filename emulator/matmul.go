package emulator

import (
	"context"
	"fmt"
	"runtime"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/par"
)

// DecodeBFP returns the BF16 bit patterns the device unpacker writes into a
// source register for every element of a packed BFP matrix (the tile layout
// of package bfp: tiles row-major over the padded matrix, each tile an
// exponent section then the codes in group order). The result is the
// rows×cols logical matrix, row-major; tile padding is dropped.
//
// Unlike bfp.Unpack (the host decoder) this applies the device's quirks (see
// UnpackBFP8): exponents wrap modulo 256 and the sign-only code becomes
// 0xFF80. Only BFP8_b and BFP4_b are modelled.
func DecodeBFP(f bfp.Format, t bfp.Tile, packed []byte, rows, cols int) ([]uint16, error) {
	if f != bfp.BFP8 && f != bfp.BFP4 {
		return nil, fmt.Errorf("emulator: the device unpacker is modelled for BFP8_b and BFP4_b, not %v", f)
	}
	size, err := bfp.PackedSize(f, t, rows, cols)
	if err != nil {
		return nil, fmt.Errorf("emulator: %w", err)
	}
	if len(packed) != size {
		return nil, fmt.Errorf("emulator: %d packed bytes for a %d×%d %v matrix in %v tiles, want %d", len(packed), rows, cols, f, t, size)
	}
	out := make([]uint16, rows*cols)
	tr, tc := bfp.TileGrid(t, rows, cols)
	tb := bfp.TileBytes(f, t)
	eb := t.ExponentBytes()
	groups := t.Groups()
	for ti := 0; ti < tr; ti++ {
		for tj := 0; tj < tc; tj++ {
			tile := packed[(ti*tc+tj)*tb : (ti*tc+tj+1)*tb]
			codes := tile[eb:]
			for g := 0; g < groups; g++ {
				exp := tile[g]
				gr, gc := t.GroupLocation(g)
				r := ti*t.H + gr
				if r >= rows {
					continue
				}
				for i := 0; i < bfp.GroupSize; i++ {
					c := tj*t.W + gc + i
					if c >= cols {
						break
					}
					idx := g*bfp.GroupSize + i
					var h uint16
					if f == bfp.BFP8 {
						h = UnpackBFP8(codes[idx], exp)
					} else {
						h = UnpackBFP4(codes[idx/2]>>(4*(idx%2))&0xf, exp)
					}
					out[r*cols+c] = h
				}
			}
		}
	}
	return out, nil
}

// MatMul computes y = x·Wᵀ as the Matrix Unit does: x is a tokens×in matrix
// of BF16 activations (bit patterns, row-major; SrcB) and w an out×in matrix
// of weights given as the BF16 patterns the unpacker places in SrcA (from
// DecodeBFP for BFP weights, or BF16 weights as stored), row-major in the
// Hugging Face [out, in] convention. The result is the tokens×out matrix of
// Dst values (FP32 bit patterns, or BF16<<16 with DstBF16).
//
// The inner dimension is padded with zeros to whole 32-wide tiles (as the
// device's padded tiles are) and accumulated in a single Dst accumulation:
// K-tile after K-tile, each running its full fidelity-phase loop over its two
// 16-deep blocks. Programs that move partial sums out of Dst between K blocks
// (packer L1 accumulation, reload) are not modelled. The work is spread over
// GOMAXPROCS goroutines; the result does not depend on it.
func MatMul(ctx context.Context, x []uint16, tokens, in int, w []uint16, out int, cfg Config) ([]uint32, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if tokens < 0 || in <= 0 || out < 0 {
		return nil, fmt.Errorf("emulator: invalid matmul shape: x %d×%d, w %d×%d", tokens, in, out, in)
	}
	if len(x) != tokens*in {
		return nil, fmt.Errorf("emulator: activations have %d values, want %d×%d", len(x), tokens, in)
	}
	if len(w) != out*in {
		return nil, fmt.Errorf("emulator: weights have %d values, want %d×%d", len(w), out, in)
	}
	kp := (in + TileDim - 1) / TileDim * TileDim
	prep := func(bits []uint16, rows int, f func(Src) uint32) []uint32 {
		s := make([]uint32, rows*kp)
		for r := 0; r < rows; r++ {
			for k := 0; k < in; k++ {
				s[r*kp+k] = f(SrcFromBF16(bits[r*in+k]))
			}
		}
		return s
	}
	xs, ws := prep(x, tokens, prepB), prep(w, out, prepA)
	y := make([]uint32, tokens*out)
	phases := cfg.Fidelity.Phases()
	workers := min(runtime.GOMAXPROCS(0), max(out, 1))
	err := par.For(ctx, out, workers, func(n int) error {
		a := ws[n*kp : (n+1)*kp]
		for m := 0; m < tokens; m++ {
			b := xs[m*kp : (m+1)*kp]
			y[m*out+n] = dotSteps(a, b, phases, cfg.Dst, cfg.Arch)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return y, nil
}

// dotSteps accumulates one output element from +0 over a padded inner
// dimension, in the device's order.
func dotSteps(a, b []uint32, phases int, dfmt DstFormat, arch Arch) uint32 {
	var d uint32
	for kt := 0; kt < len(a); kt += TileDim {
		for ph := 0; ph < phases; ph++ {
			for kb := kt; kb < kt+TileDim; kb += Lanes {
				d = preparedStep(d, a[kb:kb+Lanes], b[kb:kb+Lanes], ph, dfmt, arch)
			}
		}
	}
	return d
}

// MatMulStored computes y = x·Wᵀ for a stored 2-D weight tensor W [out, in]
// (BFP8_b, BFP4_b or BF16; see EmulatedDecode) and BF16 activations x
// [tokens, in]. It returns the Dst values [tokens, out] (see MatMul) and out.
func MatMulStored(ctx context.Context, st *StoredTensor, x []uint16, tokens int, cfg Config) ([]uint32, int, error) {
	if len(st.Layout.Shape) != 2 {
		return nil, 0, fmt.Errorf("emulator: tensor %q has shape %v; a matmul weight must be [out, in]", st.Name, st.Layout.Shape)
	}
	out, in := int(st.Layout.Shape[0]), int(st.Layout.Shape[1])
	if tokens <= 0 || len(x) != tokens*in {
		return nil, 0, fmt.Errorf("emulator: tensor %q is [%d, %d]: activations must be [tokens, %d], got %d values for %d tokens", st.Name, out, in, in, len(x), tokens)
	}
	w, err := EmulatedDecode(st)
	if err != nil {
		return nil, 0, err
	}
	y, err := MatMul(ctx, x, tokens, in, w, out, cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("tensor %q: %w", st.Name, err)
	}
	return y, out, nil
}
