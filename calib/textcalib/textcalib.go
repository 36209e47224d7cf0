// Package textcalib builds a calibration store from text: it tokenizes and
// packs the data (internal/text/dataset), runs the BF16 model one layer at
// a time over every calibration sequence (internal/model/forward) and
// writes each layer's calibration sites into a calib store, with the text's
// provenance and the model's identity. docs/calibration.md describes the
// result.
package textcalib

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
)

// Options configures Build.
type Options struct {
	Model string // model directory: config.json, weights, tokenizer
	Out   string // store directory to create
	// Data and DataOptions give the text; only the calibration set is
	// built (DataOptions.Calibration.Sequences > 0).
	Data        *dataset.Spec
	DataOptions dataset.Options
	// Store sets the stored dtype and shard size.
	Store calib.StoreOptions
	// Progress, when set, receives one line per finished layer.
	Progress func(msg string)
}

// Result describes a built store.
type Result struct {
	Store *calib.Store
	// Layers is the number of layers whose sites were written (the
	// trunk); MTPLayers are the MTP layers left out (docs/calibration.md).
	Layers, MTPLayers int
	Data              dataset.Provenance
}

// ErrNoCalibration is returned when the options ask for no calibration
// sequences.
var ErrNoCalibration = errors.New("textcalib: the data options build no calibration sequences")

// Build writes the calibration store. Everything that can refuse the run
// (configuration, tokenizer, data, existing store) is checked before the
// store directory is created.
func Build(ctx context.Context, opt Options) (_ *Result, err error) {
	if opt.DataOptions.Calibration.Sequences <= 0 {
		return nil, ErrNoCalibration
	}
	if _, err := os.Stat(filepath.Join(opt.Out, calib.StoreIndexName)); err == nil {
		return nil, fmt.Errorf("textcalib: %s already holds a calibration store", opt.Out)
	}
	// The forward pass refuses an unsupported config before reading any
	// weight.
	m, err := forward.Open(opt.Model)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	tok, err := tokenizer.Load(opt.Model)
	if err != nil {
		return nil, err
	}
	dopt := opt.DataOptions
	dopt.Evaluation.Sequences = 0
	res, err := dataset.Build(opt.Data, tok, dopt)
	if err != nil {
		return nil, err
	}
	set := res.Calibration
	if set == nil || len(set.Sequences) == 0 {
		return nil, ErrNoCalibration
	}
	cfg := m.Config
	ids := set.IDs()
	lens := make([]int, len(ids))
	var tokens int64
	for i, s := range ids {
		for t, id := range s {
			if id < 0 || int(id) >= cfg.Vocab {
				return nil, fmt.Errorf("textcalib: sequence %d token %d: id %d outside the model's vocabulary 0..%d", i, t, id, cfg.Vocab-1)
			}
		}
		lens[i] = len(s)
		tokens += int64(len(s))
	}
	ident, err := ModelIdentity(opt.Model)
	if err != nil {
		return nil, err
	}
	dataProv, err := json.Marshal(res.Provenance)
	if err != nil {
		return nil, err
	}
	prov := calib.Provenance{
		Model:     filepath.Base(filepath.Clean(opt.Model)),
		Revision:  ident,
		Sequences: len(ids), Tokens: tokens,
		TokenIDsSHA256: res.Provenance.Calibration.TokenIDsSHA256,
		Data:           dataProv,
	}
	// Weights are read layer by layer below; a NaN or infinity would only
	// show up as non-finite activations, so it is refused here, before the
	// store is created.
	if err := m.CheckFinite(); err != nil {
		return nil, err
	}
	_, statErr := os.Stat(opt.Out)
	created := os.IsNotExist(statErr)
	w, err := calib.CreateStore(opt.Out, prov, lens, ids, opt.Store)
	if err != nil {
		return nil, err
	}
	// A store without its index is refused by every reader; a failed or
	// interrupted build removes the directory it created, or says what it
	// left in one that was there before.
	defer func() {
		if err == nil {
			return
		}
		if created {
			os.RemoveAll(opt.Out)
			err = fmt.Errorf("%w (the unfinished store was removed)", err)
		} else {
			err = fmt.Errorf("%w (an unfinished store without an index is left in %s; remove it before building again)", err, opt.Out)
		}
	}()

	// The residual stream of every sequence, one after another.
	H := cfg.Hidden
	x := make([]float32, 0, int(tokens)*H)
	for _, s := range ids {
		e, err := m.Embed(s)
		if err != nil {
			return nil, err
		}
		x = append(x, e...)
	}
	b := &forward.Batch{Lens: lens, X: x}
	start := time.Now()
	for i := 0; i < cfg.Layers; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		l, err := m.Layer(i)
		if err != nil {
			return nil, err
		}
		sites := newCollector(int(tokens))
		if err := l.Forward(b, sites.hook); err != nil {
			return nil, fmt.Errorf("textcalib: layer %d: %w", i, err)
		}
		outSite := calib.SiteOutProj
		if cfg.Kind(i) == forward.FullAttention {
			outSite = calib.SiteOProj
		}
		for _, s := range []struct {
			site forward.Site
			name string
		}{{forward.SiteMLPIn, calib.SiteMoE}, {forward.SiteAttnIn, calib.SiteAttn}, {forward.SiteAttnOut, outSite}} {
			if err := sites.write(w, i, s.site, s.name); err != nil {
				return nil, err
			}
		}
		if opt.Progress != nil {
			el := time.Since(start)
			eta := el / time.Duration(i+1) * time.Duration(cfg.Layers-i-1)
			opt.Progress(fmt.Sprintf("layer %d/%d written (%s elapsed, about %s left)", i+1, cfg.Layers, el.Round(time.Second), eta.Round(time.Second)))
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	st, err := calib.OpenStore(opt.Out)
	if err != nil {
		return nil, err
	}
	return &Result{Store: st, Layers: cfg.Layers, MTPLayers: cfg.MTPLayers, Data: res.Provenance}, nil
}

// collector keeps one layer's sites, every token row in batch order.
type collector struct {
	rows  int
	cols  map[forward.Site]int
	sites map[forward.Site][]float32
}

func newCollector(rows int) *collector {
	return &collector{rows: rows, cols: map[forward.Site]int{}, sites: map[forward.Site][]float32{}}
}

func (c *collector) hook(a *forward.Activations) error {
	switch a.Site {
	case forward.SiteAttnIn, forward.SiteAttnOut, forward.SiteMLPIn:
	default:
		return nil // routed rows and a dense down input follow from mlp
	}
	buf := c.sites[a.Site]
	if buf == nil {
		c.cols[a.Site] = a.Cols
		buf = make([]float32, c.rows*a.Cols)
		c.sites[a.Site] = buf
	}
	if a.Cols != c.cols[a.Site] || a.Row0 < 0 || a.Row0+a.Rows > c.rows {
		return fmt.Errorf("textcalib: site %s: rows %d..%d of %d columns do not fit %d rows of %d", a.Site, a.Row0, a.Row0+a.Rows, a.Cols, c.rows, c.cols[a.Site])
	}
	copy(buf[a.Row0*a.Cols:], a.X[:a.Rows*a.Cols])
	return nil
}

func (c *collector) write(w *calib.StoreWriter, layer int, site forward.Site, name string) error {
	buf, ok := c.sites[site]
	if !ok {
		return fmt.Errorf("textcalib: layer %d produced no %s activations", layer, site)
	}
	sw, err := w.BeginSite(layer, name, c.cols[site])
	if err != nil {
		return err
	}
	if err := sw.Write(buf); err != nil {
		return err
	}
	return sw.Close()
}

// ModelIdentity is the sha256 of the model directory's config.json and
// safetensors files: a JSON list of (name, size, sha256) sorted by name.
func ModelIdentity(dir string) (string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return "", err
	}
	names = append(names, filepath.Join(dir, "config.json"))
	sort.Strings(names)
	type entry struct {
		Name   string `json:"name"`
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	}
	var ents []entry
	for _, n := range names {
		f, err := os.Open(n)
		if err != nil {
			return "", fmt.Errorf("textcalib: model identity: %w", err)
		}
		h := sha256.New()
		size, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("textcalib: model identity: %s: %w", n, err)
		}
		ents = append(ents, entry{filepath.Base(n), size, hex.EncodeToString(h.Sum(nil))})
	}
	data, _ := json.Marshal(ents)
	s := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(s[:]), nil
}
