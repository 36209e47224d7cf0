package manifest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
)

// compileLayerPattern compiles a --layers regular expression.
func compileLayerPattern(s string) (*regexp.Regexp, error) {
	return regexp.Compile(s)
}

// storeIdentity hashes every file of a calibration store directory: the
// sha256 of a JSON list of (name, size, sha256) sorted by name.
func storeIdentity(ctx context.Context, dir string, workers int) (string, error) {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			names = append(names, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	ents := make([]FileEntry, len(names))
	err = parallelFor(ctx, len(names), workers, func(i int) error {
		n, sum, err := hashFile(filepath.Join(dir, filepath.FromSlash(names[i])))
		ents[i] = FileEntry{Name: names[i], Size: n, SHA256: sum}
		return err
	})
	if err != nil {
		return "", err
	}
	data, _ := json.Marshal(ents)
	return sha256Hex(data), nil
}

// openCalibration prepares the calibration of a GPTQ build: the store, its
// identity, the model configuration the MoE driver needs, and the Hessian
// source for GPTQ matrices outside the expert layers.
func (b *builder) openCalibration(ctx context.Context) error {
	if b.opt.Hessians != nil {
		b.hess = b.opt.Hessians
		b.calib = b.opt.CalibInfo
		if len(b.gptqLayers) > 0 {
			return errors.New("manifest: GPTQ of routed experts needs a calibration store")
		}
		return nil
	}
	if b.opt.Calib == "" {
		return errors.New("manifest: GPTQ needs a calibration store (--calib)")
	}
	st, err := calib.OpenStore(b.opt.Calib)
	if err != nil {
		return err
	}
	id, err := storeIdentity(ctx, b.opt.Calib, b.opt.Workers)
	if err != nil {
		return err
	}
	prov := st.Provenance()
	if b.opt.HeldOutSequences < 0 || b.opt.HeldOutSequences >= prov.Sequences {
		return fmt.Errorf("manifest: %d held-out sequences of the store's %d leave none for calibration", b.opt.HeldOutSequences, prov.Sequences)
	}
	b.store = st
	b.calib = &CalibInfo{Sequences: int64(prov.Sequences), Tokens: prov.Tokens, HeldOutSequences: int64(b.opt.HeldOutSequences), SHA256: id}
	if len(b.gptqLayers) > 0 {
		cfgPath := b.opt.Source
		if fi, err := os.Stat(cfgPath); err == nil && !fi.IsDir() {
			cfgPath = filepath.Dir(cfgPath)
		}
		if b.modelCfg, err = calib.ReadModelConfig(cfgPath); err != nil {
			return fmt.Errorf("manifest: GPTQ of routed experts needs the model's config.json: %w", err)
		}
	}
	// Expert layers without MoE inputs in the store fall back to RTN,
	// matrix by matrix, with the reason recorded.
	for l := range b.gptqLayers {
		if _, ok := st.Site(l, calib.SiteMoE); !ok {
			delete(b.gptqLayers, l)
		}
	}
	roles := map[string]string{}
	for _, t := range b.tensors {
		roles[t.name] = t.role
	}
	b.hess = &storeHessians{store: st, calibTokens: b.calibTokens(), cache: map[string]*hessEntry{}, roles: roles}
	return nil
}

// calibTokens is the number of leading store tokens used for Hessians.
func (b *builder) calibTokens() int64 {
	offs := b.store.SequenceOffsets()
	return offs[len(offs)-1-b.opt.HeldOutSequences]
}

// readSite loads rows [first, first+n) of a store site.
func readSite(st *calib.Store, layer int, site string, first, n int64) ([]float32, int, error) {
	si, ok := st.Site(layer, site)
	if !ok {
		return nil, 0, fmt.Errorf("calibration store has no site %q for layer %d", site, layer)
	}
	out := make([]float32, 0, n*int64(si.Cols))
	err := st.Stream(layer, site, first, n, 4096, func(_ int64, rows []float32) error {
		out = append(out, rows...)
		return nil
	})
	return out, si.Cols, err
}

// siteOf names the store site holding a dense matrix's inputs, or "".
func siteOf(role string) string {
	switch TensorRole(role) {
	case RoleSharedGate, RoleSharedUp, RoleMLPGate, RoleMLPUp, RoleExpertGateUp, RoleExpertDown:
		return calib.SiteMoE
	case RoleAttnQ, RoleAttnK, RoleAttnV, RoleGDNInQKV, RoleGDNInZ, RoleGDNInQKVZ:
		return calib.SiteAttn
	case RoleAttnO:
		return calib.SiteOProj
	case RoleGDNOut:
		return calib.SiteOutProj
	}
	return ""
}

// storeHessians computes the Hessians of dense matrices from the store's
// sites, once per (layer, site).
type storeHessians struct {
	store       *calib.Store
	calibTokens int64
	mu          sync.Mutex
	cache       map[string]*hessEntry
	roles       map[string]string // tensor name → role
}

type hessEntry struct {
	once sync.Once
	h    []float64
	n    int64
	err  error
	cols int
}

func (s *storeHessians) Hessian(ctx context.Context, tensor string, layer, expert int, cols int) ([]float64, int64, string, error) {
	site := siteOf(s.roles[tensor])
	if site == "" || layer < 0 {
		return nil, 0, "no calibration inputs are defined for this matrix", nil
	}
	if _, ok := s.store.Site(layer, site); !ok {
		return nil, 0, fmt.Sprintf("calibration store has no %q inputs for layer %d", site, layer), nil
	}
	key := fmt.Sprintf("%d/%s", layer, site)
	s.mu.Lock()
	e := s.cache[key]
	if e == nil {
		e = &hessEntry{}
		s.cache[key] = e
	}
	s.mu.Unlock()
	e.once.Do(func() {
		si, _ := s.store.Site(layer, site)
		e.cols = si.Cols
		h := gptq.NewHessian(si.Cols)
		e.err = s.store.Stream(layer, site, 0, s.calibTokens, 4096, func(_ int64, rows []float32) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return h.Add(rows, len(rows)/si.Cols)
		})
		if e.err == nil {
			e.h, e.n = h.Matrix(), h.Tokens()
		}
	})
	if e.err != nil {
		return nil, 0, "", e.err
	}
	if e.cols != cols {
		return nil, 0, fmt.Sprintf("calibration site %q of layer %d has %d features, the matrix %d inputs", site, layer, e.cols, cols), nil
	}
	return e.h, e.n, "", nil
}
