// Package bfp packs and unpacks Tenstorrent block-floating-point tiles
// (BFP8_b, BFP4_b and BFP2_b).
//
// Pack produces, for the same float32 input, exactly the bytes that
// tt-metal's host packer produces: 16 values of one face row share an 8-bit
// exponent (the largest exponent field among them), each element is aligned
// to it by truncation and rounded half to even on the truncated value,
// magnitudes saturate, subnormal inputs flush to zero and no negative-zero
// code is emitted. The matrix is zero-padded to whole tiles and the tiles are
// emitted row-major over the tile grid, as ttnn does before packing. Unpack
// returns, bit for bit, what tt-metal's host unpacker returns, for any bytes
// (including codes the packer never emits). The format is described in
// docs/bfp-format.md.
//
// The block primitives SharedExponent, Format.Encode, Format.Decode,
// Format.Nearest and Format.QuantizeGroup are the element rule Pack uses,
// so a value quantised with them equals what Pack then Unpack gives.
//
// Validate checks that packed bytes are exactly what Pack emits for some
// input (equivalently, Pack(Unpack(b)) == b), locating the first tile,
// group and element that is not.
//
// Errors: every error wraps one of ErrUnknownFormat, ErrInvalidTile,
// ErrShape, ErrBufferSize or ErrNotCanonical (test with errors.Is) and is
// one of the typed errors FormatError, TileError, ShapeError, BufferError,
// CanonicalError (errors.As) naming the format, tile, shape, lengths or
// position involved. Functions returning an error
// never panic on caller data; the few helpers without an error result
// (TileBytes, Tile.Groups, Format.Bits, ...) panic on an invalid format or
// tile, which callers rule out with Valid, ParseFormat or ParseTile.
//
// Output is deterministic and independent of the number of goroutines
// (ParallelPackInto, ParallelUnpackInto) and of the kernel in use: on amd64
// with AVX2, assembly kernels are selected at run time; the pure-Go kernels
// (build tag purego, other architectures) give identical bytes and values.
// The package imports nothing else from this module.
package bfp
