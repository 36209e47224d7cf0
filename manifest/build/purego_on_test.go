//go:build purego

package build

// purego is set when the portable kernels are selected. They are much
// slower than the assembly ones, so the tests that repeat GPTQ builds to
// check determinism and resumption run those only on the assembly build;
// the portable kernels give bit-identical results (internal/kernels tests
// them against each other) and one GPTQ build still runs here.
const purego = true
