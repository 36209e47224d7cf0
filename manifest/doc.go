// Package manifest holds precision plans and the native checkpoint: its
// layout, its manifest, and the writing and verification of checkpoints.
//
// # Plans
//
// A Plan is an ordered list of rules that decide, per stored tensor, the
// stored format (BFP8_b/BFP4_b/BFP2_b tiles, BF16, F32 or the source
// bytes), the method (gptq, rtn, none), the BFP block axis and the tile.
// Plan.Resolve applies a plan to a source model from its headers alone:
// routed experts are split per expert with canonical names whatever the
// source layout, and unknown tensors, unmatched tensors and already
// quantized sources are errors. See docs/plans.md.
//
// # Native checkpoints
//
// Convert and GPTQ build a native checkpoint directory (docs/checkpoint.md):
// routed experts in grouped files (16 experts per file by default, one
// gate_up and one down file per group and layer, MTP layers included),
// every other tensor in dense shards, config and tokenizer files copied,
// a SHA256SUMS list and native_manifest.json. The package promises:
//
//   - Determinism: the same source, plan, calibration and options give
//     byte-identical files, manifest included, for any worker count and on
//     every run. The manifest holds no wall-clock time.
//   - Accounting: the manifest records every file's size and sha256, every
//     tensor's source ranges, format, shapes, orientation, tile, method,
//     byte range and sha256, the source identity, the plan, the GPTQ
//     options, the calibration identity and per-matrix and per-layer
//     statistics. Its own sha256 is the checkpoint's identity; CacheKey is
//     the short form.
//   - Atomicity: files are written under temporary names and renamed when
//     complete, and the manifest is written last, so an interrupted build
//     never leaves a directory that verifies; Verify reports it as
//     incomplete.
//   - Resumption: running the same build on the same directory keeps the
//     finished files whose hashes check, redoes the rest and gives the
//     bytes of an uninterrupted run; a build of different inputs or
//     options is refused with what differs.
//
// Verify re-checks all of this, and with a source also that every tensor
// is what its method makes of the source. OpenCheckpoint gives read access
// (TensorInfo, ReadPacked, Float32s) to a finished checkpoint. Demo runs the
// whole flow on the built-in tiny model.
package manifest
