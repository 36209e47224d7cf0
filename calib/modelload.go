package calib

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
	"github.com/ttquant/ttquant/safetensors"
)

// LoadMoELayer returns MoE block `layer` of model m, described by cfg (see
// model.ReadConfig); layers from cfg.Layers on are the MTP layers. The router, the shared expert and its gate are read
// now; the routed experts are read one at a time when the returned layer's
// Experts.Expert is called, so memory holds only the experts in use.
func LoadMoELayer(m *safetensors.Model, cfg *model.Config, layer int) (*ffn.MoE, error) {
	if layer < 0 || layer >= cfg.NumLayers() {
		return nil, fmt.Errorf("calib: layer %d outside 0..%d", layer, cfg.NumLayers()-1)
	}
	return LoadMoEBlock(m, cfg.LayerPrefix(layer)+"mlp.", cfg.MoE())
}

// LoadMoEBlock is LoadMoELayer for the block whose tensors are named
// prefix+"gate.weight", prefix+"experts.…" and so on (prefix ends in
// "mlp."; MTP blocks use e.g. "mtp.layers.0.mlp."). Routed experts may be
// stored fused (experts.gate_up_proj [E, 2I, H] with per expert the gate
// rows first, experts.down_proj [E, H, I]) or per expert
// (experts.{e}.{gate,up,down}_proj.weight).
func LoadMoEBlock(m *safetensors.Model, prefix string, c model.MoEConfig) (*ffn.MoE, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	h, e, in := int64(c.Hidden), int64(c.Experts), int64(c.ExpertInter)
	read := func(name string, shape ...int64) ([]float32, error) {
		f, ti, ok := m.Lookup(name)
		if !ok {
			return nil, fmt.Errorf("calib: %s: no tensor %q", m.Path(), name)
		}
		if !slices.Equal(ti.Shape, shape) {
			return nil, fmt.Errorf("calib: %s: tensor %s has shape %v, the config implies %v", f.Path(), name, ti.Shape, shape)
		}
		v, err := f.Float32s(name)
		if err != nil {
			return nil, fmt.Errorf("calib: %w", err)
		}
		return v, nil
	}
	l := &ffn.MoE{Config: c}
	var err error
	if l.Router, err = read(prefix+"gate.weight", e, h); err != nil {
		return nil, err
	}
	if c.SharedInter > 0 {
		s := int64(c.SharedInter)
		l.Shared = &ffn.ExpertWeights{}
		if l.Shared.Gate, err = read(prefix+"shared_expert.gate_proj.weight", s, h); err != nil {
			return nil, err
		}
		if l.Shared.Up, err = read(prefix+"shared_expert.up_proj.weight", s, h); err != nil {
			return nil, err
		}
		if l.Shared.Down, err = read(prefix+"shared_expert.down_proj.weight", h, s); err != nil {
			return nil, err
		}
		if _, _, ok := m.Lookup(prefix + "shared_expert_gate.weight"); ok {
			if l.SharedGate, err = read(prefix+"shared_expert_gate.weight", 1, h); err != nil {
				return nil, err
			}
		}
	}
	src := &modelExperts{m: m, prefix: prefix, c: c}
	if f, ti, ok := m.Lookup(prefix + "experts.gate_up_proj"); ok {
		if !slices.Equal(ti.Shape, []int64{e, 2 * in, h}) {
			return nil, fmt.Errorf("calib: %s: tensor %sexperts.gate_up_proj has shape %v, the config implies [%d %d %d]", f.Path(), prefix, ti.Shape, e, 2*in, h)
		}
		f2, ti2, ok := m.Lookup(prefix + "experts.down_proj")
		if !ok {
			return nil, fmt.Errorf("calib: %s: fused experts without %sexperts.down_proj", m.Path(), prefix)
		}
		if !slices.Equal(ti2.Shape, []int64{e, h, in}) {
			return nil, fmt.Errorf("calib: %s: tensor %sexperts.down_proj has shape %v, the config implies [%d %d %d]", f2.Path(), prefix, ti2.Shape, e, h, in)
		}
		src.fused = true
	} else {
		for x := 0; x < c.Experts; x++ {
			for _, p := range []struct {
				n     string
				shape []int64
			}{{"gate_proj", []int64{in, h}}, {"up_proj", []int64{in, h}}, {"down_proj", []int64{h, in}}} {
				name := prefix + "experts." + strconv.Itoa(x) + "." + p.n + ".weight"
				f, ti, ok := m.Lookup(name)
				if !ok {
					return nil, fmt.Errorf("calib: %s: no tensor %q (and no fused %sexperts.gate_up_proj)", m.Path(), name, prefix)
				}
				if !slices.Equal(ti.Shape, p.shape) {
					return nil, fmt.Errorf("calib: %s: tensor %s has shape %v, the config implies %v", f.Path(), name, ti.Shape, p.shape)
				}
			}
		}
	}
	l.Experts = src
	return l, nil
}

// modelExperts reads routed experts from a checkpoint on demand.
type modelExperts struct {
	m      *safetensors.Model
	prefix string
	c      model.MoEConfig
	fused  bool
}

// Expert implements ffn.ExpertSource; each call returns fresh slices.
func (s *modelExperts) Expert(e int) (*ffn.ExpertWeights, error) {
	if e < 0 || e >= s.c.Experts {
		return nil, fmt.Errorf("calib: expert %d outside 0..%d", e, s.c.Experts-1)
	}
	h, in := s.c.Hidden, s.c.ExpertInter
	w := &ffn.ExpertWeights{Gate: make([]float32, in*h), Up: make([]float32, in*h), Down: make([]float32, h*in)}
	part := func(name string, dst []float32, start int64) error {
		f, _, ok := s.m.Lookup(name)
		if !ok {
			return fmt.Errorf("calib: %s: no tensor %q", s.m.Path(), name)
		}
		if err := f.ReadFloat32s(name, dst, start); err != nil {
			return fmt.Errorf("calib: expert %d: %w", e, err)
		}
		return nil
	}
	if s.fused {
		gu, dn := s.prefix+"experts.gate_up_proj", s.prefix+"experts.down_proj"
		base := int64(e) * int64(2*in*h)
		if err := part(gu, w.Gate, base); err != nil {
			return nil, err
		}
		if err := part(gu, w.Up, base+int64(in*h)); err != nil {
			return nil, err
		}
		if err := part(dn, w.Down, int64(e)*int64(h*in)); err != nil {
			return nil, err
		}
		return w, nil
	}
	p := s.prefix + "experts." + strconv.Itoa(e) + "."
	for _, x := range []struct {
		n   string
		dst []float32
	}{{"gate_proj", w.Gate}, {"up_proj", w.Up}, {"down_proj", w.Down}} {
		if err := part(p+x.n+".weight", x.dst, 0); err != nil {
			return nil, err
		}
	}
	return w, nil
}
