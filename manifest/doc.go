// Package manifest is the native checkpoint format: the manifest schema
// (Manifest, TensorEntry, ...), the file layout (Layout), the tensor codec
// (PackBFP, UnpackBFP, DecodeFloats, ...), read access (OpenCheckpoint) and
// verification (Verify). It links neither calibration nor the quantizer: a
// program that only opens or verifies checkpoints imports this package
// alone. Precision plans are in manifest/plan, the build pipelines
// (Convert, GPTQ, resumption, the comparison with the source) in
// manifest/build.
//
// # Native checkpoints
//
// build.Convert and build.GPTQ write a native checkpoint directory (docs/checkpoint.md):
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
// Verify re-checks all of this; build.Verify adds, with a source, that every
// tensor is what its method makes of the source. OpenCheckpoint gives read
// access (TensorInfo, ReadPacked, Float32s) to a finished checkpoint.
package manifest
