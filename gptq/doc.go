// Package gptq computes layer-input Hessians and quantizes weight matrices
// with GPTQ or round-to-nearest onto a quantization grid.
//
// # What it promises
//
//   - Hessian accumulates H = (2/n)·Σ x·xᵀ over batches of float32
//     activations, n counting tokens (rows), with float64 sums; partial
//     Hessians built from disjoint batches merge by adding their sums and
//     token counts (Merge).
//   - Quantize runs blocked GPTQ step for step like the reference
//     implementation (IST-DASLab/gptq): dead inputs (H_jj = 0) zeroed,
//     optional act-order, percent damping, the inverse-Hessian factor U with
//     UᵀU = H′⁻¹, per-column quantization with error feedback inside each
//     block and a lazy matrix-product update after it, the reference's
//     grid-timing quirks, and its reported error Σ (w−q)²/(2·U_kk²). On the
//     integer grid it reproduces the reference's test vectors (see
//     TestReferenceVectors and docs/gptq.md).
//   - NewFactor prepares a Hessian once (dead columns, order, damping,
//     factorization) for any number of matrices sharing it; Factor.Quantize
//     gives bit-identical results to Quantize and is safe for concurrent use.
//   - Grids: the reference's uniform integer grid (IntGrid) and Tenstorrent
//     block floating point (BFPGrid: BFP8_b, BFP4_b, BFP2_b) with the shared
//     exponent along the input or the output axis. Every output of a BFP
//     grid survives bfp.Pack and bfp.Unpack bit for bit in the orientation
//     of its axis.
//   - When the Cholesky factorization fails the damping is raised
//     automatically (Result.PercDamp, Result.DampIncreases); the output never
//     contains NaN or Inf — a numerical overflow is an error instead.
//   - Float32 mode (the reference's arithmetic, factorization included) and
//     float64 mode.
//   - Deterministic: identical inputs give bit-identical outputs, whatever
//     the number of CPUs (GOMAXPROCS) and in both the assembly and the
//     purego builds.
//   - Quantize uses the machine's cores: the kernels split the products and
//     the factorization, and within each lazy-update block fixed chunks of
//     rows run the column loop concurrently (BFP grids; integer grids share
//     per-row state and use one chunk).
//   - Bad input (shapes, NaN/Inf, a Hessian that is not square, has a
//     negative diagonal or is not symmetric, invalid grids or options) is
//     an error wrapping ErrShape, ErrNotFinite, ErrHessian or ErrOptions,
//     never a panic.
//   - Each call reports the proxy loss ½·tr(Δ·H·Δᵀ) of its result and of
//     RTN on the same grid, the damping used and the time taken (Result,
//     Report).
//
// Weights are always passed [out, in] row-major (rows are outputs, columns
// are inputs), H is in×in. For output-axis BFP grids the caller stores the
// transpose of Result.Q.
//
// The dense linear algebra (Hessian SYRK, the lazy block update, the
// factorization) runs on internal/kernels behind a few small functions in
// linalg.go. The per-column rank-1 updates use a small AVX routine of this
// package (axpy_amd64.s, chosen by a CPUID check) with a Go twin that gives
// the same bits (build tag purego, other architectures).
package gptq
