// Package safetensors reads and writes safetensors files and sharded
// checkpoints.
//
// The reader accepts exactly the files that the reference implementation
// accepts and rejects the others with the same kind of error, wrapped with the
// file and tensor concerned. The writer's output is deterministic and always
// accepted by the reader. The package imports nothing else from this module.
package safetensors
