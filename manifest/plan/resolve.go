package plan

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/safetensors"
)

// SourceSlice is a contiguous byte range of one source tensor.
type SourceSlice struct {
	Tensor string `json:"tensor"`
	// Expert is the index along dimension 0 of a fused expert tensor, or -1
	// when the slice is the whole tensor.
	Expert int   `json:"expert"`
	Offset int64 `json:"offset"` // byte offset within the tensor's data
	Bytes  int64 `json:"bytes"`
}

// PlannedTensor is one tensor of the planned native checkpoint.
//
// Routed experts are always planned per expert with canonical names,
// whatever the source layout: `<block>experts.<e>.gate_up_proj` ([2I, H],
// gate rows then up rows) and `<block>experts.<e>.down_proj` ([H, I]), where
// <block> is the layer's "….mlp." prefix. A fused source contributes one
// slice of its 3-D tensor; a per-expert source contributes its gate_proj and
// up_proj tensors, concatenated along rows. Every other tensor keeps its
// source name and is its own single source.
type PlannedTensor struct {
	Name string     `json:"name"`
	Role model.Role `json:"role"`
	// Source is the first source tensor; Sources lists every slice, whose
	// bytes concatenated (in the source dtype) give the logical tensor.
	Source  string        `json:"source"`
	Sources []SourceSlice `json:"sources"`
	// Expert is the routed expert index, or -1.
	Expert int `json:"expert"`
	// ExpertKind is "gate_up" or "down" for routed experts, else "".
	ExpertKind string `json:"expert_kind,omitempty"`
	// ExpertGroup is Expert / ExpertsPerFile, or -1.
	ExpertGroup int `json:"expert_group"`
	// Layer is the decoder layer (trunk layer i → i, MTP layer k →
	// NumLayers+k), or -1 outside layers.
	Layer int  `json:"layer"`
	MTP   bool `json:"mtp,omitempty"`

	RuleIndex int                   `json:"rule"` // index into Plan.Rules (0-based)
	Format    manifest.StoredFormat `json:"format"`
	Method    manifest.Method       `json:"method"`
	Axis      bfp.Axis              `json:"axis,omitempty"`
	Tile      string                `json:"tile,omitempty"`

	SourceDType string `json:"source_dtype"`
	// StoredDType is the element dtype of a non-BFP stored tensor ("" for BFP).
	StoredDType string  `json:"stored_dtype,omitempty"`
	Shape       []int64 `json:"shape"` // logical shape of the stored tensor
	// PackedRows and PackedCols are the tile-padded dimensions of the
	// packed BFP matrix: [out, in] for the input axis, [in, out] for the
	// output axis. Zero for other formats.
	PackedRows  int64 `json:"packed_rows,omitempty"`
	PackedCols  int64 `json:"packed_cols,omitempty"`
	SourceBytes int64 `json:"source_bytes"`
	StoredBytes int64 `json:"stored_bytes"`
}

// IsBFP reports whether the tensor is stored in a BFP format.
func (t *PlannedTensor) IsBFP() bool { return t.Format.IsBFP() }

// BFP returns the bfp format and tile of a BFP tensor.
func (t *PlannedTensor) BFP() (bfp.Format, bfp.Tile, bool) {
	f, ok := t.Format.BFP()
	return manifest.WithTile(f, ok, t.Tile)
}

// Elements is the number of logical elements.
func (t *PlannedTensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// ReadSource reads the tensor's source bytes (in SourceDType, its slices
// concatenated) from m, reading only the slices.
func (t *PlannedTensor) ReadSource(m *safetensors.Model) ([]byte, error) {
	out := make([]byte, t.SourceBytes)
	var at int64
	for _, s := range t.Sources {
		f, _, ok := m.Lookup(s.Tensor)
		if !ok {
			return nil, fmt.Errorf("planned tensor %s: source tensor %s not in %s", t.Name, s.Tensor, m.Path())
		}
		if err := f.ReadTensorAt(s.Tensor, out[at:at+s.Bytes], s.Offset); err != nil {
			return nil, fmt.Errorf("planned tensor %s: %w", t.Name, err)
		}
		at += s.Bytes
	}
	return out, nil
}

// SourceFloat32s reads the source values of the tensor as float32 (exact
// for BF16, F16 and F32 sources).
func (t *PlannedTensor) SourceFloat32s(m *safetensors.Model) ([]float32, error) {
	b, err := t.ReadSource(m)
	if err != nil {
		return nil, err
	}
	dt, err := safetensors.ParseDType(t.SourceDType)
	if err != nil {
		return nil, err
	}
	out := make([]float32, t.Elements())
	if err := safetensors.DecodeFloat32s(out, b, dt); err != nil {
		return nil, fmt.Errorf("planned tensor %s: %w", t.Name, err)
	}
	return out, nil
}

// FormatTotal sums the planned tensors stored in one format.
type FormatTotal struct {
	Format      manifest.StoredFormat `json:"format"`
	Tensors     int                   `json:"tensors"`
	Elements    int64                 `json:"elements"`
	SourceBytes int64                 `json:"source_bytes"`
	StoredBytes int64                 `json:"stored_bytes"`
}

// Resolved is a plan applied to a model: every stored tensor with its rule,
// format, method, source and size, plus totals and the predicted file
// layout of the native checkpoint.
type Resolved struct {
	Plan  *Plan  `json:"plan"`
	Model string `json:"model"`
	// NumLayers is the number of trunk decoder layers, NumMTPLayers of MTP
	// layers, Experts the largest routed expert count of a MoE block.
	NumLayers    int `json:"num_layers"`
	NumMTPLayers int `json:"num_mtp_layers"`
	Experts      int `json:"experts"`
	// ExpertsPerFile is the number of routed experts per grouped expert file.
	ExpertsPerFile int             `json:"experts_per_file"`
	Tensors        []PlannedTensor `json:"tensors"`
	Totals         []FormatTotal   `json:"totals"`
	SourceTensors  int             `json:"source_tensors"`
	SourceBytes    int64           `json:"source_bytes"`
	StoredBytes    int64           `json:"stored_bytes"`
	// ExpertFiles is the number of grouped expert files (one per layer,
	// expert group and kind); DenseFiles the number of shards the other
	// tensors fill at DenseShardBytes each.
	ExpertFiles     int   `json:"expert_files"`
	DenseFiles      int   `json:"dense_files"`
	DenseShardBytes int64 `json:"dense_shard_bytes"`

	byName map[string]int // Tensors index by name, built by Resolve
}

// TensorFiles is the predicted number of tensor files of the checkpoint
// (grouped expert files plus dense shards); the manifest, the checksum list
// and copied configuration files come in addition.
func (r *Resolved) TensorFiles() int { return r.ExpertFiles + r.DenseFiles }

// Lookup returns the planned tensor with the given stored name.
func (r *Resolved) Lookup(name string) (*PlannedTensor, bool) {
	if r.byName != nil {
		i, ok := r.byName[name]
		if ok && i < len(r.Tensors) && r.Tensors[i].Name == name {
			return &r.Tensors[i], true
		}
	}
	// No index (a decoded or edited Resolved) or a stale one: scan.
	for i := range r.Tensors {
		if r.Tensors[i].Name == name {
			return &r.Tensors[i], true
		}
	}
	return nil, false
}

// ResolveOptions tune Resolve.
type ResolveOptions struct {
	// ExpertsPerFile is the number of routed experts per grouped expert
	// file (default manifest.DefaultExpertsPerFile).
	ExpertsPerFile int
	// DenseShardBytes is the size limit of a dense shard (default
	// manifest.DefaultDenseShardBytes).
	DenseShardBytes int64
	// Family says what the model's tensors are (default model.Qwen3).
	Family model.Family
	// Config is the model's configuration when the caller has read it (a
	// build reads config.json once and passes it here). When nil, Resolve
	// reads the config.json beside the model, if there is one, through
	// Family.
	Config *model.Config
}

// Validate reports a negative file layout size (0 selects the default).
func (o ResolveOptions) Validate() error {
	if o.ExpertsPerFile < 0 || o.DenseShardBytes < 0 {
		return fmt.Errorf("plan: experts per file %d and dense shard bytes %d must be positive", o.ExpertsPerFile, o.DenseShardBytes)
	}
	return nil
}

// ErrAlreadyQuantized is wrapped by the error Resolve returns for a source
// that is already quantized (FP8 weights with scale companions, packed
// integer weights, or a quantization_config in config.json).
var ErrAlreadyQuantized = errors.New("source checkpoint is already quantized")

// ErrUnknownTensor is wrapped by the error Resolve returns for a tensor
// whose name is not a known Qwen3.x text tensor.
var ErrUnknownTensor = errors.New("unknown tensor")

// ErrNoRule is wrapped by the error Resolve returns for a tensor that no
// rule of the plan matches.
var ErrNoRule = errors.New("no rule matches")

// Resolve applies the plan to the model with default options. It reads
// headers only (and config.json beside the model, when present).
func (p *Plan) Resolve(m *safetensors.Model) (*Resolved, error) {
	return p.ResolveWith(m, ResolveOptions{})
}

// rawSource is one classified source tensor.
type rawSource struct {
	info  safetensors.TensorInfo
	class model.SourceClass
}

// ResolveWith applies the plan to the model: it classifies every source
// tensor (an unknown name is an error naming it), refuses already-quantized
// sources, splits routed experts per expert, matches every stored tensor
// against the rules (first match wins; no match is an error naming the
// tensor), checks that the chosen format suits the tensor, and computes
// stored sizes and the file layout.
func (p *Plan) ResolveWith(m *safetensors.Model, opt ResolveOptions) (*Resolved, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if opt.ExpertsPerFile == 0 {
		opt.ExpertsPerFile = manifest.DefaultExpertsPerFile
	}
	if opt.DenseShardBytes == 0 {
		opt.DenseShardBytes = manifest.DefaultDenseShardBytes
	}
	plan, err := p.Validate()
	if err != nil {
		return nil, err
	}
	mt, err := newMatcher(plan)
	if err != nil {
		return nil, err
	}
	names := m.Names()
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: the model has no tensors", m.Path())
	}
	fam := opt.Family
	if fam == nil {
		fam = model.Qwen3
	}
	cfg := opt.Config
	if cfg == nil {
		if cfg, err = ConfigBeside(m, fam); err != nil {
			return nil, err
		}
	}
	if err := checkNotQuantized(m, names, cfg); err != nil {
		return nil, err
	}

	r := &Resolved{Plan: plan, Model: m.Path(), ExpertsPerFile: opt.ExpertsPerFile, DenseShardBytes: opt.DenseShardBytes, SourceTensors: len(names)}
	srcs, err := r.classify(m, names, fam)
	if err != nil {
		return nil, err
	}

	planned, err := r.plannedFromSources(srcs)
	if err != nil {
		return nil, err
	}

	sortNatural(planned)
	for i := 1; i < len(planned); i++ {
		if planned[i].Name == planned[i-1].Name {
			return nil, fmt.Errorf("%s: stored tensor %s would come from both %s and %s (fused and per-expert experts in the same block?)",
				m.Path(), planned[i].Name, planned[i-1].Source, planned[i].Source)
		}
	}

	totals := map[manifest.StoredFormat]*FormatTotal{}
	for i := range planned {
		t := &planned[i]
		ri := mt.match(t.Name)
		if ri < 0 {
			src := ""
			if t.Source != t.Name {
				src = ", from " + t.Source
			}
			return nil, fmt.Errorf("plan %q: tensor %s (role %s%s): %w; add a rule for it", plan.Name, t.Name, t.Role, src, ErrNoRule)
		}
		rule := plan.Rules[ri]
		t.RuleIndex, t.Format, t.Method, t.Axis, t.Tile = ri, rule.Format, rule.Method, rule.Axis, rule.Tile
		if err := sizeTensor(t); err != nil {
			return nil, fmt.Errorf("plan %q rule %d (pattern %q): %w", plan.Name, ri+1, rule.Pattern, err)
		}
		if t.Role.MustStayLossless() && !t.Format.Lossless(t.SourceDType) {
			return nil, fmt.Errorf("plan %q rule %d (pattern %q) stores %s (role %s, %s) as %s, but this role must stay lossless (use AS_IS or F32)",
				plan.Name, ri+1, rule.Pattern, t.Name, t.Role, t.SourceDType, t.Format)
		}
		if t.Expert >= 0 {
			t.ExpertGroup = t.Expert / opt.ExpertsPerFile
		} else {
			t.ExpertGroup = -1
		}
		ft := totals[t.Format]
		if ft == nil {
			ft = &FormatTotal{Format: t.Format}
			totals[t.Format] = ft
		}
		ft.Tensors++
		ft.Elements += t.Elements()
		ft.SourceBytes += t.SourceBytes
		ft.StoredBytes += t.StoredBytes
		r.StoredBytes += t.StoredBytes
	}
	if err := r.finish(planned, totals); err != nil {
		return nil, err
	}
	return r, nil
}

// classify classifies every source tensor (an unknown name is an error
// naming it and counting the others), checks its shape, and records the
// layer counts and source bytes in r.
func (r *Resolved) classify(m *safetensors.Model, names []string, fam model.Family) ([]rawSource, error) {
	srcs := make([]rawSource, 0, len(names))
	var unknown []string
	var firstFile string
	for _, n := range names {
		f, info, _ := m.Lookup(n)
		c, err := fam.ClassifyTensor(n)
		if err != nil {
			if len(unknown) == 0 {
				firstFile = f.Path()
			}
			unknown = append(unknown, n)
			continue
		}
		if err := checkSourceShape(c, info); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path(), err)
		}
		if c.Layer >= 0 {
			if c.MTP {
				r.NumMTPLayers = max(r.NumMTPLayers, c.Layer+1)
			} else {
				r.NumLayers = max(r.NumLayers, c.Layer+1)
			}
		}
		srcs = append(srcs, rawSource{info, c})
		r.SourceBytes += info.Size()
	}
	if len(unknown) > 0 {
		more := ""
		if len(unknown) > 1 {
			more = fmt.Sprintf(" (and %d more: %s)", len(unknown)-1, strings.Join(firstN(unknown[1:], 5), ", "))
		}
		return nil, fmt.Errorf("%s: tensor %q: %w: not a %s text tensor%s", firstFile, unknown[0], ErrUnknownTensor, fam.Name(), more)
	}
	return srcs, nil
}

// finish records the planned tensors, counts the files manifest.Layout
// gives them and lists the per-format totals in a fixed order.
func (r *Resolved) finish(planned []PlannedTensor, totals map[manifest.StoredFormat]*FormatTotal) error {
	r.Tensors = planned
	r.byName = make(map[string]int, len(planned))
	for i, t := range planned {
		r.byName[t.Name] = i
	}
	items := make([]manifest.LayoutItem, len(planned))
	for i, t := range planned {
		items[i] = manifest.LayoutItem{Name: t.Name, Layer: t.Layer, Expert: t.Expert, Kind: t.ExpertKind, Bytes: t.StoredBytes}
	}
	files, err := manifest.Layout(items, r.ExpertsPerFile, r.DenseShardBytes)
	if err != nil {
		return err
	}
	for _, f := range files {
		if f.Role == manifest.FileExperts {
			r.ExpertFiles++
		} else {
			r.DenseFiles++
		}
	}
	for _, f := range manifest.StoredFormats {
		if ft := totals[f]; ft != nil {
			r.Totals = append(r.Totals, *ft)
		}
	}
	return nil
}

// perExpertSource gathers the three source tensors of one per-expert
// routed expert.
type perExpertSource struct {
	gate, up, down *rawSource
	class          model.SourceClass
}

// layerIndex is the layer index of a classified source in the manifest's
// numbering: trunk layers first, then MTP layer k as NumLayers+k.
func (r *Resolved) layerIndex(c model.SourceClass) int {
	if c.MTP && c.Layer >= 0 {
		return r.NumLayers + c.Layer
	}
	return c.Layer
}

// plannedFromSources turns the classified sources into stored tensors:
// every non-expert tensor as it is, a fused expert tensor split per
// expert, the gate, up and down of a per-expert source joined into the
// canonical gate_up and down (joinPerExpert).
func (r *Resolved) plannedFromSources(srcs []rawSource) ([]PlannedTensor, error) {
	var planned []PlannedTensor
	// Per-expert sources, gathered by (block, expert).
	perExpert := map[string]*perExpertSource{}
	var peKeys []string
	blockShapes := map[string][2][]int64{} // fused gate_up and down shapes per block
	for i := range srcs {
		s := &srcs[i]
		c := s.class
		switch {
		case c.Role.IsExpert() && c.Fused:
			dims := s.info.Shape
			E, rows, cols := dims[0], dims[1], dims[2]
			per := s.info.Size() / max(E, 1)
			kind := model.ExpertKind(c.Role)
			if c.Role == model.RoleExpertGateUp {
				if rows%2 != 0 {
					return nil, fmt.Errorf("tensor %s: fused gate_up_proj %v has an odd row count %d (want gate rows then up rows)", s.info.Name, dims, rows)
				}
			}
			bs := blockShapes[c.Block]
			if kind == "gate_up" {
				bs[0] = dims
			} else {
				bs[1] = dims
			}
			blockShapes[c.Block] = bs
			r.Experts = max(r.Experts, int(E))
			for e := int64(0); e < E; e++ {
				planned = append(planned, PlannedTensor{
					Name: model.ExpertMatrixName(c.Block, int(e), c.Role),
					Role: c.Role, Source: s.info.Name, Expert: int(e), ExpertKind: kind,
					Sources: []SourceSlice{{Tensor: s.info.Name, Expert: int(e), Offset: e * per, Bytes: per}},
					Layer:   r.layerIndex(c), MTP: c.MTP,
					SourceDType: s.info.DType.String(), Shape: []int64{rows, cols}, SourceBytes: per,
				})
			}
		case c.Role.IsExpert():
			key := c.Block + "\x00" + strconv.Itoa(c.Expert)
			x := perExpert[key]
			if x == nil {
				x = &perExpertSource{class: c}
				perExpert[key] = x
				peKeys = append(peKeys, key)
			}
			switch c.Part {
			case "gate":
				x.gate = s
			case "up":
				x.up = s
			default:
				x.down = s
			}
		default:
			planned = append(planned, PlannedTensor{
				Name: s.info.Name, Role: c.Role, Source: s.info.Name, Expert: -1,
				Sources: []SourceSlice{{Tensor: s.info.Name, Expert: -1, Offset: 0, Bytes: s.info.Size()}},
				Layer:   r.layerIndex(c), MTP: c.MTP,
				SourceDType: s.info.DType.String(), Shape: append([]int64(nil), s.info.Shape...), SourceBytes: s.info.Size(),
			})
		}
	}
	for block, bs := range blockShapes {
		gu, dn := bs[0], bs[1]
		if gu == nil || dn == nil {
			missing := model.FusedExpertName(block, model.RoleExpertDown)
			if gu == nil {
				missing = model.FusedExpertName(block, model.RoleExpertGateUp)
			}
			return nil, fmt.Errorf("MoE block %s: fused %s is missing", strings.TrimSuffix(block, "."), missing)
		}
		if gu[0] != dn[0] || gu[2] != dn[1] || gu[1] != 2*dn[2] {
			return nil, fmt.Errorf("MoE block %s: gate_up_proj %v and down_proj %v disagree (want [E, 2I, H] and [E, H, I])", strings.TrimSuffix(block, "."), gu, dn)
		}
	}
	return r.joinPerExpert(planned, perExpert, peKeys)
}

// joinPerExpert appends the canonical gate_up and down tensors of every
// per-expert routed expert, in the order the experts were met.
func (r *Resolved) joinPerExpert(planned []PlannedTensor, perExpert map[string]*perExpertSource, keys []string) ([]PlannedTensor, error) {
	for _, key := range keys {
		x := perExpert[key]
		c := x.class
		where := fmt.Sprintf("%sexperts.%d", c.Block, c.Expert)
		if x.gate == nil || x.up == nil || x.down == nil {
			return nil, fmt.Errorf("expert %s: needs gate_proj, up_proj and down_proj; some are missing", where)
		}
		g, u, d := x.gate.info, x.up.info, x.down.info
		if !slices.Equal(g.Shape, u.Shape) || g.DType != u.DType || g.Shape[1] != d.Shape[0] || g.Shape[0] != d.Shape[1] {
			return nil, fmt.Errorf("expert %s: gate_proj %s%v, up_proj %s%v and down_proj %v disagree (want [I, H], [I, H], [H, I])", where, g.DType, g.Shape, u.DType, u.Shape, d.Shape)
		}
		r.Experts = max(r.Experts, c.Expert+1)
		planned = append(planned,
			PlannedTensor{
				Name: model.ExpertMatrixName(c.Block, c.Expert, model.RoleExpertGateUp), Role: model.RoleExpertGateUp, Source: g.Name, Expert: c.Expert, ExpertKind: model.ExpertKind(model.RoleExpertGateUp),
				Sources: []SourceSlice{
					{Tensor: g.Name, Expert: -1, Offset: 0, Bytes: g.Size()},
					{Tensor: u.Name, Expert: -1, Offset: 0, Bytes: u.Size()},
				},
				Layer: r.layerIndex(c), MTP: c.MTP, SourceDType: g.DType.String(),
				Shape: []int64{2 * g.Shape[0], g.Shape[1]}, SourceBytes: g.Size() + u.Size(),
			},
			PlannedTensor{
				Name: model.ExpertMatrixName(c.Block, c.Expert, model.RoleExpertDown), Role: model.RoleExpertDown, Source: d.Name, Expert: c.Expert, ExpertKind: model.ExpertKind(model.RoleExpertDown),
				Sources: []SourceSlice{{Tensor: d.Name, Expert: -1, Offset: 0, Bytes: d.Size()}},
				Layer:   r.layerIndex(c), MTP: c.MTP, SourceDType: d.DType.String(),
				Shape: append([]int64(nil), d.Shape...), SourceBytes: d.Size(),
			})
	}
	return planned, nil
}

// sizeTensor fills the stored dtype, packed geometry and stored bytes of t
// from its format, or explains why the format does not suit it.
func sizeTensor(t *PlannedTensor) error {
	n := t.Elements()
	switch t.Format {
	case manifest.StoreAsIs:
		t.StoredDType = t.SourceDType
		t.StoredBytes = t.SourceBytes
	case manifest.StoreBF16:
		t.StoredDType = "BF16"
		t.StoredBytes = 2 * n
	case manifest.StoreF32:
		t.StoredDType = "F32"
		t.StoredBytes = 4 * n
	default:
		f, tile, ok := t.BFP()
		if !ok {
			return fmt.Errorf("tensor %s: bad BFP format %s tile %q", t.Name, t.Format, t.Tile)
		}
		if len(t.Shape) != 2 {
			return fmt.Errorf("tensor %s (role %s) has shape %v: %s needs a 2-D matrix", t.Name, t.Role, t.Shape, t.Format)
		}
		rows, cols := t.Shape[0], t.Shape[1]
		if t.Axis == bfp.AxisOutput {
			rows, cols = cols, rows
		}
		tr, tc := (rows+int64(tile.H)-1)/int64(tile.H), (cols+int64(tile.W)-1)/int64(tile.W)
		t.PackedRows, t.PackedCols = tr*int64(tile.H), tc*int64(tile.W)
		t.StoredBytes = tr * tc * int64(bfp.TileBytes(f, tile))
	}
	return nil
}

// checkSourceShape checks the rank of a classified source tensor.
func checkSourceShape(c model.SourceClass, info safetensors.TensorInfo) error {
	rank := len(info.Shape)
	want := ""
	switch c.Role {
	case model.RoleVision:
		return nil
	case model.RoleNorm, model.RoleGDNNorm, model.RoleDTBias, model.RoleALog:
		if rank != 1 {
			want = "1-D"
		}
	case model.RoleConv1D:
		if rank != 2 && rank != 3 {
			want = "2-D or 3-D"
		}
	case model.RoleExpertGateUp, model.RoleExpertDown:
		if c.Fused && rank != 3 {
			want = "3-D [experts, rows, cols]"
		} else if !c.Fused && rank != 2 {
			want = "2-D"
		}
	default:
		if rank != 2 {
			want = "2-D"
		}
	}
	if want != "" {
		return fmt.Errorf("tensor %s (role %s) has shape %v, want %s", info.Name, c.Role, info.Shape, want)
	}
	for _, d := range info.Shape {
		if d <= 0 {
			return fmt.Errorf("tensor %s (role %s) has shape %v with an empty dimension", info.Name, c.Role, info.Shape)
		}
	}
	return nil
}

// ConfigBeside reads the config.json beside the model through the family
// (nil: model.Qwen3), nil when there is none, and checks it against the
// tensors' headers as a build does (Config.CheckTensors): a plan of a model
// its configuration contradicts is one no build would make. A caller that
// resolves several plans of one model reads it once here and passes it as
// ResolveOptions.Config.
func ConfigBeside(m *safetensors.Model, fam model.Family) (*model.Config, error) {
	if fam == nil {
		fam = model.Qwen3
	}
	p := model.ConfigPath(m.Path())
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	cfg, err := fam.ReadConfig(p)
	if err != nil {
		return nil, err
	}
	if err := cfg.CheckTensors(m); err != nil {
		return nil, fmt.Errorf("plan: %s does not describe the tensors of %s: %w", p, m.Path(), err)
	}
	return cfg, nil
}

// checkNotQuantized refuses sources that are already quantized: low
// precision or integer weight dtypes, scale/packing companions, or a
// quantization_config in the model's config (cfg, nil when the model has
// none).
func checkNotQuantized(m *safetensors.Model, names []string, cfg *model.Config) error {
	var lowPrec, companions, badDType []string
	for _, n := range names {
		_, info, _ := m.Lookup(n)
		dt := info.DType.String()
		switch {
		case model.QuantizedCompanion(n):
			companions = append(companions, n)
		case strings.HasPrefix(dt, "F8_") || strings.HasPrefix(dt, "F6_") || dt == "F4" || dt == "I8" || dt == "U8" || dt == "I4" || dt == "U4":
			lowPrec = append(lowPrec, fmt.Sprintf("%s is %s", n, dt))
		case dt != "BF16" && dt != "F16" && dt != "F32":
			badDType = append(badDType, fmt.Sprintf("%s is %s", n, dt))
		}
	}
	if len(lowPrec) > 0 || len(companions) > 0 {
		var parts []string
		if len(lowPrec) > 0 {
			parts = append(parts, fmt.Sprintf("%d low-precision weight(s), e.g. %s", len(lowPrec), lowPrec[0]))
		}
		if len(companions) > 0 {
			parts = append(parts, fmt.Sprintf("%d scale/packing companion(s), e.g. %s", len(companions), companions[0]))
		}
		return fmt.Errorf("%s: %w (%s); ttquant converts BF16, F16 or F32 checkpoints: use the unquantized release", m.Path(), ErrAlreadyQuantized, strings.Join(parts, "; "))
	}
	if len(badDType) > 0 {
		return fmt.Errorf("%s: unsupported source dtype: %s (want BF16, F16 or F32)", m.Path(), badDType[0])
	}
	if cfg != nil && cfg.Quantization != nil {
		return fmt.Errorf("%s: %w (config.json has a quantization_config: %s); ttquant converts BF16, F16 or F32 checkpoints: use the unquantized release",
			m.Path(), ErrAlreadyQuantized, truncate(string(cfg.Quantization), 120))
	}
	return nil
}

func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(append([]string(nil), s[:n]...), "…")
	}
	return s
}

// sortNatural sorts planned tensors by name, comparing all-digit dotted
// segments as numbers so that layers.2 comes before layers.10.
func sortNatural(ts []PlannedTensor) {
	keys := make([]string, len(ts))
	idx := make([]int, len(ts))
	for i := range ts {
		keys[i] = naturalKey(ts[i].Name)
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return keys[idx[a]] < keys[idx[b]] })
	out := make([]PlannedTensor, len(ts))
	for i, j := range idx {
		out[i] = ts[j]
	}
	copy(ts, out)
}

// naturalKey maps a dotted name to a string whose byte order is the
// natural order: every all-digit segment is prefixed with its length, and
// segments are joined with a byte below every printable character.
func naturalKey(name string) string {
	var b strings.Builder
	b.Grow(len(name) + 8)
	for i, seg := range strings.Split(name, ".") {
		if i > 0 {
			b.WriteByte(1)
		}
		digits := seg != ""
		for j := 0; j < len(seg); j++ {
			if seg[j] < '0' || seg[j] > '9' {
				digits = false
				break
			}
		}
		if digits {
			b.WriteByte(2)
			b.WriteByte(byte('0' + min(len(seg), 40)))
		}
		b.WriteString(seg)
	}
	return b.String()
}
