package manifest

import (
	"fmt"

	"github.com/ttquant/ttquant/safetensors"
)

// resolveStored applies the plan to the source model (Plan.ResolveWith) and
// turns every planned tensor into a storedTensor: its source byte ranges,
// stored format and geometry.
func resolveStored(p *Plan, m *safetensors.Model, opt ResolveOptions) ([]*storedTensor, error) {
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
			st.orient = OrientRow
			if pt.Axis == AxisOutput {
				st.orient = OrientTransposed
			}
			st.outDType = "U8"
			if st.padded, st.outSize, err = packedGeometry(f, t, st.shape, st.orient); err != nil {
				return nil, fmt.Errorf("tensor %s (shape %v as %s %s): %w", pt.Name, pt.Shape, pt.Format, pt.Tile, err)
			}
			if st.outSize != pt.StoredBytes {
				panic(fmt.Sprintf("manifest: %s packs to %d bytes, the plan says %d", pt.Name, st.outSize, pt.StoredBytes))
			}
		} else {
			st.format = pt.Format
			st.outDType = pt.StoredDType
			st.outSize = pt.StoredBytes
			st.method = MethodNone
			if !floatDType(st.srcDType) && st.outDType != st.srcDType {
				return nil, fmt.Errorf("tensor %s: cannot convert %s to %s", pt.Name, st.srcDType, st.outDType)
			}
		}
		out = append(out, st)
	}
	return out, nil
}
