package manifest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/quant"
)

// StoredFormat is how a tensor is stored: BFP tiles, BF16, F32 or the
// source bytes unchanged. The zero value is invalid. Its one spelling, in
// plans, manifests and JSON alike, is String's (BFP formats as bfp.Format
// spells them); ParseStoredFormat accepts any case.
type StoredFormat string

// Stored formats.
const (
	StoreBFP8 StoredFormat = "BFP8_b" // Tenstorrent BFP8_b tiles
	StoreBFP4 StoredFormat = "BFP4_b" // Tenstorrent BFP4_b tiles
	StoreBFP2 StoredFormat = "BFP2_b" // Tenstorrent BFP2_b tiles
	StoreBF16 StoredFormat = "BF16"   // bfloat16 (a BF16 source is copied; F32/F16 are rounded to nearest even)
	StoreF32  StoredFormat = "F32"    // float32 (exact from BF16/F16/F32)
	StoreAsIs StoredFormat = "AS_IS"  // the source bytes and dtype, unchanged
)

// StoredFormats lists the stored formats, BFP first, narrowest first.
var StoredFormats = []StoredFormat{StoreBFP2, StoreBFP4, StoreBFP8, StoreBF16, StoreF32, StoreAsIs}

// ParseStoredFormat returns the stored format named s (any case, surrounding
// space ignored).
func ParseStoredFormat(s string) (StoredFormat, error) {
	t := strings.TrimSpace(s)
	for _, f := range StoredFormats {
		if strings.EqualFold(t, string(f)) {
			return f, nil
		}
	}
	return "", fmt.Errorf("unknown format %q (want BFP8_b, BFP4_b, BFP2_b, BF16, F32 or AS_IS)", s)
}

// Valid reports whether f is one of the stored formats, in its canonical
// spelling.
func (f StoredFormat) Valid() bool { return slices.Contains(StoredFormats, f) }

func (f StoredFormat) String() string { return string(f) }

// MarshalText gives the canonical spelling and refuses an invalid format,
// so that no manifest or plan is written with one.
func (f StoredFormat) MarshalText() ([]byte, error) {
	if !f.Valid() {
		return nil, fmt.Errorf("manifest: invalid stored format %q", string(f))
	}
	return []byte(f), nil
}

// IsBFP reports whether f is a BFP format.
func (f StoredFormat) IsBFP() bool { return f == StoreBFP8 || f == StoreBFP4 || f == StoreBFP2 }

// BFP returns the bfp format of a BFP stored format.
func (f StoredFormat) BFP() (bfp.Format, bool) {
	switch f {
	case StoreBFP8:
		return bfp.BFP8, true
	case StoreBFP4:
		return bfp.BFP4, true
	case StoreBFP2:
		return bfp.BFP2, true
	}
	return 0, false
}

// Lossless reports whether f keeps every value of a source of dtype
// srcDType exactly.
func (f StoredFormat) Lossless(srcDType string) bool {
	switch f {
	case StoreAsIs, StoreF32:
		return true
	case StoreBF16:
		return srcDType == "BF16"
	}
	return false
}

// Method is how a tensor's stored values were obtained; it is
// quant.Method, the word the calibration driver uses too. The zero value
// is invalid.
type Method = quant.Method

// Methods recorded per tensor and named in plan rules.
const (
	MethodGPTQ = quant.GPTQ
	MethodRTN  = quant.RTN
	MethodNone = quant.None
)

// ParseMethod returns the method named s (any case).
func ParseMethod(s string) (Method, error) { return quant.ParseMethod(s) }

// DefaultTile is the tile shape of a BFP rule that names none.
const DefaultTile = "32x32"

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
