// Package kernels holds the dense linear-algebra kernels that dominate
// quantization time: the Hessian accumulation XᵀX (SyrkLower64, and
// GramAccumulator for row streams in arbitrary batches), general
// matrix products (Sgemm, Dgemm; the GPTQ lazy block update is one Sgemm
// call), and the Cholesky-based factorizations GPTQ needs (Dpotrf, Dtrtri,
// Dpotri, CholInvUpper, and their float32 forms Spotrf, Strtri, Spotri,
// CholInvUpper32). MeasurePeak, RunBench and BenchReport.EstimateMoE
// measure this machine and turn the rates into time estimates. The
// package imports nothing of the module.
//
// # Conventions
//
// Matrices are row-major slices with explicit dimensions and a leading
// dimension (the distance between consecutive rows, ≥ the number of
// columns), so a sub-matrix is a re-sliced view: the block starting at row
// i, column j of a matrix with leading dimension ld is x[i*ld+j:] with the
// same ld. Wrong dimensions or short slices are programming errors and
// panic with a "kernels: " message; data-dependent failures (a matrix that
// is not positive definite) are returned as errors.
//
// # Determinism and the two builds
//
// On amd64 processors with AVX2 and FMA (detected at start-up with CPUID
// and XGETBV) the inner micro-kernels are Go assembly; elsewhere, and
// under the purego build tag, pure-Go twins run instead. Both builds give
// bit-identical results: the assembly performs, for every output element,
// the same chain of fused multiply-adds in the same order as the Go code.
// float64 chains use math.FMA. float32 chains use an exact float32 fused
// multiply-add written in Go (fma32): float32(math.FMA(a, b, c)) computed
// in float64 is NOT always correct because the second rounding can meet a
// tie the first rounding created; fma32 detects that case and repairs it
// with an exact error term and round-to-odd (see its comment and the
// tests, which check it against exact arithmetic and against the
// hardware). NaN results agree as NaN, not necessarily in payload bits.
//
// All functions are safe for concurrent use. Results never depend on the
// number of goroutines (SetWorkers): output
// tiles are split among goroutines, each output element is produced by a
// single goroutine, and its order of operations depends only on the
// inner-dimension block size (256), which is a constant.
//
// # Rounding of the products
//
// For every block of 256 consecutive inner indices, each output element
// receives the fused-multiply-add chain over the block, started from +0,
// with one addition (float32 for Sgemm and SyrkLower32, float64 for Dgemm
// and SyrkLower64, whose float32 partial sums are converted exactly).
//
// # Speed
//
// The products follow the usual packed-panel scheme: panels of B
// (256×4080) and blocks of A (256×144 rows for float32, 96 for float64)
// are copied into contiguous micro-panels, and a 6×16 (float32) or 6×8
// (float64) register-blocked micro-kernel runs over them; with AVX-512,
// whole tiles of float32 products run as 12×32 tiles (two A slivers
// against two B slivers, 24 accumulators), which gives every element the
// same chain as the four 6×16 tiles it replaces. MeasurePeak
// times a pure FMA loop so that benchmarks can report the fraction of the
// machine's float32 and float64 FMA throughput reached.
package kernels
