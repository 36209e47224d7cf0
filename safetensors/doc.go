// Package safetensors reads and writes safetensors files and sharded
// checkpoints.
//
// # Reader
//
// Open (or OpenReader for any io.ReaderAt) reads the 8-byte length prefix
// and the JSON header only, and validates the file completely before
// returning: the reader accepts exactly the files that the format's
// reference implementation accepts and rejects the others with the same
// kind of error, in the same order of checks:
//
//  1. file shorter than 8 bytes: ErrHeaderTooSmall;
//  2. header length over MaxHeaderSize (checked before anything is
//     allocated): ErrHeaderTooLarge;
//  3. header extending past the end of the file: ErrInvalidHeaderLength;
//  4. header (padding included) not UTF-8: ErrInvalidHeader;
//  5. JSON syntax or header schema: ErrInvalidHeaderDeserialization;
//  6. in data-offset order, each tensor must start where the previous one
//     ended (ErrInvalidOffset), its element count and bit size must not
//     overflow 64 bits (ErrValidationOverflow), its size must be whole bytes
//     (ErrMisalignedSlice) and match its byte range (ErrTensorInvalidInfo);
//  7. the tensors must cover the data section exactly:
//     ErrMetadataIncompleteBuffer.
//
// Errors are *Error values naming the file and, where there is one, the
// tensor; test them with errors.Is against the Err* kinds, or name them with
// KindName. The header parser is a strict scanner written for this schema
// (RFC 8259 JSON, escapes decoded before keys are compared, nesting limited
// to 127 levels, numbers in shape and data_offsets plain unsigned 64-bit
// integers), not encoding/json, which would keep duplicate keys, repair bad
// UTF-8 and match field names case-insensitively.
//
// Like the reference, and unlike the format's prose description, the reader
// accepts: JSON whitespace before and after the object; a repeated tensor
// name (the last entry wins; DuplicateNames lists such names so a caller
// can refuse them); "__metadata__": null; unknown fields in a tensor entry;
// the dtype written as {"F32": null}; and a tensor entry written as the
// array [dtype, shape, data_offsets]. One deliberate difference: the
// reference adds the final data size to the header size on 64 bits without
// an overflow check, so a crafted file whose offsets sum past 2^64 could wrap
// around to the file size; this reader rejects it
// (ErrMetadataIncompleteBuffer).
//
// # Tensor data
//
// Tensor bytes are read with positional reads (ReadAt) on the open file:
// ReadTensor, ReadTensorAt (a byte range, e.g. one expert of a fused expert
// tensor), SectionReader, and the typed Float32s, ReadFloat32s, Float64s and
// Int64s; View reinterprets tensor bytes as a typed slice without copying.
// Reading one tensor touches only that tensor's bytes. The package
// does not memory-map files: positional reads cost one system call per
// large read, perform well on network and distributed file systems where
// page-fault-driven mmap access is slow, and cannot crash the process if a
// file shrinks under it. A File is safe for concurrent use.
//
// Conversions (DecodeFloat32s, DecodeFloat64s, EncodeFloat32s) are exact
// for F32, F16, BF16 and the FP8 types (OCP F8_E4M3 and F8_E5M2 with their
// NaN and infinity rules, the FNUZ variants, F8_E8M0) and for integers up to
// 2^24; F64 to float32 rounds to nearest even.
//
// # Checkpoints
//
// OpenModel opens a single file, a directory, or a sharded checkpoint
// through its model.safetensors.index.json, and checks that every tensor of
// the index lives in exactly the shard the index names. ReadIndex,
// WriteIndex and BuildIndex handle index files.
//
// # Writer
//
// Create/Add/AddFunc/Close (or WriteFile) write a file laid out exactly as
// the reference writer lays it out, deterministically, through a temporary
// file renamed into place. The writer refuses anything the reader would
// reject, and checks its own header with the reader before writing.
//
// The package imports nothing else from this module.
package safetensors
