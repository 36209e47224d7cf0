// Package bfp packs and unpacks Tenstorrent block-floating-point tiles
// (BFP8_b, BFP4_b and BFP2_b).
//
// Pack produces, for the same float32 input, exactly the bytes that
// tt-metal's host packer produces: 16 values of one face row share an 8-bit
// exponent, each element is aligned to it by truncation and rounded half to
// even on the truncated value, magnitudes saturate, subnormal inputs flush to
// zero. Unpack is the exact inverse on packer output. The package imports
// nothing else from this module.
package bfp
