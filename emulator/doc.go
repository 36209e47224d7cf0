// Package emulator models on the CPU, bit for bit, the numerics of a
// Tenstorrent Tensix core (unpackers, Matrix Unit, packer), and computes the
// quality metrics used to compare model runs.
package emulator
