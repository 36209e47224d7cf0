// Package build writes native checkpoints (package manifest describes the
// format) from a Hugging Face safetensors source: Convert rounds every
// quantized tensor to nearest, GPTQ quantizes the selected matrices with
// Hessians from a calibration store (package calib). Both resolve a plan
// (package manifest/plan), lay the files out with manifest.Layout, write
// every file atomically, resume an interrupted build of the same inputs and
// refuse one of different inputs. Verify is manifest.Verify plus the
// comparison with the source. Demo runs the whole flow on a small model.
//
// Every options struct a caller fills has a Validate method; the entry
// points call it before any I/O, so an option out of range is an error,
// never a quiet fallback.
package build
