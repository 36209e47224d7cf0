// Package gptq computes layer-input Hessians and quantizes weight matrices
// with GPTQ or round-to-nearest onto a quantization grid.
//
// The solver knows number formats only through the Grid interface; uniform
// integer grids and block-floating-point grids are provided.
package gptq
