package manifest

import "github.com/ttquant/ttquant/bfp"

// Stored formats a plan rule may assign (Rule.Format, canonical spelling).
const (
	StoreBFP8 = "BFP8_B" // Tenstorrent BFP8_b tiles
	StoreBFP4 = "BFP4_B" // Tenstorrent BFP4_b tiles
	StoreBFP2 = "BFP2_B" // Tenstorrent BFP2_b tiles
	StoreBF16 = "BF16"   // bfloat16 (a BF16 source is copied; F32/F16 are rounded to nearest even)
	StoreF32  = "F32"    // float32 (exact from BF16/F16/F32)
	StoreAsIs = "AS_IS"  // the source bytes and dtype, unchanged
)

// Block axes of a BFP rule (Rule.Axis): the direction of a weight [out, in]
// along which the 16-value exponent groups run.
const (
	AxisInput  = "input"  // along the input features (the last dimension)
	AxisOutput = "output" // along the output features (the stored matrix is transposed)
)

// DefaultTile is the tile shape of a BFP rule that names none.
const DefaultTile = "32x32"

// IsBFPFormat reports whether a canonical stored format is a BFP format.
func IsBFPFormat(format string) bool {
	return format == StoreBFP8 || format == StoreBFP4 || format == StoreBFP2
}

// IsLosslessFormat reports whether a canonical stored format keeps every
// value of a source of dtype srcDType exactly.
func IsLosslessFormat(format, srcDType string) bool {
	switch format {
	case StoreAsIs, StoreF32:
		return true
	case StoreBF16:
		return srcDType == "BF16"
	}
	return false
}

// BFPFormat returns the bfp format of a canonical BFP stored format.
func BFPFormat(format string) (bfp.Format, bool) {
	switch format {
	case StoreBFP8:
		return bfp.BFP8, true
	case StoreBFP4:
		return bfp.BFP4, true
	case StoreBFP2:
		return bfp.BFP2, true
	}
	return 0, false
}

// WithTile completes a format lookup with the parsed tile shape; ok is false
// when either the format or the tile is not a BFP one.
func WithTile(f bfp.Format, ok bool, tile string) (bfp.Format, bfp.Tile, bool) {
	if !ok {
		return 0, bfp.Tile{}, false
	}
	t, err := bfp.ParseTile(tile)
	if err != nil {
		return 0, bfp.Tile{}, false
	}
	return f, t, true
}
