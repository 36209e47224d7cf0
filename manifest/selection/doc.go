// Package selection chooses a precision per quantized matrix of a model so
// that the native checkpoint fits one budget (stored bytes, bits per
// weight, or bytes read per decoded token) with the least predicted error.
//
// Measure runs the store build of manifest/build once per BFP format
// among the candidates and keeps, per matrix, the proxy losses the GPTQ
// solver reports (½·tr(ΔW·H·ΔWᵀ) for GPTQ and for round to nearest),
// weighted by the matrix's share of the calibration tokens; the result is
// a Sensitivity, saved as JSON with the identities of the model, the
// calibration store and the base plan so that it is refused for other
// inputs. Select groups the matrices into the units that must share a
// format (an expert group's gate_up or down, every other matrix alone),
// applies a user's overrides, solves the multiple-choice knapsack by
// dynamic programming over a cost grid (Solve), and returns the plan, the
// per-unit choices and the Pareto curve. docs/selection.md describes the
// measure, the budgets, the solver's bound and the limits.
package selection
