// Package ffn holds the feed-forward blocks of the supported model
// families, once: the sparse Qwen3 MoE block (router, routed SwiGLU experts,
// the optionally gated shared expert) and the SwiGLU arithmetic a dense MLP
// shares with every expert.
//
// Calibration (package calib) and the forward pass
// (internal/model/forward) both run these blocks; neither keeps a copy, so
// what calibration records is what the forward pass computes, bit for bit.
// The products of an expert's matrices are float32 through kernels.Sgemm
// unless the caller supplies others (Products), as the forward pass does to
// model device numerics.
package ffn
