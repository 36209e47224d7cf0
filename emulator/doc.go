// Package emulator models on the CPU, bit for bit, the numerics of a
// Tenstorrent Tensix core (unpackers, Matrix Unit, packer), and computes the
// quality metrics used to compare model runs.
//
// # Device numerics
//
// The model follows the integer algorithm of Tenstorrent's functional
// simulator (which Tenstorrent states is bit-exact to Wormhole and Blackhole
// silicon) for 8-bit-exponent formats:
//
//   - Unpack (L1 → source registers): SrcFromBF16, SrcFromFP32TF32,
//     SrcFromFP32BF16, UnpackBFP8 and UnpackBFP4, with the device's quirks
//     (exponent wrap-around, the sign-only BFP code read as −2^128); DecodeBFP
//     and DecodeStored apply them to whole packed matrices.
//   - Matrix Unit: MVMULStep is one multiply-accumulate of 16 lanes into one
//     Dst element at a fidelity phase, with FP32 or BF16 Dst, Blackhole
//     numerics by default and Wormhole's leading-sign-count quirk as an
//     option. TileMatmul runs a 32×32×32 tile in tt-llk's order, MatMul a
//     whole y = x·Wᵀ (BF16 activations in SrcB, weights in SrcA) and
//     MatMulStored the same for a weight as a checkpoint stores it.
//   - Packer (Dst → L1): PackFP32ToBF16, PackFP32ToE8M6, PackBF16ToE8M6,
//     PackBF16, TruncFP32ToBF16 and PackBFPBlock, combined by PackDstBF16 and
//     PackDstBFP (tt-metal's default BFP path with its double rounding, and
//     the bfp8_pack_precise path).
//
// Every function here reproduces each vector of the shared FPU conformance
// data bit for bit (see the conformance tests). Not modelled: stochastic
// rounding, FP16/BFP*_a (5-bit exponent) and integer formats, ELWADD/ELWMUL,
// the SFPU, and programs that move partial sums out of Dst between K blocks
// (packer L1 accumulation or reload). Nothing here was compared with a
// device; "bit-exact" means bit-exact to the simulator.
//
// # Fast path
//
// DeviceMatMul computes what MatMul computes, bit for bit, fast enough to
// run a model's BFP matmuls with device numerics: operands prepared once
// (NewDeviceWeights, PrepareActivations), alignment shared by the fidelity
// phases, and on amd64 with AVX2 an assembly kernel for the FP32-Dst
// Blackhole configuration (8 output columns at once). Float32 activations
// reach SrcB rounded to BF16 as a packer writes them, or truncated to TF32;
// outputs are Dst or packed to BF16. The tests compare it with TileMatmul
// on random tiles. PackRoundTrip rounds float32 values as the packer
// writes them and the unpacker reads them back (for example a BFP8_b KV
// cache).
//
// # Checking a device
//
// CheckDump compares tensors read back from a device with the emulated
// decode of what was stored, bit for bit, and names each mismatch by
// tensor, tile and element; CheckDumpDir does it for a directory of dumps
// against any checkpoint reachable through a StoredLookup.
//
// # Quality metrics
//
// The metrics are those of package emulator/eval. CompareToken computes, for one position, KL(ref‖cand), both arg-maxes and
// both runs' negative log-likelihood of a target token, in float64 with
// log-sum-exp. CompareLogits streams two [tokens, vocab] logits sources (for example
// SafetensorsLogits) in bounded memory and returns the table rows per corpus label and overall: tokens,
// PPL of each run, ΔPPL %, top-1 agreement and mean KL. Results are
// deterministic: tokens are accumulated in order whatever the parallelism.
package emulator
