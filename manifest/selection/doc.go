// Package selection chooses a precision per quantized matrix of a model so
// that the native checkpoint fits one budget (stored bytes, bits per
// weight, or bytes read per decoded token) with the least predicted error.
//
// MeasurePrepared (after Prepare; Run does both) runs the GPTQ build of
// manifest/build (from a calibration store, or sequentially from
// calibration text) once per BFP format among the
// candidates and keeps, per matrix, the proxy losses the GPTQ solver
// reports (½·tr(ΔW·H·ΔWᵀ) for GPTQ and for round to nearest), weighted by
// the matrix's share of the calibration tokens; with WeightMeasure it then
// measures the KL per unit of loss of every role class (in every layer) by
// single changes scored on held-out calibration text in process
// (harness.EvaluateChanges). The result is a Sensitivity, saved as JSON
// with the identities of the model, the calibration data and the base plan
// so that it is refused for other inputs. Select groups the matrices into the units that must share a
// format (an expert group's gate_up or down, every other matrix alone),
// applies a user's overrides, solves the multiple-choice knapsack by
// dynamic programming over a cost grid (Solve), and returns the plan, the
// per-unit choices and the Pareto curve. Run is the whole of it as the
// select command runs it: the sensitivity file read, or measured once the
// budget is known to be achievable, then the selection.
// docs/selection.md describes the
// measure, the budgets, the solver's bound and the limits.
package selection
