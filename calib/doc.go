// Package calib stores calibration activations, routes tokens to MoE experts
// as the model does, and accumulates per-expert Hessians for GPTQ.
package calib
