package model

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/safetensors"
)

// CheckTensors compares the configuration with a model's tensor headers
// (no tensor data is read): the number of trunk and MTP layers, the
// embedding width, and the MLP of every layer: in an MoE layer the router,
// routed expert and shared expert shapes and no dense MLP; in a dense
// layer gate_proj, up_proj and down_proj of intermediate_size and no
// router, expert or shared expert. The error names the first tensor that
// disagrees, its shape and what the configuration implies.
func (c *Config) CheckTensors(m *safetensors.Model) error {
	trunk := c.Prefix + "layers."
	maxTrunk, maxMTP := -1, -1
	for _, name := range m.Names() {
		if rest, ok := strings.CutPrefix(name, trunk); ok {
			if i, ok := leadingIndex(rest); ok {
				maxTrunk = max(maxTrunk, i)
			}
		} else if rest, ok := strings.CutPrefix(name, "mtp.layers."); ok {
			if i, ok := leadingIndex(rest); ok {
				maxMTP = max(maxMTP, i)
			}
		}
	}
	if maxTrunk < 0 {
		return fmt.Errorf("model: config.json describes a %s model with %d layers under %q; the checkpoint has no tensor named %s0.…", c.ModelType, c.Layers, trunk, trunk)
	}
	if maxTrunk+1 != c.Layers {
		return fmt.Errorf("model: config.json says num_hidden_layers = %d; the tensors have layers 0..%d under %q", c.Layers, maxTrunk, trunk)
	}
	if c.MTPLayers > 0 && maxMTP+1 != c.MTPLayers {
		return fmt.Errorf("model: config.json says mtp_num_hidden_layers = %d; the tensors have %d MTP layers", c.MTPLayers, maxMTP+1)
	}
	h := int64(c.Hidden)
	if _, ti, ok := m.Lookup(c.Prefix + "embed_tokens.weight"); ok {
		want := []int64{int64(c.Vocab), h}
		if len(ti.Shape) != 2 || !slices.Equal(ti.Shape, want) {
			return shapeError(c.Prefix+"embed_tokens.weight", ti.Shape, want, "vocab_size, hidden_size")
		}
	}
	for l := 0; l < c.NumLayers(); l++ {
		var err error
		if c.IsMoE(l) {
			err = c.checkMoEBlock(m, c.LayerPrefix(l)+"mlp.")
		} else {
			err = c.checkDenseMLP(m, c.LayerPrefix(l)+"mlp.")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// mlpChecker checks one layer's MLP tensors against a model's headers.
type mlpChecker struct {
	m      *safetensors.Model
	prefix string // "….mlp."
}

func (k mlpChecker) shape(name string) ([]int64, bool) {
	_, ti, ok := k.m.Lookup(k.prefix + name)
	return ti.Shape, ok
}

// expect checks that prefix+name exists with the wanted shape.
func (k mlpChecker) expect(name, fields string, want ...int64) error {
	got, ok := k.shape(name)
	if !ok {
		return fmt.Errorf("model: the checkpoint has no tensor %s%s, which config.json (%s) implies", k.prefix, name, fields)
	}
	if !slices.Equal(got, want) {
		return shapeError(k.prefix+name, got, want, fields)
	}
	return nil
}

// anyOf returns the first of names the layer has, "" for none.
func (k mlpChecker) anyOf(names ...string) string {
	for _, n := range names {
		if _, ok := k.shape(n); ok {
			return k.prefix + n
		}
	}
	return ""
}

// denseNames and moeNames are the MLP tensors only a dense layer, or only
// an MoE layer, has.
var (
	denseNames = []string{"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
	moeNames   = []string{"gate.weight", "experts.gate_up_proj", "experts.down_proj", "experts.0.gate_proj.weight",
		"shared_expert.gate_proj.weight", "shared_expert_gate.weight"}
)

// checkDenseMLP checks a dense layer's SwiGLU MLP.
func (c *Config) checkDenseMLP(m *safetensors.Model, prefix string) error {
	k := mlpChecker{m, prefix}
	if n := k.anyOf(moeNames...); n != "" {
		return fmt.Errorf("model: the checkpoint has the MoE tensor %s, but config.json (model_type %s) makes this layer a dense MLP", n, c.ModelType)
	}
	h, in := int64(c.Hidden), int64(c.Intermediate)
	for _, kind := range []string{"gate_proj.weight", "up_proj.weight"} {
		if err := k.expect(kind, "intermediate_size, hidden_size", in, h); err != nil {
			return err
		}
	}
	return k.expect("down_proj.weight", "hidden_size, intermediate_size", h, in)
}

// checkMoEBlock checks one MoE block's shapes.
func (c *Config) checkMoEBlock(m *safetensors.Model, prefix string) error {
	k := mlpChecker{m, prefix}
	if n := k.anyOf(denseNames...); n != "" {
		return fmt.Errorf("model: the checkpoint has the dense MLP tensor %s, but config.json (model_type %s) makes this layer an MoE block", n, c.ModelType)
	}
	h, e, in, s := int64(c.Hidden), int64(c.Experts), int64(c.ExpertInter), int64(c.SharedInter)
	if err := k.expect("gate.weight", "num_experts, hidden_size", e, h); err != nil {
		return err
	}
	if _, fused := k.shape("experts.gate_up_proj"); fused {
		if err := k.expect("experts.gate_up_proj", "num_experts, 2×moe_intermediate_size, hidden_size", e, 2*in, h); err != nil {
			return err
		}
		if err := k.expect("experts.down_proj", "num_experts, hidden_size, moe_intermediate_size", e, h, in); err != nil {
			return err
		}
	} else {
		for x := int64(0); x < e; x++ {
			p := "experts." + strconv.FormatInt(x, 10) + "."
			for _, kind := range []string{"gate_proj", "up_proj"} {
				if err := k.expect(p+kind+".weight", "moe_intermediate_size, hidden_size", in, h); err != nil {
					return err
				}
			}
			if err := k.expect(p+"down_proj.weight", "hidden_size, moe_intermediate_size", h, in); err != nil {
				return err
			}
		}
		if _, extra := k.shape(fmt.Sprintf("experts.%d.gate_proj.weight", e)); extra {
			return fmt.Errorf("model: the checkpoint has expert %d in %s; config.json says num_experts = %d", e, prefix, e)
		}
	}
	if s > 0 {
		for _, kind := range []string{"gate_proj", "up_proj"} {
			if err := k.expect("shared_expert."+kind+".weight", "shared_expert_intermediate_size, hidden_size", s, h); err != nil {
				return err
			}
		}
		if err := k.expect("shared_expert.down_proj.weight", "hidden_size, shared_expert_intermediate_size", h, s); err != nil {
			return err
		}
	} else if _, ok := k.shape("shared_expert.gate_proj.weight"); ok {
		return fmt.Errorf("model: the checkpoint has a shared expert in %s; config.json gives no shared_expert_intermediate_size", prefix)
	}
	return nil
}

func shapeError(name string, got, want []int64, fields string) error {
	w := make([]string, len(want))
	for i, d := range want {
		w[i] = strconv.FormatInt(d, 10)
	}
	return fmt.Errorf("model: tensor %s has shape %v; config.json (%s) implies [%s]", name, got, fields, strings.Join(w, " "))
}

// leadingIndex parses the layer index at the start of "N.rest".
func leadingIndex(s string) (int, bool) {
	d, _, ok := strings.Cut(s, ".")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(d)
	return i, err == nil && i >= 0 && strconv.Itoa(i) == d
}
