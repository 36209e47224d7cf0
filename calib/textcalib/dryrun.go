package textcalib

import (
	"fmt"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/safetensors"
)

// Work is what a store build would do and hold, from DryRun: its data,
// its sites and the bytes of their activations, and the memory of the
// process (of every worker of a split build).
type Work struct {
	Sequences   int    `json:"sequences"`
	Tokens      int64  `json:"tokens"`
	AskedTokens int64  `json:"asked_tokens"`
	Layers      int    `json:"layers"`
	MTPLayers   int    `json:"mtp_layers"`
	Sites       int    `json:"sites"`
	DType       string `json:"dtype"`
	// StoreBytes are the activations the store holds (its shards' data).
	StoreBytes int64 `json:"store_bytes"`
	// MemoryBytes is the estimated peak of one process building the whole
	// store (ForwardMemory of every token).
	MemoryBytes int64 `json:"memory_bytes"`
	// Shards is the split, with Options.Shard naming more than one worker.
	Shards *ShardWork `json:"shards,omitempty"`
}

// ShardWork is a split store build as its workers compute it: every
// worker's share and memory, and the largest of them.
type ShardWork struct {
	Worker         int           `json:"worker"`
	Workers        int           `json:"workers"`
	Units          int           `json:"units"`
	MaxTokens      int64         `json:"max_tokens"`
	MaxMemoryBytes int64         `json:"max_memory_bytes"`
	Shares         []WorkerShare `json:"shares"`
}

// WorkerShare is one worker's part of a split store build.
type WorkerShare struct {
	Worker int `json:"worker"`
	calib.Split
	MemoryBytes int64 `json:"memory_bytes"`
}

// The forward pass's memory at the layer step, measured at hidden 2,048
// (docs/projections.md, "Peak memory of a layer step"): the layer's
// weights, experts in flight and the runtime (571 MiB) and the mixer's
// intermediates and scratch (934 MiB), fixed; 37.1 KiB of per-token
// buffers, site copy included, which scale with the width; and the
// residual stream, float32 × hidden a token.
const (
	memFixedBytes     = (571 + 934) << 20
	memTokenBytes     = 37990 // 37.1 KiB at hidden 2,048
	memMeasuredHidden = 2048
)

// ForwardMemory estimates the peak memory of a store build whose process
// runs the forward pass over tokens tokens of a model of config cfg: an
// estimate for sizing nodes from the measured figures above, not a bound
// (the Go runtime's heap target adds to it).
func ForwardMemory(cfg *model.Config, tokens int64) int64 {
	return memFixedBytes + tokens*(4*int64(cfg.Hidden)+memTokenBytes*int64(cfg.Hidden)/memMeasuredHidden)
}

// DryRun reads the model's configuration and tokenizer and builds the
// calibration set as Build would, and returns the work of the build (and
// of every worker with opt.Shard); it reads no weight, hashes nothing and
// writes nothing.
func DryRun(opt Options) (*Work, error) {
	if opt.DataOptions.Calibration.Sequences <= 0 {
		return nil, ErrNoCalibration
	}
	cfg, err := model.ReadConfig(opt.Model)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res, asked, err := buildData(opt)
	if err != nil {
		return nil, err
	}
	var lens []int
	for _, ids := range res.Calibration.IDs() {
		lens = append(lens, len(ids))
	}
	dt := opt.Store.DType
	if dt == 0 {
		dt = safetensors.BF16
	}
	w := &Work{Sequences: len(lens), AskedTokens: asked, Layers: cfg.Layers, DType: dt.String()}
	for _, l := range lens {
		w.Tokens += int64(l)
	}
	steps := cfg.Layers
	if cfg.MTPLayers > 0 && w.Tokens > int64(len(lens)) {
		w.MTPLayers, steps = 1, steps+1
	}
	for k := 0; k < steps; k++ {
		rows := w.Tokens
		if k >= cfg.Layers {
			rows -= int64(len(lens)) // next_token-aligned
		}
		cols, _ := siteCols(cfg, k)
		for _, c := range cols {
			w.Sites++
			w.StoreBytes += rows * int64(c) * int64(dt.Bits()/8)
		}
	}
	w.MemoryBytes = ForwardMemory(cfg, w.Tokens)
	if sp := opt.Shard; sp.Count > 1 {
		if !sp.Valid() {
			return nil, fmt.Errorf("textcalib: worker %s names no worker", sp)
		}
		shares, err := calib.SplitShares(lens, sp.Count)
		if err != nil {
			return nil, err
		}
		sw := &ShardWork{Worker: sp.Index, Workers: sp.Count, Units: shares[0].Units}
		for i, s := range shares {
			m := ForwardMemory(cfg, s.Tokens)
			sw.Shares = append(sw.Shares, WorkerShare{Worker: i, Split: s, MemoryBytes: m})
			sw.MaxTokens, sw.MaxMemoryBytes = max(sw.MaxTokens, s.Tokens), max(sw.MaxMemoryBytes, m)
		}
		w.Shards = sw
	}
	return w, nil
}
