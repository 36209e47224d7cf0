package emulator

import "fmt"

// TileDim is the side of a matmul tile: 32×32 values, four 16×16 faces.
const TileDim = 32

// TileSize is the number of values in a tile.
const TileSize = TileDim * TileDim

// Config selects the numerics of a Matrix Unit matmul.
type Config struct {
	Fidelity Fidelity  // math fidelity (phases run per tile)
	Dst      DstFormat // destination register format
	Arch     Arch      // Blackhole (default) or Wormhole
}

// String describes the configuration, e.g. "HiFi2/fp32/blackhole".
func (c Config) String() string {
	return c.Fidelity.String() + "/" + c.Dst.String() + "/" + c.Arch.String()
}

// Validate reports an invalid field.
func (c Config) Validate() error {
	if c.Fidelity < LoFi || c.Fidelity > HiFi4 {
		return fmt.Errorf("emulator: invalid fidelity %d", int(c.Fidelity))
	}
	if c.Dst != DstFP32 && c.Dst != DstBF16 {
		return fmt.Errorf("emulator: invalid destination format %d", int(c.Dst))
	}
	if c.Arch != Blackhole && c.Arch != Wormhole {
		return fmt.Errorf("emulator: invalid architecture %d", int(c.Arch))
	}
	return nil
}

// StepTrace describes one Matrix Unit step applied to one Dst element.
type StepTrace struct {
	Phase  int    // fidelity phase, 0..3
	KBlock int    // 16-deep block of the tile's inner dimension: 0 (k 0..15) or 1 (k 16..31)
	In     uint32 // Dst before the step (FP32 bits; BF16<<16 with DstBF16)
	Out    uint32 // Dst after the step
}

// TileMatmul accumulates one 32×32×32 tile product into dst, as the Matrix
// Unit does for one pair of tiles with tt-llk's matmul: dst[m][n] is updated,
// for each fidelity phase in order and then for k-block 0 (k 0..15) and 1
// (k 16..31), by MVMULStep with SrcB = in0 row m (activations, BF16) and
// SrcA = in1 column n (weights, already in source-register form).
//
// All matrices are row-major: in0[m*32+k], in1[k*32+n], dst[m*32+n]. dst holds
// FP32 bit patterns (BF16<<16 with DstBF16) and starts at zero for a fresh
// accumulation; calling TileMatmul again for the next K-tile continues the
// accumulation, each K-tile running its full phase loop. trace, when not nil,
// is called for every step of every element, in order.
func TileMatmul(dst *[TileSize]uint32, in0 *[TileSize]uint16, in1 *[TileSize]Src, cfg Config, trace func(m, n int, s StepTrace)) {
	if err := cfg.Validate(); err != nil {
		panic(err.Error())
	}
	phases := cfg.Fidelity.Phases()
	// SrcB rows, converted once rather than once per output column.
	var rows [TileDim][2][Lanes]Src
	for m := range rows {
		for k := 0; k < TileDim; k++ {
			rows[m][k/Lanes][k%Lanes] = SrcFromBF16(in0[m*TileDim+k])
		}
	}
	var a [2][Lanes]Src
	for n := 0; n < TileDim; n++ {
		for k := 0; k < TileDim; k++ {
			a[k/Lanes][k%Lanes] = in1[k*TileDim+n]
		}
		for m := 0; m < TileDim; m++ {
			b := &rows[m]
			d := dst[m*TileDim+n]
			for ph := 0; ph < phases; ph++ {
				for kb := 0; kb < 2; kb++ {
					out := MVMULStep(d, &a[kb], &b[kb], ph, cfg.Dst, cfg.Arch)
					if trace != nil {
						trace(m, n, StepTrace{Phase: ph, KBlock: kb, In: d, Out: out})
					}
					d = out
				}
			}
			dst[m*TileDim+n] = d
		}
	}
}
