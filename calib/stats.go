package calib

import (
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
	"github.com/ttquant/ttquant/safetensors"
)

// SiteStats summarises one stored site.
type SiteStats struct {
	Layer  int    `json:"layer"`
	Site   string `json:"site"`
	Cols   int    `json:"cols"`
	Tokens int64  `json:"tokens"` // rows (fewer than the tokens for a next_token site)
	DType  string `json:"dtype"`
	// Alignment is "token" or "next_token" (docs/calibration.md §1.1).
	Alignment string `json:"alignment"`
	Shards    int    `json:"shards"`
	Bytes     int64  `json:"bytes"` // on disk, all shards
}

// RoutingStats is the routing of one MoE layer's stored tokens.
type RoutingStats struct {
	Layer     int     `json:"layer"`
	Tokens    int64   `json:"tokens"`
	TopK      int     `json:"top_k"`
	MinTokens int     `json:"min_tokens"` // starvation threshold applied
	Counts    []int64 `json:"counts"`     // tokens routed to each expert
	Min       int64   `json:"min"`
	Max       int64   `json:"max"`
	Mean      float64 `json:"mean"`
	Starved   []int   `json:"starved"` // experts with fewer than MinTokens tokens
}

// StoreStats summarises a store and, with a model, its routing.
type StoreStats struct {
	Provenance Provenance     `json:"provenance"`
	Sites      []SiteStats    `json:"sites"`
	Routing    []RoutingStats `json:"routing,omitempty"`
}

// ComputeStoreStats lists the store's sites. When m and cfg are given, the
// MoE input (SiteMoE) of every layer that has one is routed through that
// layer's router in chunks, and the tokens per expert are counted; experts
// below ceil(minFraction × tokens) (DefaultMinTokensFraction when
// minFraction is 0) are listed as starved.
func ComputeStoreStats(s *Store, m *safetensors.Model, cfg *model.Config, minFraction float64) (*StoreStats, error) {
	out := &StoreStats{Provenance: s.Provenance(), Sites: []SiteStats{}}
	for _, si := range s.Sites() {
		ss := SiteStats{Layer: si.Layer, Site: si.Site, Cols: si.Cols, Tokens: si.Tokens, DType: si.DType, Alignment: si.Alignment.String(), Shards: len(si.Shards)}
		for _, sh := range si.Shards {
			st, err := os.Stat(filepath.Join(s.dir, sh.File))
			if err != nil {
				return nil, fmt.Errorf("calib: %w", err)
			}
			ss.Bytes += st.Size()
		}
		out.Sites = append(out.Sites, ss)
	}
	if m == nil || cfg == nil {
		return out, nil
	}
	if minFraction == 0 {
		minFraction = DefaultMinTokensFraction
	}
	for layer := 0; layer < cfg.NumLayers(); layer++ {
		si, ok := s.Site(layer, SiteMoE)
		if !ok || !cfg.IsMoE(layer) {
			continue // no inputs, or a dense MLP: no routing
		}
		if si.Cols != cfg.MoE().Hidden {
			return nil, fmt.Errorf("calib: store %s: layer %d site %s has %d columns, the model's hidden size is %d", s.dir, layer, SiteMoE, si.Cols, cfg.MoE().Hidden)
		}
		l, err := LoadMoELayer(m, cfg, layer)
		if err != nil {
			return nil, err
		}
		rs := RoutingStats{Layer: layer, Tokens: si.Tokens, TopK: cfg.MoE().TopK,
			MinTokens: int(math.Ceil(minFraction * float64(si.Tokens))),
			Counts:    make([]int64, cfg.MoE().Experts), Starved: []int{}}
		err = s.Stream(layer, SiteMoE, 0, si.Tokens, 4096, func(_ int64, rows []float32) error {
			r, err := ffn.Route(rows, len(rows)/si.Cols, l.Router, cfg.MoE())
			if err != nil {
				return err
			}
			for e, c := range r.Counts() {
				rs.Counts[e] += int64(c)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		rs.Min, rs.Max = math.MaxInt64, 0
		var sum int64
		for e, c := range rs.Counts {
			rs.Min, rs.Max = min(rs.Min, c), max(rs.Max, c)
			sum += c
			if c == 0 || c < int64(rs.MinTokens) {
				rs.Starved = append(rs.Starved, e)
			}
		}
		rs.Mean = float64(sum) / float64(len(rs.Counts))
		out.Routing = append(out.Routing, rs)
	}
	return out, nil
}
