// Package ttnn writes and reads ttnn tensor files (`.tensorbin`), the files
// tt-metal's `ttnn.load_tensor` and the `ttnn.as_tensor` weight cache load,
// and exports a native checkpoint's tensors as such files.
//
// A `.tensorbin` is an 8-byte little-endian header length, a flatbuffer
// whose root table is `Tensor` (tensor spec, mesh shape, shards with inline
// file storage, tensor topology), zero padding, and the data region holding
// each shard's buffer. The schema this package writes and reads is in
// tensor.fbs; it matches the upstream tt-metal flatbuffer tensor format from
// the addition of `tensor_topology` (tt-metal PR #29158, September 2025) with
// the 64-byte data alignment of PR #56434, without the unconfirmed
// `schema_version` field and `TTNB` file identifier. docs/ttnn-export.md
// walks through the bytes of one file.
//
// The payload of a BFLOAT8_B or BFLOAT4_B tensor is the packed tile bytes
// exactly as package bfp (and tt-metal's host packer) produces them, so a
// native checkpoint's BFP tensors are exported without being decoded or
// re-quantized.
//
// The flatbuffer accessors are written by hand on top of the flatbuffers Go
// runtime (github.com/google/flatbuffers/go): flatc does not generate Go for
// a union whose member is a struct, which the upstream schema uses for
// InlineFileStorage. Every buffer is checked by Verify, which applies the
// flatbuffers verifier's rules, before any accessor reads it.
package ttnn
