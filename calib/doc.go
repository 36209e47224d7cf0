// Package calib stores calibration activations, routes tokens to MoE experts
// as the model does, and quantizes the experts of a MoE block one at a time
// with GPTQ, measuring the result on held-out tokens.
//
// # Calibration store
//
// A store (CreateStore, OpenStore) is a directory of safetensors shards
// holding, per decoder layer and site (SiteMoE, SiteAttn, …), one row of
// activations per calibration token in BF16 or F32, with sequence
// boundaries, optional token ids and provenance (model, revision,
// sequences, tokens, token-id hash) in an index and in every shard. Shards
// are checked against the index before use; Store.Stream reads any row range
// in bounded chunks. Layers are numbered as the native manifest numbers them:
// the trunk layers 0..L-1, then MTP layer k as L+k (model.Config.NumLayers,
// model.Config.LayerPrefix). docs/calibration.md describes the format.
//
// # Routing and the MoE block
//
// Route reproduces Qwen3 MoE routing exactly (float32 softmax, top-k with
// ties to the lower expert index, optional renormalisation) and is
// deterministic. ffn.MoE.Forward computes the whole block (router, top-k,
// SwiGLU experts, weighted sum in expert order, sigmoid-gated shared
// expert). LoadMoELayer reads a block from a checkpoint, routed experts on
// demand.
//
// # Per-expert GPTQ
//
// QuantizeMoELayer quantizes one block's experts: gate and up with the
// Hessian of the expert's routed tokens, then down with the Hessian of the
// activations produced by the already quantized gate and up; the shared
// expert as a dense MLP over all tokens; the router and shared-expert gate
// never. Starved experts follow a recorded policy (StarvedRTN,
// StarvedIdentity, StarvedAllTokens); no matrix is skipped and no NaN is
// produced. Peak memory does not depend on the number of experts, and
// results are bit-identical for any worker count.
//
// # Synthetic calibration
//
// Synth and SynthesizeStore generate deterministic activations with
// correlated channels, outlier and massive-activation channels and per-token
// scales, for models without real calibration data.
package calib
