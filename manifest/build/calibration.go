package build

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/jsonx"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/par"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/manifest"
)

// ErrSyntheticCalibration is returned by a GPTQ build whose calibration
// store holds synthetic activations and whose options do not set
// AllowSyntheticCalibration.
var ErrSyntheticCalibration = errors.New("the store holds synthetic activations, not activations of the model on text; GPTQ on them can be worse than rounding")

// StoreIdentity is the identity a GPTQ build records for a calibration
// store directory (manifest.CalibInfo.SHA256): the sha256 of a JSON list
// of every file's (name, size, sha256), sorted by name.
func StoreIdentity(ctx context.Context, dir string, workers int) (string, error) {
	return storeIdentity(ctx, dir, workers)
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
	ents := make([]manifest.FileEntry, len(names))
	err = par.For(ctx, len(names), workers, func(i int) error {
		n, sum, err := manifest.HashFileContext(ctx, filepath.Join(dir, filepath.FromSlash(names[i])))
		ents[i] = manifest.FileEntry{Name: names[i], Size: n, SHA256: sum}
		return err
	})
	if err != nil {
		return "", err
	}
	data, _ := json.Marshal(ents)
	return manifest.SHA256Hex(data), nil
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
	if st.Provenance().Synthetic && !b.opt.AllowSyntheticCalibration {
		return fmt.Errorf("manifest: calibration store %s: %w", b.opt.Calib, ErrSyntheticCalibration)
	}
	if err := b.checkStoreModel(ctx, st.Provenance().Revision); err != nil {
		return err
	}
	if err := st.Check(ctx, false); err != nil {
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
	b.calib = &manifest.CalibInfo{Sequences: int64(prov.Sequences), Tokens: prov.Tokens, HeldOutSequences: int64(b.opt.HeldOutSequences), SHA256: id,
		Mode: manifest.CalibModeStore, TokenIDsSHA256: prov.TokenIDsSHA256, Data: contentJSON(prov.Data)}
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
	b.hess = &storeHessians{store: st, calibTokens: b.calibTokens(), cache: map[string]*hessEntry{}, roles: roles, tensors: b.tensors, family: b.opt.Family, stored: b.storedValues}
	if b.opt.Asymmetric {
		b.hess.(*storeHessians).rows = func(layer int, site string) ([]float32, int, error) {
			si, ok := st.Site(layer, site)
			if !ok {
				return nil, 0, nil
			}
			cal, _, err := st.LoadActivations(layer, site, b.opt.HeldOutSequences)
			return cal.X, si.Cols, err
		}
	}
	return nil
}

// calibTokens is the number of leading store tokens used for Hessians.
func (b *builder) calibTokens() int64 {
	offs := b.store.SequenceOffsets()
	return offs[len(offs)-1-b.opt.HeldOutSequences]
}

// siteSource is where storeHessians finds a layer's calibration inputs: a
// calibration store, or the rows a sequential build holds in memory for the
// layer it is quantizing.
type siteSource interface {
	Site(layer int, site string) (calib.SiteInfo, bool)
	SiteHessian(ctx context.Context, layer int, site string, tokens int64) (*gptq.Hessian, error)
	SwiGLUHessian(ctx context.Context, layer int, site string, tokens int64, gate, up []float32, inter int) (*gptq.Hessian, error)
}

// storeHessians computes the Hessians of dense matrices from the store's
// sites, once per (layer, site).
type storeHessians struct {
	store       siteSource
	calibTokens int64
	mu          sync.Mutex
	cache       map[string]*hessEntry
	roles       map[string]string // tensor name → role
	family      model.Family
	tensors     []*storedTensor
	// stored returns a tensor's values exactly as the checkpoint stores
	// them (quantized when the plan quantizes it).
	stored func(context.Context, *storedTensor) ([]float32, error)
	// rows, in an asymmetric store build, returns a site's calibration
	// rows (nil when the store has none).
	rows func(layer int, site string) ([]float32, int, error)
}

// storedValues returns st's values as the checkpoint holds them: the
// dequantized BFP tiles for a quantized tensor (by GPTQ or rounding, as
// the build produces it), else the stored dtype's values. The build is
// deterministic, so these are the values of the written tensor.
func (b *builder) storedValues(ctx context.Context, st *storedTensor) ([]float32, error) {
	data, _, _, err := b.produce(ctx, st)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", st.name, err)
	}
	if st.isBFP {
		return manifest.UnpackBFP(st.bfpF, st.tile, data, st.shape, st.orient)
	}
	return manifest.DecodeFloats(st.outDType, data)
}

// downInputs returns, for a down projection (shared expert or dense MLP),
// its layer's gate and up projections, whose SwiGLU output is its input.
func (s *storeHessians) downInputs(role model.Role, layer int) (gate, up *storedTensor) {
	g, u := model.RoleSharedGate, model.RoleSharedUp
	if role == model.RoleMLPDown {
		g, u = model.RoleMLPGate, model.RoleMLPUp
	}
	for _, t := range s.tensors {
		if t.layer != layer {
			continue
		}
		switch model.Role(t.role) {
		case g:
			gate = t
		case u:
			up = t
		}
	}
	return gate, up
}

// downHessian accumulates the Hessian of silu(x·Gᵀ) ⊙ (x·Uᵀ) over the
// calibration tokens of the layer's MoE input, with the gate and up
// weights as the checkpoint stores them (after their own GPTQ or
// rounding): the down projection is fitted to the inputs it will see, the
// in-block order calib uses for routed experts.
func (s *storeHessians) downHessian(ctx context.Context, role model.Role, layer, cols int) ([]float64, int64, *calib.FallbackError, error) {
	gt, ut := s.downInputs(role, layer)
	if gt == nil || ut == nil || len(gt.shape) != 2 || !slices.Equal(gt.shape, ut.shape) || int(gt.shape[0]) != cols {
		return nil, 0, noInputs("the layer's gate and up projections, whose output feeds this matrix, were not found"), nil
	}
	si, ok := s.store.Site(layer, calib.SiteMoE)
	if !ok {
		return nil, 0, noInputs(fmt.Sprintf("calibration store has no %q inputs for layer %d", calib.SiteMoE, layer)), nil
	}
	hidden := int(gt.shape[1])
	if si.Cols != hidden {
		return nil, 0, noInputs(fmt.Sprintf("calibration site %q of layer %d has %d features, the gate projection %d inputs", calib.SiteMoE, layer, si.Cols, hidden)), nil
	}
	load := sourceFloats
	if s.stored != nil {
		load = func(st *storedTensor) ([]float32, error) { return s.stored(ctx, st) }
	}
	g, err := load(gt)
	if err != nil {
		return nil, 0, nil, err
	}
	u, err := load(ut)
	if err != nil {
		return nil, 0, nil, err
	}
	h, err := s.store.SwiGLUHessian(ctx, layer, calib.SiteMoE, s.calibTokens, g, u, cols)
	if err != nil {
		return nil, 0, nil, err
	}
	return h.Matrix(), h.Tokens(), nil, nil
}

// asymRows returns, in an asymmetric build, the rows of a dense GPTQ
// matrix's fit (calib.AsymmetricTarget) and their number: its calibration
// inputs and the source model's inputs at the same tokens, a site's rows
// for a projection that reads one, the SwiGLU of the stored gate and up
// projections (and of the source's, on the source rows) for a down
// projection, formed a chunk at a time. src is nil when the matrix is
// fitted symmetrically: the build is not asymmetric, the matrix has no
// such inputs, or fewer than calib.AsymmetricMinRowsPerColumn rows per
// input column (checked before any row is read).
//
// A store build's rows are the source model's inputs: a projection that
// reads a site is its own fit (src nil), and a down projection is fitted
// to the source gate and up's SwiGLU on the same rows.
func (s *storeHessians) asymRows(ctx context.Context, tensor string, layer, cols int) (src calib.AsymmetricRows, n int, err error) {
	ms, inMem := s.store.(*memSites)
	if (!inMem && s.rows == nil) || layer < 0 || !calib.AsymmetricFits(s.calibTokens, cols) {
		return nil, 0, nil
	}
	r := model.Role(s.roles[tensor])
	if r != model.RoleSharedDown && r != model.RoleMLPDown {
		site := s.family.Site(r)
		if site == "" || !inMem {
			return nil, 0, nil
		}
		x, t, c, err := ms.calibTargetsOf(layer, site, s.calibTokens)
		if err != nil || t == nil || c != cols {
			return nil, 0, err
		}
		return calib.RowsOf(x, t, c), len(x) / c, nil
	}
	gt, ut := s.downInputs(r, layer)
	if gt == nil || ut == nil || len(gt.shape) != 2 || int(gt.shape[0]) != cols {
		return nil, 0, nil
	}
	var xi, ti []float32
	var hidden int
	if inMem {
		if xi, ti, hidden, err = ms.calibTargetsOf(layer, calib.SiteMoE, s.calibTokens); err != nil {
			return nil, 0, err
		}
	} else {
		if xi, hidden, err = s.rows(layer, calib.SiteMoE); err != nil {
			return nil, 0, err
		}
		ti = xi
	}
	if ti == nil || hidden == 0 || int(gt.shape[1]) != hidden {
		return nil, 0, nil
	}
	var g, u, gs, us []float32
	if g, err = s.stored(ctx, gt); err == nil {
		u, err = s.stored(ctx, ut)
	}
	if err == nil {
		gs, err = sourceFloats(gt)
	}
	if err == nil {
		us, err = sourceFloats(ut)
	}
	if err != nil {
		return nil, 0, err
	}
	return calib.SwiGLURowsOf(xi, ti, hidden, g, u, gs, us, cols), len(xi) / hidden, nil
}

type hessEntry struct {
	once   sync.Once
	h      []float64
	n      int64
	reason *calib.FallbackError
	err    error
	cols   int
}

func (s *storeHessians) Hessian(ctx context.Context, tensor string, layer, expert int, cols int) ([]float64, int64, *calib.FallbackError, error) {
	if r := model.Role(s.roles[tensor]); (r == model.RoleSharedDown || r == model.RoleMLPDown) && layer >= 0 {
		return s.cached(fmt.Sprintf("%d/down/%s", layer, r), cols, func() ([]float64, int64, *calib.FallbackError, error) {
			return s.downHessian(ctx, r, layer, cols)
		})
	}
	site := s.family.Site(model.Role(s.roles[tensor]))
	if site == "" || layer < 0 {
		return nil, 0, noInputs("no calibration inputs are defined for this matrix"), nil
	}
	si, ok := s.store.Site(layer, site)
	if !ok {
		return nil, 0, noInputs(fmt.Sprintf("calibration store has no %q inputs for layer %d", site, layer)), nil
	}
	if si.Cols != cols {
		return nil, 0, noInputs(fmt.Sprintf("calibration site %q of layer %d has %d features, the matrix %d inputs", site, layer, si.Cols, cols)), nil
	}
	return s.cached(fmt.Sprintf("%d/%s", layer, site), cols, func() ([]float64, int64, *calib.FallbackError, error) {
		h, err := s.store.SiteHessian(ctx, layer, site, s.calibTokens)
		if err != nil {
			return nil, 0, nil, err
		}
		return h.Matrix(), h.Tokens(), nil, nil
	})
}

// noInputs is the fallback reason of a matrix without usable calibration
// inputs.
func noInputs(reason string) *calib.FallbackError {
	return calib.Fallback(calib.ErrNoInputs, reason, nil)
}

// cached computes a Hessian once per key; matrices sharing an input (q, k
// and v; gate and up) share it.
func (s *storeHessians) cached(key string, cols int, compute func() ([]float64, int64, *calib.FallbackError, error)) ([]float64, int64, *calib.FallbackError, error) {
	s.mu.Lock()
	e := s.cache[key]
	if e == nil {
		e = &hessEntry{}
		s.cache[key] = e
	}
	s.mu.Unlock()
	e.once.Do(func() {
		e.h, e.n, e.reason, e.err = compute()
		e.cols = cols
	})
	if e.err != nil {
		return nil, 0, nil, e.err
	}
	return e.h, e.n, e.reason, nil
}

// contentJSON is the compact JSON of a calibration store's text
// provenance without its paths and spec as typed (dataset.Provenance's
// Content), which is what the manifest records; a provenance that does
// not decode as one is recorded as it is (compacted, jsonx.Compact).
func contentJSON(data []byte) json.RawMessage {
	var p dataset.Provenance
	if len(data) == 0 || json.Unmarshal(data, &p) != nil {
		return jsonx.Compact(data)
	}
	b, err := json.Marshal(p.Content())
	if err != nil {
		return jsonx.Compact(data)
	}
	return b
}

// ErrStoreModel is wrapped by the error of a GPTQ build whose calibration
// store was built from another model.
var ErrStoreModel = errors.New("the calibration store was built from another model")

// checkStoreModel compares the model identity a text-built store records
// (calib.ModelIdentity) with the source's, from the source hashes the
// manifest needs anyway; only when they differ are the directory's files
// hashed the way the store builder did, to rule out files the source
// checkpoint does not use.
func (b *builder) checkStoreModel(ctx context.Context, revision string) error {
	if !strings.HasPrefix(revision, "sha256:") {
		return nil // a store without a model identity (synthetic, or from elsewhere)
	}
	si, _, err := b.sourceIdentity(ctx)
	if err != nil {
		return err
	}
	var files []calib.ModelFile
	for _, f := range si.Files {
		if f.Role == "shard" || f.Name == "config.json" {
			files = append(files, calib.ModelFile{Name: f.Name, Size: f.Size, SHA256: f.SHA256})
		}
	}
	have := calib.ModelIdentityOf(files)
	if have == revision {
		return nil
	}
	if fi, err := os.Stat(b.opt.Source); err == nil && fi.IsDir() {
		if id, err := calib.ModelIdentity(b.opt.Source); err == nil && id == revision {
			return nil
		}
	}
	return fmt.Errorf("manifest: calibration store %s: %w (its model identity %.23s…, the source's %.23s…); build the store from this model", b.opt.Calib, ErrStoreModel, revision, have)
}
