package manifest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
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
	return filepath.Join(out, partialDir, fmt.Sprintf("layer-%03d.stats", layer))
}

// mergeLayerStats adds the held-out statistics of the GPTQ layers to the
// per-layer aggregates of the matrix statistics.
func mergeLayerStats(agg, layers []LayerStats) []LayerStats {
	by := map[int]int{}
	for i, l := range agg {
		by[l.Layer] = i
	}
	for _, l := range layers {
		i, ok := by[l.Layer]
		if !ok {
			agg = append(agg, LayerStats{Layer: l.Layer})
			i = len(agg) - 1
			by[l.Layer] = i
		}
		a := &agg[i]
		a.CalibTokens, a.HeldOutTokens = l.CalibTokens, l.HeldOutTokens
		a.HeldOutMSE, a.HeldOutRTNMSE, a.RefMeanSquare = l.HeldOutMSE, l.HeldOutRTNMSE, l.RefMeanSquare
		a.Starved = l.Starved
	}
	sort.Slice(agg, func(i, j int) bool { return agg[i].Layer < agg[j].Layer })
	return agg
}

// expertPair is one routed expert's stored tensors.
type expertPair struct{ gu, down *storedTensor }

// sourceExperts reads routed experts from the source checkpoint on demand.
type sourceExperts struct {
	ex            map[int]*expertPair
	hidden, inter int
}

func (s *sourceExperts) Expert(e int) (*calib.ExpertWeights, error) {
	p := s.ex[e]
	if p == nil || p.gu == nil || p.down == nil {
		return nil, fmt.Errorf("expert %d: gate_up or down missing from the source", e)
	}
	gu, err := sourceFloats(p.gu)
	if err != nil {
		return nil, err
	}
	down, err := sourceFloats(p.down)
	if err != nil {
		return nil, err
	}
	if !allFinite(gu) {
		return nil, nonFiniteErrorHint(p.gu, gu, gptqNonFiniteHint)
	}
	if !allFinite(down) {
		return nil, nonFiniteErrorHint(p.down, down, gptqNonFiniteHint)
	}
	n := s.inter * s.hidden
	if len(gu) != 2*n || len(down) != n {
		return nil, fmt.Errorf("expert %d: gate_up holds %d values and down %d, want %d and %d", e, len(gu), len(down), 2*n, n)
	}
	return &calib.ExpertWeights{Gate: gu[:n], Up: gu[n:], Down: down}, nil
}

func sourceFloats(st *storedTensor) ([]float32, error) {
	raw, err := readSlice(st)
	if err != nil {
		return nil, err
	}
	v, err := decodeFloats(st.srcDType, raw)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", st.name, err)
	}
	return v, nil
}

// moeLayer assembles the calibration driver's view of one MoE layer from
// the source checkpoint.
func (b *builder) moeLayer(layer int) (*calib.MoELayer, map[int]*expertPair, error) {
	cfg := b.modelCfg.MoE
	ex := map[int]*expertPair{}
	l := &calib.MoELayer{Config: cfg}
	var shared calib.ExpertWeights
	haveShared := 0
	for _, st := range b.tensors {
		if st.layer != layer {
			continue
		}
		var err error
		switch TensorRole(st.role) {
		case RoleRouter:
			l.Router, err = sourceFloats(st)
		case RoleSharedExpertGate:
			l.SharedGate, err = sourceFloats(st)
		case RoleSharedGate:
			shared.Gate, err = sourceFloats(st)
			haveShared++
		case RoleSharedUp:
			shared.Up, err = sourceFloats(st)
			haveShared++
		case RoleSharedDown:
			shared.Down, err = sourceFloats(st)
			haveShared++
		case RoleExpertGateUp, RoleExpertDown:
			p := ex[st.expert]
			if p == nil {
				p = &expertPair{}
				ex[st.expert] = p
			}
			if TensorRole(st.role) == RoleExpertGateUp {
				p.gu = st
			} else {
				p.down = st
			}
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if l.Router == nil {
		return nil, nil, fmt.Errorf("no router (mlp.gate.weight) in the source")
	}
	if len(ex) != cfg.Experts {
		return nil, nil, fmt.Errorf("the source has %d routed experts, config.json says %d", len(ex), cfg.Experts)
	}
	if haveShared == 3 {
		l.Shared = &shared
	} else {
		l.Config.SharedInter = 0
		l.SharedGate = nil
	}
	l.Experts = &sourceExperts{ex: ex, hidden: cfg.Hidden, inter: cfg.ExpertInter}
	return l, ex, l.Check()
}

type produced struct {
	data []byte
	te   TensorEntry
	ms   *MatrixStats
}

// runGPTQLayer quantizes one MoE layer's routed experts with the
// calibration driver and writes the layer's expert files as their groups
// complete. Files kept from an earlier run are not rewritten; the driver
// still runs unless every file is kept and the layer's statistics were
// recorded.
func (b *builder) runGPTQLayer(ctx context.Context, layer int, idxs []int, keep func(int) bool, commit func(int, *fileRecord) error) (*LayerStats, error) {
	pending := map[string]int{} // file → job index
	for _, i := range idxs {
		if !keep(i) {
			pending[b.jobs[i].file] = i
		}
	}
	recPath := layerRecordPath(b.opt.Out, layer)
	if len(pending) == 0 {
		if data, err := os.ReadFile(recPath); err == nil {
			var ls LayerStats
			if json.Unmarshal(data, &ls) == nil && ls.Layer == layer {
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
	// One driver run covers the whole layer: each matrix gets the grid of
	// the tensor it is stored in, so a down projection's Hessian always
	// comes from the gate and up projections exactly as they are stored,
	// whatever formats the plan gives them.
	gridOf := func(st *storedTensor) gptq.Grid {
		axis := gptq.InputAxis
		if st.axis == AxisOutput {
			axis = gptq.OutputAxis
		}
		return gptq.NewBFPGrid(st.bfpF, axis)
	}
	jobOf := map[string]*job{}
	for _, i := range pending {
		for _, st := range b.jobs[i].tensors {
			jobOf[st.name] = b.jobs[i]
		}
	}
	done := map[string]*produced{}
	count := map[string]int{}
	g := b.gopt
	lo := calib.LayerOptions{GPTQ: &g, Workers: b.opt.Workers, SkipShared: true,
		Grid: func(expert int, matrix string) (gptq.Grid, error) {
			if expert < 0 || expert >= len(ex) {
				return nil, fmt.Errorf("manifest: layer %d has no routed expert %d", layer, expert)
			}
			if matrix == "down_proj" {
				return gridOf(ex[expert].down), nil
			}
			return gridOf(ex[expert].gu), nil
		}}
	emit := func(r *calib.ExpertResult) error {
		if r.Expert < 0 {
			return nil
		}
		for _, st := range []*storedTensor{ex[r.Expert].gu, ex[r.Expert].down} {
			j := jobOf[st.name]
			if j == nil {
				continue // its file is kept
			}
			p, err := b.produceExpert(st, r)
			if err != nil {
				return fmt.Errorf("tensor %s: %w", st.name, err)
			}
			done[st.name] = p
			count[j.file]++
			if count[j.file] == len(j.tensors) {
				rec, err := b.writeJobWith(ctx, j, func(_ context.Context, st *storedTensor) ([]byte, TensorEntry, *MatrixStats, error) {
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
	rep, err := calib.QuantizeMoELayer(ctx, ml, cal, held, lo, emit)
	if err != nil {
		return nil, err
	}
	ls := &LayerStats{Layer: layer, CalibTokens: int64(rep.Tokens), Starved: rep.Starved}
	if rep.HeldOut != nil {
		ls.HeldOutTokens = int64(rep.HeldOut.Tokens)
		ls.HeldOutMSE = rep.HeldOut.MSE
		ls.HeldOutRTNMSE = rep.HeldOut.RTNMSE
		ls.RefMeanSquare = rep.HeldOut.RefMeanSquare
	}
	if len(ls.Starved) == 0 {
		ls.Starved = nil
	}
	for f := range pending {
		if count[f] != len(b.jobs[pending[f]].tensors) {
			return nil, fmt.Errorf("manifest: layer %d: file %s received %d of its %d tensors", layer, f, count[f], len(b.jobs[pending[f]].tensors))
		}
	}
	if err := writeJSONAtomic(recPath, ls); err != nil {
		return nil, err
	}
	return ls, nil
}

// produceExpert packs one routed expert tensor from the driver's result.
func (b *builder) produceExpert(st *storedTensor, r *calib.ExpertResult) (*produced, error) {
	w, err := sourceFloats(st)
	if err != nil {
		return nil, err
	}
	te := entryOf(st)
	te.Finite = allFinite(w)
	if err := b.checkSourceFinite(st, w, te.Finite); err != nil {
		return nil, err
	}
	if st.method != MethodGPTQ {
		packed, err := packBFP(st.bfpF, st.tile, w, st.shape, st.orient)
		return &produced{data: packed, te: te}, err
	}
	var q []float32
	var mats []calib.MatrixStats
	if TensorRole(st.role) == RoleExpertGateUp {
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
	packed, err := packBFP(st.bfpF, st.tile, q, st.shape, st.orient)
	if err != nil {
		return nil, err
	}
	back, err := unpackBFP(st.bfpF, st.tile, packed, st.shape, st.orient)
	if err != nil {
		return nil, err
	}
	for i := range back {
		if back[i] != q[i] {
			return nil, fmt.Errorf("quantized value %d (%g) is not representable in %s: it packs to %g", i, q[i], st.bfpF, back[i])
		}
	}
	ms := &MatrixStats{Tensor: st.name, Layer: intPtr(st.layer), Expert: intPtr(st.expert), Method: MethodRTN, Tokens: int64(r.Stats.Tokens), Error: sqErr(w, back)}
	var reasons []string
	if r.Stats.Reason != "" {
		reasons = append(reasons, r.Stats.Reason)
	}
	for _, m := range mats {
		if string(m.Method) == MethodGPTQ {
			ms.Method = MethodGPTQ
		}
		ms.Damp = max(ms.Damp, m.Damp)
		ms.ProxyLoss += m.ProxyLoss
		ms.RTNProxyLoss += m.RTNProxyLoss
		if m.Fallback != "" {
			reasons = append(reasons, m.Name+": "+m.Fallback)
		}
	}
	ms.Fallback = strings.Join(reasons, "; ")
	te.Method = ms.Method
	return &produced{data: packed, te: te, ms: ms}, nil
}
