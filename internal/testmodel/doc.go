// Package testmodel generates stand-ins for the checkpoints ttquant is
// meant to convert: a tiny Qwen3.6-MoE-shaped checkpoint with real values,
// and a shape replica of Qwen3.6-35B-A3B whose files carry real headers but
// no data (sparse files).
//
// # What it promises
//
// Names, nesting, dtypes and shard structure follow the released
// Qwen3.5/3.6 MoE checkpoints: the `model.language_model.` trunk prefix, a
// hybrid pattern of Gated DeltaNet (linear attention) and full-attention
// layers (layer i is full attention when (i+1) % 4 == 0), fused 3-D routed
// experts (`mlp.experts.gate_up_proj` [E, 2I, H], gate rows first, and
// `mlp.experts.down_proj` [E, H, I]), a shared expert with its sigmoid gate,
// one MTP layer under `mtp.`, an untied `lm_head.weight`, and F32
// `linear_attn.A_log` and `linear_attn.norm.weight` (everything else BF16).
// Every shard carries `{"format":"pt"}` metadata.
//
// Generation is deterministic and byte-identical on every platform: values
// come from an integer PRNG (SplitMix64 seeded with FNV-1a-64 of a
// versioned prefix and the tensor name), are scaled only by powers of two
// or by single IEEE float32 operations whose results are exactly defined,
// and are rounded to BF16 with round-to-nearest-even. No transcendental
// function is ever evaluated. See Values for the exact recipe and the
// injected edge cases (an all-zero quantization block, outliers, a BF16
// subnormal and a negative zero).
//
// # Variants
//
// Default writes three shards and a model.safetensors.index.json (shard 1
// and 3 in the reference writer's layout; shard 2 with alphabetical JSON key
// order that differs from its data order and a leading-whitespace pad).
// PerExpert stores the routed experts as 2-D per-expert tensors
// (`mlp.experts.{e}.{gate,up,down}_proj.weight`, the Qwen3-Next naming) with
// the same values. SingleFile writes one model.safetensors and no index.
// FP8 stores one projection as F8_E4M3 with a `weight_scale_inv` companion
// and a quantization_config, the shape of an already-quantized release that
// the toolchain must refuse. Qwen3NextTiny switches any variant to the
// Qwen3-Next flavour (`model.` prefix, fused in_proj_qkvz/in_proj_ba,
// per-expert experts, flat config.json).
//
// WriteReplica35B writes the 712 text tensors of Qwen3.6-35B-A3B (about
// 71 GB of BF16/F32 data) as sparse files: headers are exact, data are
// holes, so the replica costs almost no disk space and is meant for tools
// that read headers only.
package testmodel
