package kernels

import (
	"math"
	"sort"
	"strconv"
	"strings"
)

// MoEWorkload describes the routed experts of a mixture-of-experts model
// for a kernel-time estimate: per layer and expert, gate and up
// projections (ExpertWidth×Hidden, out×in) share one Hessian over Hidden
// features, and the down projection (Hidden×ExpertWidth) has one over
// ExpertWidth features.
type MoEWorkload struct {
	Layers          int `json:"layers"`
	ExpertsPerLayer int `json:"experts_per_layer"`
	Hidden          int `json:"hidden"`
	ExpertWidth     int `json:"expert_width"`
	// RoutedRowsPerLayer is the number of (token, expert) pairs routed in
	// one layer over the calibration set: tokens × experts per token.
	RoutedRowsPerLayer int64 `json:"routed_rows_per_layer"`
	BlockSize          int   `json:"block_size"` // GPTQ block size
}

// DefaultMoEWorkload is the Qwen3.6-35B-A3B sizing used by the kernel
// estimates: 40 layers of 256 experts, hidden size 2048, expert width 512,
// two million routed rows per layer, GPTQ block 128 (about 30,000 solves).
func DefaultMoEWorkload() MoEWorkload {
	return MoEWorkload{Layers: 40, ExpertsPerLayer: 256, Hidden: 2048, ExpertWidth: 512,
		RoutedRowsPerLayer: 2_000_000, BlockSize: 128}
}

// MoEEstimate is the estimated kernel time of a workload, in seconds.
type MoEEstimate struct {
	Solves         int     `json:"solves"`
	HessianFLOPs   float64 `json:"hessian_flops"`
	FactorFLOPs    float64 `json:"factor_flops"`
	UpdateFLOPs    float64 `json:"update_flops"`
	HessianSeconds float64 `json:"hessian_seconds"`
	FactorSeconds  float64 `json:"factor_seconds"`
	UpdateSeconds  float64 `json:"update_seconds"`
	TotalSeconds   float64 `json:"total_seconds"`
}

// GPTQUpdateFLOPs is the work of all lazy block updates of one GPTQ solve
// of a rows×cols (out×in) weight with the given block size.
func GPTQUpdateFLOPs(rows, cols, block int) float64 {
	var fl float64
	for i1 := 0; i1 < cols; i1 += block {
		i2 := min(i1+block, cols)
		fl += 2 * float64(rows) * float64(i2-i1) * float64(cols-i2)
	}
	return fl
}

// rateFor returns the measured GFLOP/s of the result family (name prefix)
// whose size is nearest to n on a log scale.
func (r *BenchReport) rateFor(prefix string, n int) float64 {
	type pt struct {
		n    int
		rate float64
	}
	var pts []pt
	for _, x := range r.Results {
		if !strings.HasPrefix(x.Name, prefix) {
			continue
		}
		s := strings.TrimPrefix(x.Name, prefix)
		if i := strings.IndexByte(s, 'x'); i >= 0 { // rows×cols: use cols
			s = s[i+1:]
		}
		v, err := strconv.Atoi(s)
		if err == nil && x.GFLOPS > 0 {
			pts = append(pts, pt{v, x.GFLOPS})
		}
	}
	if len(pts) == 0 {
		return 0
	}
	sort.Slice(pts, func(i, j int) bool {
		di := math.Abs(math.Log(float64(pts[i].n) / float64(n)))
		dj := math.Abs(math.Log(float64(pts[j].n) / float64(n)))
		return di < dj
	})
	return pts[0].rate
}

func gflopsSeconds(f, gflops float64) float64 {
	if gflops <= 0 {
		return math.Inf(1)
	}
	return f / (gflops * 1e9)
}

// HessianSeconds estimates the time to accumulate the Hessian of rows
// activation rows of n features (SyrkLower64), from the measured rate.
func (r *BenchReport) HessianSeconds(rows int64, n int) float64 {
	var rate float64
	if x, ok := r.Result("hessian"); ok {
		rate = x.GFLOPS
	}
	return gflopsSeconds(float64(rows)*float64(n)*float64(n+1), rate)
}

// GPTQSolveSeconds estimates the kernel time of one GPTQ solve of a
// rows×cols (out×in) weight with the given block size: the inverse factor
// of the cols×cols Hessian plus the lazy block updates, from the measured
// rates of the nearest sizes. GPTQ's per-column loop is not included.
func (r *BenchReport) GPTQSolveSeconds(rows, cols, block int) float64 {
	c := float64(cols)
	return gflopsSeconds(2*c*c*c/3, r.rateFor("inverse-factor-", cols)) +
		gflopsSeconds(GPTQUpdateFLOPs(rows, cols, block), r.rateFor("gptq-update-", cols))
}

// EstimateMoE estimates from the measured rates how long the kernels of
// this package take for the routed experts of w: Hessian accumulation,
// inverse-Hessian factors (one per distinct Hessian) and GPTQ lazy block
// updates. The per-column quantization loop of GPTQ, data movement and
// model forward passes are not included. Rates are taken from the measured
// case of nearest size, so the estimate is only as good as the benchmark
// run (a busy machine gives pessimistic figures).
func (r *BenchReport) EstimateMoE(w MoEWorkload) MoEEstimate {
	L, E := float64(w.Layers), float64(w.ExpertsPerLayer)
	h, x := float64(w.Hidden), float64(w.ExpertWidth)
	rows := float64(w.RoutedRowsPerLayer)
	var e MoEEstimate
	e.Solves = 3 * w.Layers * w.ExpertsPerLayer
	e.HessianFLOPs = L * rows * (h*(h+1) + x*(x+1))
	e.FactorFLOPs = L * E * 2 * (h*h*h + x*x*x) / 3
	gu := GPTQUpdateFLOPs(w.ExpertWidth, w.Hidden, w.BlockSize)
	dn := GPTQUpdateFLOPs(w.Hidden, w.ExpertWidth, w.BlockSize)
	e.UpdateFLOPs = L * E * (2*gu + dn)
	e.HessianSeconds = L * (r.HessianSeconds(w.RoutedRowsPerLayer, w.Hidden) + r.HessianSeconds(w.RoutedRowsPerLayer, w.ExpertWidth))
	e.FactorSeconds = L * E * (gflopsSeconds(2*h*h*h/3, r.rateFor("inverse-factor-", w.Hidden)) +
		gflopsSeconds(2*x*x*x/3, r.rateFor("inverse-factor-", w.ExpertWidth)))
	e.UpdateSeconds = L * E * (gflopsSeconds(2*gu, r.rateFor("gptq-update-", w.Hidden)) +
		gflopsSeconds(dn, r.rateFor("gptq-update-", w.ExpertWidth)))
	e.TotalSeconds = e.HessianSeconds + e.FactorSeconds + e.UpdateSeconds
	return e
}

// NominalRate is the rate, in GFLOP/s, of every kernel in NominalReport.
const NominalRate = 50

// NominalReport is a report in which every kernel runs at NominalRate: its
// estimates (HessianSeconds, GPTQSolveSeconds, EstimateMoE) are the
// estimators' floating-point work at one fixed rate, the same on every
// machine and in every process. Work split between processes that must
// agree on the split without talking to each other is balanced with it; a
// measured report differs from one run to the next.
func NominalReport() *BenchReport {
	return &BenchReport{Impl: "nominal", Results: []BenchResult{
		{Name: "hessian", GFLOPS: NominalRate},
		{Name: "inverse-factor-1", GFLOPS: NominalRate},
		{Name: "gptq-update-1", GFLOPS: NominalRate},
	}}
}
