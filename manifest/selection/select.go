package selection

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

// Options say what Select chooses.
type Options struct {
	Sensitivity *Sensitivity
	// Source is the model the sensitivities were measured on (headers
	// are read to size every tensor).
	Source string
	// Base is the plan the sensitivities were measured for; its rules
	// decide every tensor that is not chosen.
	Base *plan.Plan
	// Overrides, when set, pin the matrices its rules match (a unit is
	// pinned whole or not at all); its rules come first in the plan.
	Overrides  *plan.Plan
	Candidates []Candidate
	Budget     Budget
	// Weights multiply each role class's losses (default 1 each).
	Weights Weights
	// CurvePoints is the number of points of the Pareto curve (default 64).
	CurvePoints int
	Family      model.Family
}

// Unit is one choice of the selection: the matrices that share a format.
type Unit struct {
	Name    string     `json:"name"`
	Role    model.Role `json:"role"`
	Layer   int        `json:"layer"`
	Tensors []string   `json:"tensors"`
	// Frequency is the mean share of the calibration tokens the unit's
	// matrices see (1 but for routed experts).
	Frequency float64 `json:"frequency"`
	// Choice is the selected candidate; Pinned says an override set it.
	Choice Candidate `json:"choice"`
	Pinned bool      `json:"pinned,omitempty"`
	Bytes  int64     `json:"bytes"`
	Cost   float64   `json:"cost"`
	// Error is the unit's predicted added error: Σ proxy loss × routing
	// frequency × the role class's weight.
	Error float64 `json:"predicted_error"`

	tensors []*TensorSensitivity
	items   []Item
	cands   []Candidate
}

// Point is a plan's place in the cost/error plane.
type Point struct {
	Name string `json:"name"`
	// Cost is in the budget's unit (bits per weight for a bpw budget).
	Cost           float64 `json:"cost"`
	StoredBytes    int64   `json:"stored_bytes"`
	TokenBytes     float64 `json:"token_bytes"`
	BitsPerWeight  float64 `json:"bits_per_weight"`
	PredictedError float64 `json:"predicted_error"`
}

// FormatBytes sums the stored tensors of one role and format.
type FormatBytes struct {
	Role    model.Role            `json:"role,omitempty"`
	Format  manifest.StoredFormat `json:"format"`
	Tensors int                   `json:"tensors"`
	Bytes   int64                 `json:"bytes"`
}

// Result is the selection: the plan, the choices and the comparison.
type Result struct {
	Plan     *plan.Plan `json:"-"`
	Budget   Budget     `json:"budget"`
	Weights  Weights    `json:"weights,omitempty"`
	Selected Point      `json:"selected"`
	// Smallest and Largest are the all-cheapest and all-costliest plans.
	Smallest Point `json:"smallest"`
	Largest  Point `json:"largest"`
	// Grid is the solver's cost cell (in the budget's unit), Exact whether
	// the answer is optimal; else Bound bounds the rounding:
	// error ≤ OPT(budget − Bound).
	Grid  float64 `json:"grid_cell"`
	Exact bool    `json:"exact"`
	Bound float64 `json:"bound"`
	Units []Unit  `json:"units"`
	Fixed int     `json:"fixed_tensors"`
	// Formats are the selected plan's totals per format, Roles per role
	// and format.
	Formats    []plan.FormatTotal `json:"formats"`
	Roles      []FormatBytes      `json:"roles"`
	References []Point            `json:"references"`
	Curve      []Point            `json:"curve"`
}

// tensorCost is a tensor's share of a budget given its stored bytes.
type costModel struct {
	kind     BudgetKind
	tokens   int64
	sens     map[string]*TensorSensitivity
	elements int64
}

func (cm *costModel) cost(t *plan.PlannedTensor, bytes int64) float64 {
	switch cm.kind {
	case BudgetTokenBytes:
		if t.Role == model.RoleEmbedding && len(t.Shape) > 0 && t.Shape[0] > 0 {
			return float64(bytes) / float64(t.Shape[0])
		}
		if t.Role.IsExpert() {
			if s := cm.sens[t.Name]; s != nil && s.Tokens > 0 {
				return float64(bytes) * s.Frequency(cm.tokens)
			}
		}
		return float64(bytes)
	case BudgetBPW:
		return 8 * float64(bytes) / float64(cm.elements)
	}
	return float64(bytes)
}

// unitName names the unit of a matrix: an expert group's kind in a layer,
// or the matrix itself.
func unitName(t *TensorSensitivity) string {
	if t.Role.IsExpert() {
		prefix, _, _ := strings.Cut(t.Name, ".experts.")
		return fmt.Sprintf("%s.experts.g%d.%s", prefix, t.ExpertGroup, t.ExpertKind)
	}
	return t.Name
}

// selector is what Select and CheckBudget share: the model, the units and
// their priced choices, the all-smallest and all-largest plans.
type selector struct {
	opt        Options
	base, over *plan.Plan
	m          *safetensors.Model
	ropt       plan.ResolveOptions
	cm         *costModel
	fixedRes   *plan.Resolved
	units      []Unit
	ch         *choices
	unit       float64 // the exact grid cell, 0 when none
	lowest     []int
	highest    []int
	res        *Result
}

// newSelector prices every choice and refuses a budget outside the
// achievable range; the caller closes s.m.
func newSelector(opt Options) (*selector, error) {
	base, over, err := opt.check()
	if err != nil {
		return nil, err
	}
	m, err := safetensors.OpenModel(opt.Source)
	if err != nil {
		return nil, err
	}
	sel := &selector{opt: opt, base: base, over: over, m: m}
	if err := sel.price(); err != nil {
		m.Close()
		return nil, err
	}
	return sel, nil
}

func (sel *selector) price() error {
	opt, s, base, over, m := sel.opt, sel.opt.Sensitivity, sel.base, sel.over, sel.m
	cfg, err := plan.ConfigBeside(m, opt.Family) // once, for every plan resolved below
	if err != nil {
		return err
	}
	sel.ropt = plan.ResolveOptions{ExpertsPerFile: s.ExpertsPerFile, Family: opt.Family, Config: cfg}
	// Everything not chosen: the overrides, then the base plan.
	fixedPlan := &plan.Plan{Name: base.Name, Rules: append(overRules(over), base.Rules...)}
	if sel.fixedRes, err = fixedPlan.ResolveWith(m, sel.ropt); err != nil {
		return err
	}
	cm := &costModel{kind: opt.Budget.Kind, tokens: s.Calibration.Tokens, sens: map[string]*TensorSensitivity{}}
	for i := range s.Tensors {
		cm.sens[s.Tensors[i].Name] = &s.Tensors[i]
	}
	for _, t := range sel.fixedRes.Tensors {
		cm.elements += t.Elements()
	}
	sel.cm = cm
	if sel.units, err = buildUnits(s, over, sel.fixedRes, opt.Candidates, opt.Weights); err != nil {
		return err
	}
	if sel.ch, err = choicesOf(sel.units, sel.fixedRes, cm, s, opt.Weights); err != nil {
		return err
	}
	// Stored sizes of BFP tiles and 16-bit matrices are multiples of 64
	// bytes: the grid of 64-byte cells is exact when the budget fits it.
	if sel.ch.whole64 && opt.Budget.Kind == BudgetBytes {
		sel.unit = 64
	} else if sel.ch.whole64 && opt.Budget.Kind == BudgetBPW {
		sel.unit = 8 * 64 / float64(cm.elements)
	}
	// The all-smallest and all-largest plans bound the budget.
	sel.lowest, sel.highest = extremes(sel.ch.groups)
	sel.res = &Result{Budget: opt.Budget, Weights: opt.Weights}
	if sel.res.Smallest, _, _, err = sel.point("smallest", sel.lowest); err != nil {
		return err
	}
	if sel.res.Largest, _, _, err = sel.point("largest", sel.highest); err != nil {
		return err
	}
	r := sel.res
	if opt.Budget.Value < r.Smallest.Cost-1e-9 || opt.Budget.Value > r.Largest.Cost+1e-9 {
		return &BudgetError{Budget: opt.Budget, Smallest: r.Smallest.Cost, Largest: r.Largest.Cost,
			SmallestB: float64(r.Smallest.StoredBytes), LargestB: float64(r.Largest.StoredBytes)}
	}
	return nil
}

// point prices the plan of a choice per free unit.
func (sel *selector) point(name string, choice []int) (Point, *plan.Plan, *plan.Resolved, error) {
	p := selectedPlan(sel.base, sel.over, sel.ch.freeUnits, choice, name)
	pt, r, err := pointOf(p, sel.m, sel.ropt, sel.cm, sel.opt.Sensitivity, sel.opt.Weights)
	pt.Name = name
	return pt, p, r, err
}

// CheckBudget refuses a budget outside the achievable range (and every
// other input Select refuses) without solving: a sensitivity from Prepare,
// with sizes only, is enough for a byte or bits-per-weight budget.
func CheckBudget(opt Options) error {
	sel, err := newSelector(opt)
	if err != nil {
		return err
	}
	return sel.m.Close()
}

// Select solves the knapsack for opt.Budget and returns the plan.
func Select(opt Options) (*Result, error) {
	if opt.Sensitivity != nil && opt.Sensitivity.sizesOnly {
		return nil, errors.New("selection: the sensitivity holds sizes only (Prepare): measure it first")
	}
	sel, err := newSelector(opt)
	if err != nil {
		return nil, err
	}
	defer sel.m.Close()
	s, res, ch := opt.Sensitivity, sel.res, sel.ch
	sol, err := Solve(ch.groups, opt.Budget.Value-ch.fixedCost, sel.unit)
	if err != nil {
		return nil, err
	}
	res.Grid, res.Exact, res.Bound = sol.Cell, sol.Exact, sol.Bound
	var fin *plan.Resolved
	res.Selected, res.Plan, fin, err = sel.point("selected", sol.Choice)
	if err != nil {
		return nil, err
	}
	if res.Selected.Cost > opt.Budget.Value*(1+1e-12) {
		return nil, fmt.Errorf("selection: the selected plan costs %v, above the budget %v (internal error)", res.Selected.Cost, opt.Budget.Value)
	}
	if d := math.Abs(res.Selected.PredictedError - (sol.Loss + ch.fixedErr)); d > 1e-9*max(1, sol.Loss) {
		return nil, fmt.Errorf("selection: the selected plan's error %v differs from the solver's %v (internal error)", res.Selected.PredictedError, sol.Loss+ch.fixedErr)
	}
	recordChoice(ch.freeUnits, sol.Choice)
	res.Units = sel.units
	res.Fixed = len(sel.fixedRes.Tensors) - len(ch.free)
	res.Formats, res.Roles = fin.Totals, roleTotals(fin)
	if res.References, err = references(opt, ch.freeUnits, sel.lowest, func(name string, choice []int) (Point, error) {
		pt, _, _, err := sel.point(name, choice)
		return pt, err
	}, func(p *plan.Plan) (Point, error) {
		pt, _, err := pointOf(p, sel.m, sel.ropt, sel.cm, s, opt.Weights)
		return pt, err
	}); err != nil {
		return nil, err
	}
	if res.Curve, err = curve(ch.groups, sel.unit, opt.CurvePoints, ch.fixedCost, ch.fixedErr); err != nil {
		return nil, err
	}
	return res, nil
}

func overRules(p *plan.Plan) []plan.Rule {
	if p == nil {
		return nil
	}
	return p.Rules
}

func containsFormat(fs []manifest.StoredFormat, f manifest.StoredFormat) bool {
	for _, x := range fs {
		if x == f {
			return true
		}
	}
	return false
}

func indexOf(cs []Candidate, c Candidate) int {
	for i, x := range cs {
		if x == c {
			return i
		}
	}
	return -1
}

// buildUnits groups the selectable matrices (measured, outside the MTP
// layer) into units and applies the overrides: a unit whose matrices an
// override matches is pinned to that rule's precision; one it matches in
// part, or with two precisions, is an error.
func buildUnits(s *Sensitivity, over *plan.Plan, fixedRes *plan.Resolved, cands []Candidate, w Weights) ([]Unit, error) {
	var units []Unit
	idx := map[string]int{}
	for i := range s.Tensors {
		t := &s.Tensors[i]
		if t.Unmeasured != "" || t.MTP {
			continue
		}
		name := unitName(t)
		k, ok := idx[name]
		if !ok {
			k = len(units)
			idx[name] = k
			units = append(units, Unit{Name: name, Role: t.Role, Layer: t.Layer})
		}
		units[k].tensors = append(units[k].tensors, t)
		units[k].Tensors = append(units[k].Tensors, t.Name)
	}
	for i := range units {
		u := &units[i]
		f := 0.0
		for _, t := range u.tensors {
			f += t.Frequency(s.Calibration.Tokens)
		}
		u.Frequency = f / float64(len(u.tensors))
		// Candidates by cost, cheapest first (ties: as listed).
		u.cands = append([]Candidate(nil), cands...)
		sort.SliceStable(u.cands, func(a, b int) bool {
			return u.tensors[0].Bytes[u.cands[a].Format] < u.tensors[0].Bytes[u.cands[b].Format]
		})
		if over == nil {
			continue
		}
		matched, rule := 0, -1
		var pin Candidate
		for _, t := range u.tensors {
			r := over.Match(t.Name)
			if r < 0 {
				continue
			}
			matched++
			pt, _ := fixedRes.Lookup(t.Name)
			c := Candidate{pt.Format, pt.Method}
			if pt.Format != manifest.StoreAsIs && pt.Format.Lossless(pt.SourceDType) {
				c = Candidate{manifest.StoreAsIs, manifest.MethodNone}
			}
			if rule >= 0 && c != pin {
				return nil, fmt.Errorf("selection: overrides give the matrices of unit %s two precisions (%s by rule %d, %s by rule %d); they must share one format", u.Name, pin, rule+1, c, r+1)
			}
			rule, pin = r, c
		}
		if matched == 0 {
			continue
		}
		if matched < len(u.tensors) {
			return nil, fmt.Errorf("selection: override rule %d (pattern %q) matches %d of the %d matrices of unit %s, which must share one format (an expert group's file)", rule+1, over.Rules[rule].Pattern, matched, len(u.tensors), u.Name)
		}
		u.Pinned, u.Choice = true, pin
		for _, t := range u.tensors {
			pt, _ := fixedRes.Lookup(t.Name)
			u.Bytes += pt.StoredBytes
			l, ok := t.WeightedLoss(pin, s.Calibration.Tokens)
			if !ok {
				if !pt.Format.Lossless(pt.SourceDType) {
					return nil, fmt.Errorf("selection: override rule %d pins unit %s to %s, which was not measured (measured: %v)", rule+1, u.Name, pin, s.Measured)
				}
				l = 0
			}
			u.Error += l * w.Of(t.Role, t.Layer)
		}
	}
	if len(units) == 0 {
		return nil, errors.New("selection: no selectable matrix (every quantized matrix lacks calibration inputs or is in the MTP layer)")
	}
	return units, nil
}

// selectedPlan is the plan of a choice: the overrides, one rule per free
// unit, the base plan.
func selectedPlan(base, over *plan.Plan, units []*Unit, choice []int, name string) *plan.Plan {
	p := &plan.Plan{Name: base.Name + "-" + name, Description: "precision selected per matrix under a budget from " + base.Name}
	p.Rules = append(p.Rules, overRules(over)...)
	for k, u := range units {
		c := u.cands[choice[k]]
		r := plan.Rule{Pattern: unitPattern(u.Tensors), Format: c.Format, Method: c.Method, Note: "selected: " + u.Name}
		if c.Format.IsBFP() {
			if br := base.Match(u.Tensors[0]); br >= 0 && base.Rules[br].Format.IsBFP() {
				r.Axis, r.Tile = base.Rules[br].Axis, base.Rules[br].Tile
			}
		}
		p.Rules = append(p.Rules, r)
	}
	p.Rules = append(p.Rules, base.Rules...)
	return p
}

// unitPattern is a glob matching exactly the names (none holds a glob
// metacharacter: stored names are dotted identifiers).
func unitPattern(names []string) string {
	if len(names) == 1 {
		return names[0]
	}
	return "{" + strings.Join(names, ",") + "}"
}

// pointOf resolves p and returns its cost, sizes and predicted error (the
// selectable matrices' weighted losses; an error when p puts one of them
// in a precision that was not measured).
func pointOf(p *plan.Plan, m *safetensors.Model, ropt plan.ResolveOptions, cm *costModel, s *Sensitivity, w Weights) (Point, *plan.Resolved, error) {
	r, err := p.ResolveWith(m, ropt)
	if err != nil {
		return Point{}, nil, err
	}
	pt := Point{Name: p.Name}
	tokCM := *cm
	tokCM.kind = BudgetTokenBytes
	var elements int64
	for i := range r.Tensors {
		t := &r.Tensors[i]
		pt.Cost += cm.cost(t, t.StoredBytes)
		pt.TokenBytes += tokCM.cost(t, t.StoredBytes)
		pt.StoredBytes += t.StoredBytes
		elements += t.Elements()
		ts := cm.sens[t.Name]
		if ts == nil || ts.Unmeasured != "" || ts.MTP {
			continue
		}
		c := Candidate{t.Format, t.Method}
		if !t.Format.IsBFP() {
			if !t.Format.Lossless(t.SourceDType) {
				return Point{}, nil, fmt.Errorf("selection: plan %s stores %s as %s, which has no measured error", p.Name, t.Name, t.Format)
			}
			continue
		}
		l, ok := ts.WeightedLoss(c, s.Calibration.Tokens)
		if !ok && !s.sizesOnly {
			return Point{}, nil, fmt.Errorf("selection: plan %s stores %s as %s, which was not measured", p.Name, t.Name, c)
		}
		pt.PredictedError += l * w.Of(t.Role, t.Layer)
	}
	if elements > 0 {
		pt.BitsPerWeight = 8 * float64(pt.StoredBytes) / float64(elements)
	}
	return pt, r, nil
}

// roleTotals sums a resolved plan's tensors per role and format.
func roleTotals(r *plan.Resolved) []FormatBytes {
	rk := map[string]*FormatBytes{}
	for _, t := range r.Tensors {
		key := string(t.Role) + "\x00" + string(t.Format)
		g := rk[key]
		if g == nil {
			g = &FormatBytes{Role: t.Role, Format: t.Format}
			rk[key] = g
		}
		g.Tensors++
		g.Bytes += t.StoredBytes
	}
	var roles []FormatBytes
	for _, v := range rk {
		roles = append(roles, *v)
	}
	sort.Slice(roles, func(i, j int) bool {
		if roles[i].Role != roles[j].Role {
			return roles[i].Role < roles[j].Role
		}
		return roles[i].Format < roles[j].Format
	})
	return roles
}

// WriteSVG draws the Pareto curve of cost against predicted error with the
// selected plan and the references.
func (r *Result) WriteSVG(w io.Writer) error {
	ylabel := "predicted error (Σ proxy loss × routing share)"
	if len(r.Weights) > 0 {
		ylabel = "predicted KL (Σ proxy loss × share × class weight)"
	}
	c := eval.XYChart{Title: "precision selection: " + r.Budget.String(), XLabel: costLabel(r.Budget.Kind),
		YLabel: ylabel, CurveName: "best plan per budget"}
	for _, p := range r.Curve {
		c.CurveX, c.CurveY = append(c.CurveX, p.Cost/xScale(r.Budget.Kind)), append(c.CurveY, p.PredictedError)
	}
	for _, p := range append([]Point{r.Selected}, r.References...) {
		c.Points = append(c.Points, eval.XYPoint{Label: p.Name, X: p.Cost / xScale(r.Budget.Kind), Y: p.PredictedError})
	}
	return eval.WriteXYSVG(w, c)
}

func costLabel(k BudgetKind) string {
	switch k {
	case BudgetBPW:
		return "bits per weight"
	case BudgetTokenBytes:
		return "MB read per token"
	}
	return "stored MB"
}

func xScale(k BudgetKind) float64 {
	if k == BudgetBPW {
		return 1
	}
	return 1e6
}

// check refuses options Select cannot run with, and returns the base plan
// and the overrides validated.
func (opt Options) check() (base, over *plan.Plan, err error) {
	s := opt.Sensitivity
	if s == nil || opt.Base == nil {
		return nil, nil, errors.New("selection: no sensitivity or base plan")
	}
	if len(opt.Candidates) == 0 {
		return nil, nil, errors.New("selection: no candidate")
	}
	if opt.Budget.Value <= 0 || math.IsNaN(opt.Budget.Value) || math.IsInf(opt.Budget.Value, 0) {
		return nil, nil, fmt.Errorf("selection: budget %v", opt.Budget.Value)
	}
	for _, c := range opt.Candidates {
		if c.Format.IsBFP() && !containsFormat(s.Measured, c.Format) {
			return nil, nil, fmt.Errorf("selection: candidate %s was not measured (the sensitivity file measured %v): measure it first", c, s.Measured)
		}
	}
	base, err = opt.Base.Validate()
	if err != nil {
		return nil, nil, err
	}
	if opt.Overrides != nil {
		if over, err = opt.Overrides.Validate(); err != nil {
			return nil, nil, fmt.Errorf("selection: overrides: %w", err)
		}
	}
	return base, over, nil
}

// references are the plans the selection is compared with: the uniform
// plans over the candidates (the lowest-cost choice where a unit lacks
// one), attention BFP8 with the MLP in BFP4 when both are candidates, and
// the presets that apply to the model. mkPoint prices a choice per free
// unit, point a whole plan.
func references(opt Options, freeUnits []*Unit, lowest []int, mkPoint func(string, []int) (Point, error), point func(*plan.Plan) (Point, error)) ([]Point, error) {
	var refs []Point
	// References: the uniform plans over the candidates, the presets, and
	// attention BFP8 with the MLP in BFP4 when both are candidates.
	for _, c := range opt.Candidates {
		ch := make([]int, len(freeUnits))
		for u, fu := range freeUnits {
			ch[u] = indexOf(fu.cands, c)
			if ch[u] < 0 {
				ch[u] = lowest[u]
			}
		}
		pt, err := mkPoint("all "+c.String(), ch)
		if err != nil {
			return nil, err
		}
		refs = append(refs, pt)
	}
	mlp4, rest8 := Candidate{manifest.StoreBFP4, manifest.MethodGPTQ}, Candidate{manifest.StoreBFP8, manifest.MethodRTN}
	if indexOf(opt.Candidates, mlp4) >= 0 && indexOf(opt.Candidates, rest8) >= 0 {
		ch := make([]int, len(freeUnits))
		for u, fu := range freeUnits {
			if fu.Role.IsExpert() || fu.Role.IsMLPMatrix() {
				ch[u] = indexOf(fu.cands, mlp4)
			} else {
				ch[u] = indexOf(fu.cands, rest8)
			}
		}
		pt, err := mkPoint("MLP BFP4_b:gptq, rest BFP8_b:rtn", ch)
		if err != nil {
			return nil, err
		}
		refs = append(refs, pt)
	}
	for _, name := range plan.PresetNames() {
		p, _ := plan.Preset(name)
		pt, err := point(p)
		if err != nil {
			continue // a preset that does not apply to this model, or a precision not measured
		}
		pt.Name = "preset " + name
		refs = append(refs, pt)
	}
	return refs, nil
}

// choices are the free units' items for the solver, and what the pinned
// and unchosen matrices cost and add to the error.
type choices struct {
	free                map[string]bool
	groups              [][]Item
	freeUnits           []*Unit
	whole64             bool // every choice's bytes a multiple of 64
	fixedCost, fixedErr float64
}

// choicesOf prices every candidate of every unit the overrides leave free.
func choicesOf(units []Unit, fixedRes *plan.Resolved, cm *costModel, s *Sensitivity, w Weights) (*choices, error) {
	free := map[string]bool{}
	whole64 := true // every choice's bytes a multiple of 64
	var groups [][]Item
	var freeUnits []*Unit
	for i := range units {
		u := &units[i]
		if u.Pinned {
			continue
		}
		for _, t := range u.tensors {
			free[t.Name] = true
		}
		for _, c := range u.cands {
			it := Item{}
			var bytes int64
			for _, t := range u.tensors {
				bytes += t.Bytes[c.Format]
				pt, _ := fixedRes.Lookup(t.Name)
				it.Cost += cm.cost(pt, t.Bytes[c.Format])
				l, _ := t.WeightedLoss(c, s.Calibration.Tokens)
				it.Loss += l * w.Of(t.Role, t.Layer)
			}
			whole64 = whole64 && bytes%64 == 0
			u.items = append(u.items, it)
		}
		groups = append(groups, u.items)
		freeUnits = append(freeUnits, u)
	}
	if len(groups) == 0 {
		return nil, errors.New("selection: every selectable matrix is pinned by the overrides: nothing to choose")
	}
	fixedCost, fixedErr := 0.0, 0.0
	for i := range fixedRes.Tensors {
		t := &fixedRes.Tensors[i]
		if !free[t.Name] {
			fixedCost += cm.cost(t, t.StoredBytes)
		}
	}
	for _, u := range units {
		if u.Pinned {
			fixedErr += u.Error
		}
	}
	return &choices{free: free, groups: groups, freeUnits: freeUnits, whole64: whole64, fixedCost: fixedCost, fixedErr: fixedErr}, nil
}

// extremes returns, per group, the index of its cheapest and of its
// costliest item (the first one on ties).
func extremes(groups [][]Item) (lowest, highest []int) {
	pick := func(better func(a, b Item) bool) []int {
		ch := make([]int, len(groups))
		for u, g := range groups {
			for k := range g {
				if better(g[k], g[ch[u]]) {
					ch[u] = k
				}
			}
		}
		return ch
	}
	return pick(func(a, b Item) bool { return a.Cost < b.Cost }), pick(func(a, b Item) bool { return a.Cost > b.Cost })
}

// recordChoice sets each free unit's chosen candidate, cost, error and
// bytes from the solver's choice.
func recordChoice(freeUnits []*Unit, choice []int) {
	for k, u := range freeUnits {
		c := u.cands[choice[k]]
		u.Choice = c
		u.Cost = u.items[choice[k]].Cost
		u.Error = u.items[choice[k]].Loss
		u.Bytes = 0
		for _, t := range u.tensors {
			u.Bytes += t.Bytes[c.Format]
		}
	}
}

// curve is the Pareto frontier of the free units' choices in n points (0:
// 64), with the fixed matrices' cost and error added.
func curve(groups [][]Item, unit float64, n int, fixedCost, fixedErr float64) ([]Point, error) {
	if n <= 0 {
		n = 64
	}
	front, err := Frontier(groups, unit, n)
	if err != nil {
		return nil, err
	}
	var pts []Point
	for _, f := range front {
		pts = append(pts, Point{Cost: f.Cost + fixedCost, PredictedError: f.Loss + fixedErr})
	}
	return pts, nil
}
