package selection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/emulator/eval/harness"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
	"github.com/ttquant/ttquant/manifest"
)

// Weight measurement modes: one factor per role class, or per role class
// in each layer.
const (
	WeightsPerClass      = "class"
	WeightsPerClassLayer = "class_layer"
)

// Default held-out text of a weight measurement: 16 windows of 512
// tokens of the calibration text's evaluation split.
const (
	DefaultWeightSequences = 16
	DefaultWeightSeqLen    = 512
)

// WeightMeasure says how Measure measures the weights (KL per unit of
// proxy loss) after the store builds.
type WeightMeasure struct {
	// Mode is WeightsPerClass or WeightsPerClassLayer.
	Mode string
	// Sequences and SeqLen shape the held-out text (pack mode): windows of
	// the records the calibration store's split held out.
	Sequences, SeqLen int
	// Progress receives one line per step and per scored window.
	Progress func(msg string)
}

// Validate checks the options.
func (w *WeightMeasure) Validate() error {
	if w.Mode != WeightsPerClass && w.Mode != WeightsPerClassLayer {
		return fmt.Errorf("selection: weight measurement mode %q (want %s or %s)", w.Mode, WeightsPerClass, WeightsPerClassLayer)
	}
	if w.Sequences < 2 || w.SeqLen < 2 {
		return fmt.Errorf("selection: weight measurement on %d sequences of %d tokens (want at least 2 of 2: the standard error needs two windows)", w.Sequences, w.SeqLen)
	}
	return nil
}

func (w *WeightMeasure) log(format string, args ...any) {
	if w.Progress != nil {
		w.Progress(fmt.Sprintf(format, args...))
	}
}

// KLWeights are measured weights: for each key (a class, or CLASS@LAYER)
// the mean KL on held-out calibration text of the source model with that
// class's selectable matrices (in that layer) moved alone from the source
// precision to Candidate, over the change's predicted error at weight 1
// (Σ proxy loss × routing share): the KL in nats per unit of proxy loss.
type KLWeights struct {
	Mode      string `json:"mode"`
	Candidate string `json:"candidate"`
	// Sequences × SeqLen tokens of the records the calibration text's
	// split held out (pack mode), TokenIDsSHA256 their token ids, Scored
	// the positions scored.
	Sequences      int        `json:"sequences"`
	SeqLen         int        `json:"seq_len"`
	TokenIDsSHA256 string     `json:"token_ids_sha256"`
	Scored         int64      `json:"scored_tokens"`
	Changes        []KLChange `json:"changes"`
}

// KLChange is one single-change evaluation.
type KLChange struct {
	Key     string `json:"key"`
	Tensors int    `json:"tensors"`
	// Loss is the change's predicted error at weight 1.
	Loss   float64 `json:"loss"`
	KL     float64 `json:"mean_kl"`
	KLSE   float64 `json:"mean_kl_se"`
	Weight float64 `json:"weight"`
}

// Weights returns the measured weights by key.
func (k *KLWeights) Weights() Weights {
	w := Weights{}
	for _, c := range k.Changes {
		w[c.Key] = c.Weight
	}
	return w
}

// Matches reports whether k was measured as w asks.
func (k *KLWeights) Matches(w *WeightMeasure) bool {
	return k != nil && k.Mode == w.Mode && k.Sequences == w.Sequences && k.SeqLen == w.SeqLen
}

// changeFormat is the format a weight measurement moves matrices to:
// BFP4_b when measured, else the narrowest measured format.
func changeFormat(measured []manifest.StoredFormat) (manifest.StoredFormat, error) {
	if len(measured) == 0 {
		return "", errors.New("selection: no measured format to measure weights with")
	}
	if containsFormat(measured, manifest.StoreBFP4) {
		return manifest.StoreBFP4, nil
	}
	return measured[0], nil
}

// heldOutText builds the evaluation split of the calibration text as
// sequences × seqLen tokens in pack mode: of opt.Data with its split
// options, or of the text the calibration store was made from (its
// recorded spec, split options and file sha256s).
func heldOutText(opt MeasureOptions, tok *tokenizer.Tokenizer, sequences, seqLen int) (*dataset.Set, error) {
	spec, dopt, where := opt.Data, opt.DataOptions, "the calibration text"
	var prov dataset.Provenance
	if spec == nil {
		storeDir := opt.Calib
		st, err := calib.OpenStore(storeDir)
		if err != nil {
			return nil, err
		}
		raw := st.Provenance().Data
		if len(raw) == 0 {
			return nil, fmt.Errorf("selection: calibration store %s records no calibration text (synthetic or made without a data spec): the weights need held-out text of it", storeDir)
		}
		if err := json.Unmarshal(raw, &prov); err != nil {
			return nil, fmt.Errorf("selection: calibration store %s: its recorded data provenance: %w", storeDir, err)
		}
		if prov.Spec == "" {
			return nil, fmt.Errorf("selection: calibration store %s does not record the spec of its calibration text", storeDir)
		}
		if spec, err = dataset.ParseSpec(prov.Spec); err != nil {
			return nil, fmt.Errorf("selection: calibration store %s: its recorded data spec: %w", storeDir, err)
		}
		dopt, where = prov.Options, fmt.Sprintf("the calibration text %s of store %s", prov.Spec, storeDir)
	}
	dopt.Calibration = dataset.SetOptions{}
	dopt.Evaluation = dataset.SetOptions{Sequences: sequences, SeqLen: seqLen, Mode: dataset.ModePack}
	dopt.Progress = nil
	res, err := dataset.Build(spec, tok, dopt)
	if err != nil {
		return nil, fmt.Errorf("selection: the held-out part of %s: %w", where, err)
	}
	if opt.Data != nil {
		return res.Evaluation, nil
	}
	// The text must be the one the store was made from.
	want, got := map[string]bool{}, map[string]bool{}
	for _, s := range prov.Sources {
		for _, f := range s.Files {
			want[f.SHA256] = true
		}
	}
	for _, s := range res.Provenance.Sources {
		for _, f := range s.Files {
			got[f.SHA256] = true
		}
	}
	for h := range want {
		if !got[h] {
			return nil, fmt.Errorf("selection: %w: %s has changed since the store was made from it (a file of sha256 %.16s… is gone)", ErrMismatch, where, h)
		}
	}
	if len(got) != len(want) || res.Provenance.Tokenizer.SHA256 != prov.Tokenizer.SHA256 {
		return nil, fmt.Errorf("selection: %w: %s or the tokenizer differs from what the store was made from", ErrMismatch, where)
	}
	return res.Evaluation, nil
}

// heldOut is the text the weights are measured on, made before the
// measurement builds so that missing or changed text refuses the run
// before any long work.
type heldOut struct {
	set     *dataset.Set
	windows []eval.Window
	labels  []string
	layers  int // the model's trunk layers
}

func prepareHeldOut(opt MeasureOptions) (*heldOut, error) {
	w := opt.Weights
	cfg, err := model.ReadConfig(opt.Source)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.Load(opt.Source)
	if err != nil {
		return nil, err
	}
	set, err := heldOutText(opt, tok, w.Sequences, w.SeqLen)
	if err != nil {
		return nil, err
	}
	windows, labels, _, err := harness.Windows(set, w.SeqLen, cfg)
	if err != nil {
		return nil, err
	}
	return &heldOut{set: set, windows: windows, labels: labels, layers: cfg.Layers}, nil
}

// idsSHA256 is the hash of the held-out text's token ids.
func (h *heldOut) idsSHA256() string { return dataset.HashTokenIDs(h.set.IDs()) }

// changeGroup is one single change of a weight measurement: the
// selectable matrices of one key (a class, or CLASS@LAYER), their layers
// and their summed predicted error at weight 1.
type changeGroup struct {
	key     string
	layers  map[int]bool
	tensors map[string]bool
	loss    float64
}

// firstLayer is the first layer the change touches: its run starts there.
func (g *changeGroup) firstLayer() int {
	first := -1
	for l := range g.layers {
		if first < 0 || l < first {
			first = l
		}
	}
	return first
}

// changeGroups lists the single changes of a weight measurement in mode
// to candidate cand, by key.
func changeGroups(s *Sensitivity, mode string, cand Candidate) ([]*changeGroup, error) {
	var groups []*changeGroup
	byKey := map[string]*changeGroup{}
	for i := range s.Tensors {
		t := &s.Tensors[i]
		if t.Unmeasured != "" || t.MTP {
			continue
		}
		key := RoleClass(t.Role)
		if mode == WeightsPerClassLayer {
			key += "@" + strconv.Itoa(t.Layer)
		}
		g := byKey[key]
		if g == nil {
			g = &changeGroup{key: key, layers: map[int]bool{}, tensors: map[string]bool{}}
			byKey[key] = g
			groups = append(groups, g)
		}
		l, ok := t.WeightedLoss(cand, s.Calibration.Tokens)
		if !ok {
			return nil, fmt.Errorf("selection: %s has no measured loss in %s", t.Name, cand)
		}
		g.loss += l
		g.tensors[t.Name] = true
		g.layers[t.Layer] = true
	}
	if len(groups) == 0 {
		return nil, errors.New("selection: no selectable matrix to measure weights on")
	}
	sort.SliceStable(groups, func(a, b int) bool { return groups[a].key < groups[b].key })
	return groups, nil
}

// changeResult is what one single-change evaluation found: the mean KL
// over the held-out positions and its standard error.
type changeResult struct {
	Key  string  `json:"key"`
	KL   float64 `json:"mean_kl"`
	KLSE float64 `json:"mean_kl_se"`
}

// evaluateChanges scores the changes of groups on the held-out windows
// against the measurement build in ckptDir and returns their results, in
// order, and the positions scored.
func evaluateChanges(ctx context.Context, opt MeasureOptions, ho *heldOut, ckptDir string, cand Candidate, groups []*changeGroup) ([]changeResult, int64, error) {
	w := opt.Weights
	ref, err := forward.Open(opt.Source)
	if err != nil {
		return nil, 0, err
	}
	defer ref.Close()
	ref.Resident = true
	changes := make([]harness.Change, len(groups))
	for i, g := range groups {
		ns, err := harness.OpenNativeOnly(ckptDir, func(name string) bool { return g.tensors[name] })
		if err != nil {
			return nil, 0, err
		}
		var layers []int
		for l := range g.layers {
			layers = append(layers, l)
		}
		sort.Ints(layers)
		changes[i] = harness.Change{Label: g.key, Layers: layers, Src: ns}
	}
	w.log("weights: %d single changes to %s on %d windows of %d held-out calibration tokens", len(changes), cand, len(ho.windows), w.SeqLen)
	rows, err := harness.EvaluateChanges(ctx, ref, changes, ho.windows, ho.labels, harness.ChangeOptions{Workers: opt.Workers,
		Progress: func(p eval.Progress) {
			eta, _ := p.ETA()
			w.log("weights: window %d/%d (%s elapsed, %s to go)", p.WindowsDone, p.Windows, p.Elapsed.Round(1e8), eta.Round(1e8))
		}})
	if err != nil {
		return nil, 0, fmt.Errorf("selection: measuring the weights: %w", err)
	}
	out := make([]changeResult, len(groups))
	for i, g := range groups {
		out[i] = changeResult{Key: g.key, KL: rows[i].MeanKL, KLSE: rows[i].MeanKLSE}
	}
	return out, rows[0].Tokens, nil
}

// klWeights are the weights of the changes of groups from their results
// (by key), on held-out text whose token ids hash to idsSHA256, of which
// scored positions were scored.
func klWeights(w *WeightMeasure, cand Candidate, idsSHA256 string, scored int64, groups []*changeGroup, results map[string]changeResult) *KLWeights {
	kw := &KLWeights{Mode: w.Mode, Candidate: cand.String(), Sequences: w.Sequences, SeqLen: w.SeqLen,
		TokenIDsSHA256: idsSHA256, Scored: scored}
	for _, g := range groups {
		r := results[g.key]
		c := KLChange{Key: g.key, Tensors: len(g.tensors), Loss: g.loss, KL: r.KL, KLSE: r.KLSE}
		if g.loss > 0 {
			c.Weight = r.KL / g.loss
		}
		kw.Changes = append(kw.Changes, c)
	}
	return kw
}

// measureWeights runs the single-change evaluations of opt.Weights on
// the held-out windows against the measurement build of the change format
// f (changeFormat) in ckptDir.
func measureWeights(ctx context.Context, s *Sensitivity, opt MeasureOptions, ho *heldOut, f manifest.StoredFormat, ckptDir string) (*KLWeights, error) {
	cand := Candidate{f, manifest.MethodGPTQ}
	groups, err := changeGroups(s, opt.Weights.Mode, cand)
	if err != nil {
		return nil, err
	}
	res, scored, err := evaluateChanges(ctx, opt, ho, ckptDir, cand, groups)
	if err != nil {
		return nil, err
	}
	byKey := map[string]changeResult{}
	for _, r := range res {
		byKey[r.Key] = r
	}
	return klWeights(opt.Weights, cand, ho.idsSHA256(), scored, groups, byKey), nil
}
