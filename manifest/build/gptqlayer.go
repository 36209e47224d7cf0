package build

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/jsonx"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
	"github.com/ttquant/ttquant/manifest"
)

func sortedLayers(m map[int][]int) []int {
	out := make([]int, 0, len(m))
	for l := range m {
		out = append(out, l)
	}
	sort.Ints(out)
	return out
}

func layerRecordPath(out string, layer int) string {
	return filepath.Join(out, manifest.PartialDir, fmt.Sprintf("layer-%03d.stats", layer))
}

// mergeLayerStats adds the held-out statistics of the GPTQ layers to the
// per-layer aggregates of the matrix statistics.
func mergeLayerStats(agg, layers []manifest.LayerStats) []manifest.LayerStats {
	by := map[int]int{}
	for i, l := range agg {
		by[l.Layer] = i
	}
	for _, l := range layers {
		i, ok := by[l.Layer]
		if !ok {
			agg = append(agg, manifest.LayerStats{Layer: l.Layer})
			i = len(agg) - 1
			by[l.Layer] = i
		}
		a := &agg[i]
		a.CalibTokens, a.HeldOutTokens = l.CalibTokens, l.HeldOutTokens
		a.HeldOutMSE, a.HeldOutRTNMSE, a.RefMeanSquare = l.HeldOutMSE, l.HeldOutRTNMSE, l.RefMeanSquare
		a.Starved = l.Starved
		a.ResidualMeanSquare, a.HeldOutStreamRelMSE = l.ResidualMeanSquare, l.HeldOutStreamRelMSE
	}
	sort.Slice(agg, func(i, j int) bool { return agg[i].Layer < agg[j].Layer })
	return agg
}

// expertPair is one routed expert's stored tensors.
type expertPair struct{ gu, down *storedTensor }

// finiteExperts refuses a routed expert whose source holds NaN or Inf
// as the GPTQ driver loads it: GPTQ cannot quantize such a matrix, even
// when non-finite values are allowed.
type finiteExperts struct {
	src ffn.ExpertSource
	ex  map[int]*expertPair
}

func (s finiteExperts) Expert(e int) (*ffn.ExpertWeights, error) {
	w, err := s.src.Expert(e)
	if err != nil || w == nil {
		return w, err
	}
	if p := s.ex[e]; p != nil {
		if !manifest.AllFinite(w.Gate) || !manifest.AllFinite(w.Up) {
			gu := append(append(make([]float32, 0, len(w.Gate)+len(w.Up)), w.Gate...), w.Up...)
			return nil, nonFiniteErrorHint(p.gu, gu, gptqNonFiniteHint)
		}
		if !manifest.AllFinite(w.Down) {
			return nil, nonFiniteErrorHint(p.down, w.Down, gptqNonFiniteHint)
		}
	}
	return w, nil
}

func sourceFloats(st *storedTensor) ([]float32, error) {
	raw, err := readSlice(st)
	if err != nil {
		return nil, err
	}
	v, err := manifest.DecodeFloats(st.srcDType, raw)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", st.name, err)
	}
	return v, nil
}

// expertPairs pairs every routed expert of layer with its stored tensors,
// checking them against the config.
func (b *builder) expertPairs(layer int) (map[int]*expertPair, error) {
	ex := map[int]*expertPair{}
	for _, st := range b.tensors {
		if st.layer != layer {
			continue
		}
		switch model.Role(st.role) {
		case model.RoleExpertGateUp, model.RoleExpertDown:
			p := ex[st.expert]
			if p == nil {
				p = &expertPair{}
				ex[st.expert] = p
			}
			if model.Role(st.role) == model.RoleExpertGateUp {
				p.gu = st
			} else {
				p.down = st
			}
		}
	}
	if len(ex) != b.modelCfg.MoE().Experts {
		return nil, fmt.Errorf("the source has %d routed experts, config.json says %d", len(ex), b.modelCfg.MoE().Experts)
	}
	for e, p := range ex {
		if e < 0 || e >= b.modelCfg.MoE().Experts {
			return nil, fmt.Errorf("routed expert %d outside 0..%d of config.json", e, b.modelCfg.MoE().Experts-1)
		}
		if p.gu == nil || p.down == nil {
			return nil, fmt.Errorf("expert %d: gate_up or down missing from the source", e)
		}
	}
	return ex, nil
}

// moeLayer loads one MoE layer for the calibration driver with
// calib.LoadMoELayer (router and shared expert now, routed experts on
// demand, whatever the source's expert layout) and pairs every routed
// expert with its stored tensors.
func (b *builder) moeLayer(layer int) (*ffn.MoE, map[int]*expertPair, error) {
	ex, err := b.expertPairs(layer)
	if err != nil {
		return nil, nil, err
	}
	l, err := calib.LoadMoELayer(b.model, b.modelCfg, layer)
	if err != nil {
		return nil, nil, err
	}
	l.Experts = finiteExperts{src: l.Experts, ex: ex}
	return l, ex, l.Check()
}

type produced struct {
	data []byte
	te   manifest.TensorEntry
	ms   *manifest.MatrixStats
}

// runGPTQLayer quantizes one MoE layer's routed experts with the
// calibration driver and writes the layer's expert files as their groups
// complete. Files kept from an earlier run are not rewritten; the driver
// still runs unless every file is kept and the layer's statistics were
// recorded.
func (b *builder) runGPTQLayer(ctx context.Context, layer int, idxs []int, keep func(int) bool, commit func(int, *fileRecord) error) (*manifest.LayerStats, error) {
	pending := b.pendingFiles(idxs, keep)
	recPath := b.layerRecord(layer)
	if len(pending) == 0 {
		if data, err := os.ReadFile(recPath); err == nil {
			var ls manifest.LayerStats
			if jsonx.Unmarshal(data, &ls) == nil && ls.Layer == layer {
				return &ls, nil
			}
		}
	}
	ml, ex, err := b.moeLayer(layer)
	if err != nil {
		return nil, err
	}
	cal, held, err := b.store.LoadActivations(layer, calib.SiteMoE, b.opt.HeldOutSequences)
	if err != nil {
		return nil, err
	}
	if si, _ := b.store.Site(layer, calib.SiteMoE); si.Cols != ml.Config.Hidden {
		return nil, fmt.Errorf("calibration site %q has %d features, the model %d", calib.SiteMoE, si.Cols, ml.Config.Hidden)
	}
	if b.opt.Asymmetric {
		// The store's rows are the source model's inputs: gate and up are
		// their own fits, down is fitted to the source intermediate.
		cal.Target = cal.X
	}
	return b.quantizeExperts(ctx, layer, pending, commit, ml, ex, cal, held, nil)
}

// pendingFiles returns the expert files of a layer that are not kept from
// an earlier run (file → job index). keep reports a kept file as done.
func (b *builder) pendingFiles(idxs []int, keep func(int) bool) map[string]int {
	pending := map[string]int{}
	for _, i := range idxs {
		if !keep(i) {
			pending[b.jobs[i].file] = i
		}
	}
	return pending
}

// quantizeExperts runs the calibration driver over one MoE layer's routed
// experts and writes the expert files that are not kept as their groups
// complete. When stored is set it receives every routed expert tensor's
// bytes, those of kept files included.
func (b *builder) quantizeExperts(ctx context.Context, layer int, pending map[string]int, commit func(int, *fileRecord) error,
	ml *ffn.MoE, ex map[int]*expertPair, cal, held calib.Activations, stored func(*storedTensor, []byte)) (*manifest.LayerStats, error) {
	recPath := b.layerRecord(layer)
	jobOf := map[string]*job{}
	for _, i := range pending {
		for _, st := range b.jobs[i].tensors {
			jobOf[st.name] = b.jobs[i]
		}
	}
	done := map[string]*produced{}
	count := map[string]int{}
	g := b.gopt
	lo := calib.LayerOptions{GPTQ: &g, Workers: b.opt.Workers, SkipShared: true, Grids: layerGrids(ex), Experts: b.expertSubset(layer)}
	take := func(r *calib.ExpertResult) error {
		if r.Expert < 0 {
			return nil
		}
		for _, st := range []*storedTensor{ex[r.Expert].gu, ex[r.Expert].down} {
			j := jobOf[st.name]
			if j == nil && stored == nil {
				continue // its file is kept
			}
			p, err := b.produceExpert(st, r)
			if err != nil {
				return fmt.Errorf("tensor %s: %w", st.name, err)
			}
			if stored != nil {
				stored(st, p.data)
			}
			if j == nil {
				continue
			}
			done[st.name] = p
			count[j.file]++
			if count[j.file] == len(j.tensors) {
				rec, err := b.writeJobWith(ctx, j, func(_ context.Context, st *storedTensor) ([]byte, manifest.TensorEntry, *manifest.MatrixStats, error) {
					p := done[st.name]
					delete(done, st.name)
					return p.data, p.te, p.ms, nil
				})
				if err != nil {
					return fmt.Errorf("%s: %w", j.file, err)
				}
				if err := commit(pending[j.file], rec); err != nil {
					return err
				}
			}
		}
		return nil
	}
	run := calib.NewLayerRun(ctx, ml, cal, held, lo)
	for r := range run.Results() {
		if err := take(r); err != nil {
			return nil, err
		}
	}
	rep, err := run.Report()
	if err != nil {
		return nil, err
	}
	ls := layerStatsOf(layer, rep)
	for f := range pending {
		if count[f] != len(b.jobs[pending[f]].tensors) {
			return nil, fmt.Errorf("manifest: layer %d: file %s received %d of its %d tensors", layer, f, count[f], len(b.jobs[pending[f]].tensors))
		}
	}
	if err := b.opt.Faults.WriteJSON(recPath, ls); err != nil {
		return nil, err
	}
	return ls, nil
}

// layerGrids gives every routed expert's matrices the grid of the tensor
// they are stored in, so that one driver run covers the whole layer and a
// down projection's Hessian always comes from the gate and up projections
// exactly as they are stored, whatever formats the plan gives them.
func layerGrids(ex map[int]*expertPair) []calib.ExpertGrids {
	gridOf := func(st *storedTensor) gptq.Grid {
		axis := bfp.AxisInput
		if st.axis == bfp.AxisOutput {
			axis = bfp.AxisOutput
		}
		return gptq.NewBFPGrid(st.bfpF, axis)
	}
	grids := make([]calib.ExpertGrids, len(ex))
	for e, p := range ex {
		gu := gridOf(p.gu)
		grids[e] = calib.ExpertGrids{Gate: gu, Up: gu, Down: gridOf(p.down)}
	}
	return grids
}

// layerStatsOf turns the driver's layer report into the manifest's layer
// statistics.
func layerStatsOf(layer int, rep *calib.LayerReport) *manifest.LayerStats {
	ls := &manifest.LayerStats{Layer: layer, CalibTokens: int64(rep.Tokens), Starved: rep.Starved}
	if rep.HeldOut != nil {
		ls.HeldOutTokens = int64(rep.HeldOut.Tokens)
		ls.HeldOutMSE = rep.HeldOut.MSE
		ls.HeldOutRTNMSE = rep.HeldOut.RTNMSE
		ls.RefMeanSquare = rep.HeldOut.RefMeanSquare
	}
	if len(ls.Starved) == 0 {
		ls.Starved = nil
	}
	return ls
}

// produceExpert packs one routed expert tensor from the driver's result.
func (b *builder) produceExpert(st *storedTensor, r *calib.ExpertResult) (*produced, error) {
	w, err := sourceFloats(st)
	if err != nil {
		return nil, err
	}
	te := entryOf(st)
	te.Finite = manifest.AllFinite(w)
	if err := b.checkSourceFinite(st, w, te.Finite); err != nil {
		return nil, err
	}
	if st.method != manifest.MethodGPTQ {
		// Rounded without the routed expert's own Hessian: unweighted.
		packed, err := roundBFP(st.bfpF, st.tile, w, st.shape, st.orient, b.rule, nil)
		return &produced{data: packed, te: te}, err
	}
	var q []float32
	var mats []calib.MatrixStats
	if model.Role(st.role) == model.RoleExpertGateUp {
		q = append(append(make([]float32, 0, len(w)), r.Quantized.Gate...), r.Quantized.Up...)
		for _, m := range r.Stats.Matrices {
			if m.Name != "down_proj" {
				mats = append(mats, m)
			}
		}
	} else {
		q = r.Quantized.Down
		for _, m := range r.Stats.Matrices {
			if m.Name == "down_proj" {
				mats = append(mats, m)
			}
		}
	}
	if len(q) != len(w) {
		return nil, fmt.Errorf("the driver returned %d values for %d weights", len(q), len(w))
	}
	packed, back, err := manifest.PackExact(st.bfpF, st.tile, q, st.shape, st.orient)
	if err != nil {
		return nil, err
	}
	ms := &manifest.MatrixStats{Tensor: st.name, Layer: intPtr(st.layer), Expert: intPtr(st.expert), Method: manifest.MethodRTN, Tokens: int64(r.Stats.Tokens), Error: manifest.SquaredError(w, back)}
	var reasons []string
	if r.Stats.Reason != "" {
		reasons = append(reasons, r.Stats.Reason)
	}
	for _, m := range mats {
		if m.Method == manifest.MethodGPTQ {
			ms.Method = manifest.MethodGPTQ
		}
		ms.Damp = max(ms.Damp, m.Damp)
		ms.ProxyLoss += m.ProxyLoss
		ms.RTNProxyLoss += m.RTNProxyLoss
		if m.Fallback != nil {
			reasons = append(reasons, m.Name+": "+m.Fallback.Error())
		}
		if m.Asymmetric {
			ms.Fit = manifest.FitAsymmetric
		}
	}
	ms.Fallback = strings.Join(reasons, "; ")
	te.Method = ms.Method
	return &produced{data: packed, te: te, ms: ms}, nil
}
