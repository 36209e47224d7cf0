// Package plan holds precision plans, the presets and the resolution
// preview. A Plan is an ordered list of rules that decide, per stored tensor, the
// stored format (BFP8_b/BFP4_b/BFP2_b tiles, BF16, F32 or the source
// bytes), the method (gptq, rtn, none), the BFP block axis and the tile.
// Plan.Resolve applies a plan to a source model from its headers alone:
// routed experts are split per expert with canonical names whatever the
// source layout, and unknown tensors, unmatched tensors and already
// quantized sources are errors. See docs/plans.md.
package plan
