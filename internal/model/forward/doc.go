// Package forward is the CPU forward pass of the Qwen3.5/3.6 MoE,
// Qwen3-Next and dense Qwen3.5 text models in float32: Gated DeltaNet
// layers (causal convolution, gated delta rule in chunked and recurrent
// form, gated RMSNorm), gated full-attention layers (q/k norms, partial
// RoPE, grouped-query causal attention computed blockwise), sparse MoE
// blocks or dense SwiGLU MLPs (internal/model/ffn's, which calibration runs
// too), the LM head and the MTP head.
//
// Weights come from a WeightSource: a safetensors checkpoint, tensors in
// memory, or an Overlay of both (decoded quantized weights substituted for
// the BF16 ones). Layer.Forward runs one layer over a Batch of sequences
// and shows every calibration site to a Hook; Model.Trunk runs the layers
// one at a time; Model.Logits hands out logits a chunk of positions at a
// time; a Cache per sequence continues a sequence token by token.
// docs/forward.md describes the numerics and the memory plan.
package forward
