// Package harness runs a quality evaluation end to end: the BF16 source
// model as the reference and native checkpoints as candidates, on text
// from a data spec, scored in lockstep by package eval.
//
// Each candidate is the source model with the checkpoint's stored tensors
// decoded exactly (BFP tiles unpacked bit for bit) and substituted for the
// source's (CPU fake-quant: float32 activations, float32 matmuls). The
// reference and every candidate run each window from a fresh state, and
// their logits are compared a chunk of positions at a time, so no run's
// logits are ever stored.
//
// Every sequence of the data spec's evaluation set is one corpus record:
// its label is the corpus, its mask says which positions are scored (all
// tokens of text records, the assistant tokens of chats), and it is cut
// into windows of at most Options.Window tokens, each from a fresh state.
// Before anything runs, the evaluation windows are checked against the
// calibration text (Options.Calib): a window that shares a run of 32
// tokens with it is refused, or reported as a warning with AllowOverlap.
package harness
