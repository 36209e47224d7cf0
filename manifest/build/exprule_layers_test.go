package build

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

// TestExponentRuleLayerLosses computes, layer by layer, the proxy losses
// ½·tr(ΔHΔᵀ) of RTN and GPTQ under each exponent rule (max, ttmetal,
// search; RTN's search weighted by H's diagonal), on both axes, in BFP4_b
// and in BFP8_b, for the BFP matrices of a preset outside the routed
// experts whose input Hessian a calibration store gives: the attention and
// Gated DeltaNet projections, and the shared expert or the dense MLP (the
// down projection on the SwiGLU of the source gate and up, as a store
// build computes it). GPTQ runs with the default options. Each figure is
// the sum over the layer's matrices divided by the sum of RTN with max.
//
// By default it runs on the tiny fixture and its synthetic store and
// checks, on its first layer, that every loss is finite and that GPTQ
// with max is below RTN with max in every format and axis. With
// TTQUANT_EXPRULE_LAYERS=MODEL_DIR,STORE_DIR[,PRESET] (a store from calib
// build; PRESET default qwen36-35b-a3b) it runs on that model and prints
// the Markdown rows docs/gptq.md quotes.
func TestExponentRuleLayerLosses(t *testing.T) {
	env := os.Getenv("TTQUANT_EXPRULE_LAYERS")
	src, storeDir := tinyFixture(t)
	presetName := plan.PresetQwen36MoE
	if env != "" {
		f := strings.Split(env, ",")
		if len(f) < 2 || len(f) > 3 {
			t.Fatalf("TTQUANT_EXPRULE_LAYERS=%q: want MODEL_DIR,STORE_DIR[,PRESET]", env)
		}
		src, storeDir = f[0], f[1]
		if len(f) == 3 {
			presetName = f[2]
		}
	}
	p, err := plan.Preset(presetName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := safetensors.OpenModel(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cfg, err := model.Qwen3.ReadConfig(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tensors, err := resolveStored(p, m, plan.ResolveOptions{Family: model.Qwen3, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	st, err := calib.OpenStore(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	offs := st.SequenceOffsets()
	roles := map[string]string{}
	for _, ts := range tensors {
		roles[ts.name] = ts.role
	}
	hs := &storeHessians{store: st, calibTokens: offs[len(offs)-1], cache: map[string]*hessEntry{}, roles: roles, tensors: tensors, family: model.Qwen3}

	// One matrix: its source values and Hessian.
	type matrix struct {
		name       string
		rows, cols int
		w          []float32
		h          []float64
	}
	byLayer := map[int][]matrix{}
	var layers []int
	ctx := context.Background()
	for _, ts := range tensors {
		if !ts.isBFP || ts.isExpertMatrix() || ts.layer < 0 || len(ts.shape) != 2 {
			continue
		}
		rows, cols := int(ts.shape[0]), int(ts.shape[1])
		h, _, fb, err := hs.Hessian(ctx, ts.name, ts.layer, -1, cols)
		if err != nil {
			t.Fatal(err)
		}
		if h == nil || fb != nil {
			continue
		}
		w, err := sourceFloats(ts)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := byLayer[ts.layer]; !ok {
			layers = append(layers, ts.layer)
		}
		byLayer[ts.layer] = append(byLayer[ts.layer], matrix{ts.name, rows, cols, w, h})
	}
	if len(layers) == 0 {
		t.Fatal("no matrix with a Hessian from the store")
	}
	if env == "" {
		layers = layers[:1] // the fixture's first layer keeps the default run short
	}
	rules := gptq.ExponentRules()
	show := env != ""
	if show {
		fmt.Printf("model %s, store %s, preset %s\n", src, storeDir, presetName)
		fmt.Println("| layer | matrices | format | axis | RTN max | RTN ttmetal | RTN search | GPTQ max | GPTQ ttmetal | GPTQ search | RTN max loss |")
		fmt.Println("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
	}
	// totals[format][axis][0..2 RTN, 3..5 GPTQ]: sums over all layers.
	totals := map[string][]float64{}
	for _, l := range layers {
		ms := byLayer[l]
		var names []string
		for _, mx := range ms {
			n := mx.name[strings.LastIndex(mx.name[:strings.LastIndex(mx.name, ".")], ".")+1:]
			names = append(names, strings.TrimSuffix(n, ".weight"))
		}
		for _, f := range []bfp.Format{bfp.BFP4, bfp.BFP8} {
			for _, axis := range []bfp.Axis{bfp.AxisInput, bfp.AxisOutput} {
				g := gptq.NewBFPGrid(f, axis)
				sums := make([]float64, 2*len(rules))
				for _, mx := range ms {
					diag := diagOf(mx.h, mx.cols)
					for i, r := range rules {
						q, err := gptq.RTNWith(mx.w, mx.rows, mx.cols, g, gptq.RTNOptions{Exponent: r, Diag: diag})
						if err != nil {
							t.Fatal(err)
						}
						loss, err := gptq.ProxyLoss(mx.w, q, mx.rows, mx.cols, mx.h)
						if err != nil {
							t.Fatal(err)
						}
						sums[i] += loss
						o := gptq.DefaultOptions()
						o.Exponent = r
						res, err := gptq.Quantize(mx.w, mx.rows, mx.cols, mx.h, g, o)
						if err != nil {
							t.Fatalf("%s %v %v %v: %v", mx.name, f, axis, r, err)
						}
						sums[len(rules)+i] += res.ProxyLoss
					}
				}
				key := fmt.Sprintf("%v|%v", f, axis)
				if totals[key] == nil {
					totals[key] = make([]float64, len(sums))
				}
				line := fmt.Sprintf("| %d | %s | %v | %v |", l, strings.Join(names, ", "), f, axis)
				for i, v := range sums {
					totals[key][i] += v
					if !(v >= 0) || math.IsInf(v, 0) {
						t.Errorf("layer %d %v %v: loss %d is %v", l, f, axis, i, v)
					}
					line += fmt.Sprintf(" %.4f |", v/sums[0])
				}
				if !(sums[len(rules)] < sums[0]) {
					t.Errorf("layer %d %v %v: GPTQ's proxy loss %g is not below RTN's %g", l, f, axis, sums[len(rules)], sums[0])
				}
				line += fmt.Sprintf(" %.4g |", sums[0])
				if show {
					fmt.Println(line)
				}
			}
		}
	}
	if show {
		for _, f := range []bfp.Format{bfp.BFP4, bfp.BFP8} {
			for _, axis := range []bfp.Axis{bfp.AxisInput, bfp.AxisOutput} {
				s := totals[fmt.Sprintf("%v|%v", f, axis)]
				line := fmt.Sprintf("| all | | %v | %v |", f, axis)
				for _, v := range s {
					line += fmt.Sprintf(" %.4f |", v/s[0])
				}
				fmt.Println(line + fmt.Sprintf(" %.4g |", s[0]))
			}
		}
	}
}
