package build

import (
	"fmt"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

// resolveStored applies the plan to the source model (Plan.ResolveWith) and
// turns every planned tensor into a storedTensor: its source byte ranges,
// stored format and geometry.
func resolveStored(p *plan.Plan, m *safetensors.Model, opt plan.ResolveOptions) ([]*storedTensor, error) {
	r, err := p.ResolveWith(m, opt)
	if err != nil {
		return nil, err
	}
	out := make([]*storedTensor, 0, len(r.Tensors))
	for i := range r.Tensors {
		pt := &r.Tensors[i]
		st := &storedTensor{
			name:     pt.Name,
			expert:   pt.Expert,
			layer:    pt.Layer,
			role:     string(pt.Role),
			kind:     pt.ExpertKind,
			rule:     pt.RuleIndex,
			method:   pt.Method,
			axis:     pt.Axis,
			srcDType: pt.SourceDType,
			shape:    append([]int64(nil), pt.Shape...),
			srcLen:   pt.SourceBytes,
		}
		if pt.Expert < 0 {
			st.expert = -1
		}
		for _, s := range pt.Sources {
			f, _, ok := m.Lookup(s.Tensor)
			if !ok {
				return nil, fmt.Errorf("manifest: planned tensor %s: source %s not in the model", pt.Name, s.Tensor)
			}
			st.parts = append(st.parts, sourcePart{file: f, tensor: s.Tensor, off: s.Offset, len: s.Bytes})
		}
		if f, t, ok := pt.BFP(); ok {
			st.isBFP, st.bfpF, st.tile = true, f, t
			st.format = f.String()
			st.orient = manifest.OrientRow
			if pt.Axis == bfp.AxisOutput {
				st.orient = manifest.OrientTransposed
			}
			st.outDType = "U8"
			if st.padded, st.outSize, err = manifest.PackedGeometry(f, t, st.shape, st.orient); err != nil {
				return nil, fmt.Errorf("tensor %s (shape %v as %s %s): %w", pt.Name, pt.Shape, pt.Format, pt.Tile, err)
			}
			if st.outSize != pt.StoredBytes {
				panic(fmt.Sprintf("manifest: %s packs to %d bytes, the plan says %d", pt.Name, st.outSize, pt.StoredBytes))
			}
		} else {
			st.format = string(pt.Format)
			st.outDType = pt.StoredDType
			st.outSize = pt.StoredBytes
			st.method = manifest.MethodNone
			if !manifest.IsFloatDType(st.srcDType) && st.outDType != st.srcDType {
				return nil, fmt.Errorf("tensor %s: cannot convert %s to %s", pt.Name, st.srcDType, st.outDType)
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// storedTensor is one tensor of the native checkpoint, with everything
// needed to produce its bytes from the source.
type storedTensor struct {
	name   string
	source string
	expert int // -1: not an expert tensor
	layer  int // -1: not in a layer
	role   string
	kind   string // "gate_up" or "down" for routed experts
	rule   int
	method manifest.Method
	format string // "BFP8_b", "BFP4_b", "BFP2_b", "BF16", "AS_IS"
	bfpF   bfp.Format
	isBFP  bool
	tile   bfp.Tile
	axis   bfp.Axis
	orient string

	parts    []sourcePart // concatenated in order
	srcDType string
	srcLen   int64   // total source bytes
	shape    []int64 // logical shape of the stored tensor

	outDType string
	padded   []int64
	outSize  int64
}

func (st *storedTensor) sourceRefs() []manifest.SourceRef {
	out := make([]manifest.SourceRef, len(st.parts))
	for i, p := range st.parts {
		out[i] = manifest.SourceRef{Tensor: p.tensor, Offset: p.off, Length: p.len}
	}
	return out
}

func (st *storedTensor) isExpertMatrix() bool { return st.expert >= 0 }

// isMLPMatrix reports whether st is a matrix of its layer's MLP block: a
// routed expert, the shared expert's gate, up or down projection, or the
// dense MLP's (model.Role.IsMLPMatrix).
func (st *storedTensor) isMLPMatrix() bool { return model.Role(st.role).IsMLPMatrix() }

// expertKind returns "gate_up" or "down" for a routed expert tensor.
func (st *storedTensor) expertKind() string {
	if st.kind != "" {
		return st.kind
	}
	if strings.Contains(st.name, "down") {
		return "down"
	}
	return "gate_up"
}

// sourcePart is a byte range of one source tensor.
type sourcePart struct {
	file   *safetensors.File
	tensor string
	off    int64
	len    int64
}

// job is the unit of work, resumption and parallelism: one output file.
type job struct {
	file    string
	role    string
	layer   int // -1 for dense shards
	kind    string
	group   int
	tensors []*storedTensor
	bytes   int64
}

// planJobs assigns every stored tensor to a file with manifest.Layout.
func planJobs(ts []*storedTensor, perFile int, shardBytes int64) ([]*job, error) {
	items := make([]manifest.LayoutItem, len(ts))
	for i, st := range ts {
		items[i] = manifest.LayoutItem{Name: st.name, Layer: st.layer, Expert: st.expert, Bytes: st.outSize}
		if st.isExpertMatrix() {
			items[i].Kind = st.expertKind()
		}
	}
	files, err := manifest.Layout(items, perFile, shardBytes)
	if err != nil {
		return nil, err
	}
	jobs := make([]*job, len(files))
	for k, f := range files {
		j := &job{file: f.Name, role: f.Role, layer: f.Layer, kind: f.Kind, group: f.Group, bytes: f.Bytes}
		for _, i := range f.Items {
			j.tensors = append(j.tensors, ts[i])
		}
		jobs[k] = j
	}
	return jobs, nil
}
