package build

import (
	"context"
	"errors"
	"fmt"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/gptq"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
)

// exponentParam is the manifest's spelling of a build's exponent rule
// (BuildParams.BFPExponent): empty for gptq.ExpMax, the packer's own rule,
// so that builds with the default keep the bytes and identity they had
// before the rule was an option.
func exponentParam(r gptq.ExponentRule) string {
	if r == 0 || r == gptq.ExpMax {
		return ""
	}
	return r.String()
}

// exponentOf parses BuildParams.BFPExponent back (empty: gptq.ExpMax).
func exponentOf(s string) (gptq.ExponentRule, error) {
	if s == "" {
		return gptq.ExpMax, nil
	}
	return gptq.ParseExponentRule(s)
}

// checkExponent reports an exponent rule that is not one, or a rule other
// than gptq.ExpMax asked of a plan that stores no BFP tensor: the rule
// chooses shared exponents, which only BFP formats have.
func checkExponent(r gptq.ExponentRule, p *plan.Plan, g *gptq.Options) error {
	if r == 0 {
		r = gptq.ExpMax
	} else if err := r.Valid(); err != nil {
		return fmt.Errorf("build: --bfp-exponent (BuildOptions.Exponent): %w", err)
	}
	if g != nil && g.Exponent != 0 && g.Exponent != r {
		return fmt.Errorf("build: GPTQOptions.Exponent %v differs from BuildOptions.Exponent %v: set the rule once, in BuildOptions.Exponent", g.Exponent, r)
	}
	if r == gptq.ExpMax || p == nil {
		return nil
	}
	if np, err := p.Validate(); err == nil {
		p = np
	}
	for _, rule := range p.Rules {
		if rule.Format.IsBFP() {
			return nil
		}
	}
	return fmt.Errorf("build: --bfp-exponent %v chooses BFP shared exponents, but plan %q stores no tensor in a BFP format", r, p.Name)
}

// weighted reports whether st is rounded to nearest with weights from the
// calibration inputs: the rule weights its errors (gptq.ExpSearch), the
// build has calibration rows, and st is a BFP matrix outside the routed
// experts whose input is a calibration site (or, for a down projection,
// computed from one). Such a tensor's bytes depend on the calibration: a
// sequential build decides it at its stage, as it does GPTQ matrices.
func (b *builder) weighted(st *storedTensor) bool {
	if b.rule != gptq.ExpSearch || !st.isBFP || st.method != manifest.MethodRTN || st.isExpertMatrix() || st.layer < 0 {
		return false
	}
	if b.opt.Calib == "" && b.opt.Data == nil && b.opt.Hessians == nil {
		return false
	}
	r := model.Role(st.role)
	return r == model.RoleSharedDown || r == model.RoleMLPDown || b.opt.Family.Site(r) != ""
}

// calibrated reports whether st's bytes depend on the calibration: GPTQ
// matrices, and weighted rounding (weighted).
func (b *builder) calibrated(st *storedTensor) bool {
	return st.method == manifest.MethodGPTQ || b.weighted(st)
}

// hessianDiag returns the diagonal of st's input Hessian (twice the mean
// squared activation of each input channel) when the build weights st's
// rounding (weighted) and the Hessian source has one, else nil: rounding
// is then unweighted.
func (b *builder) hessianDiag(ctx context.Context, st *storedTensor) ([]float64, error) {
	if !b.weighted(st) || b.hess == nil {
		return nil, nil
	}
	slices, _, cols := manifest.MatDims(st.shape)
	if slices != 1 || len(st.shape) != 2 {
		return nil, nil
	}
	h, _, _, err := b.hess.Hessian(ctx, st.name, st.layer, st.expert, cols)
	if err != nil || h == nil {
		return nil, err
	}
	return diagOf(h, cols), nil
}

// diagOf returns the diagonal of the cols×cols matrix h.
func diagOf(h []float64, cols int) []float64 {
	d := make([]float64, cols)
	for i := range d {
		d[i] = h[i*cols+i]
	}
	return d
}

// roundBFP packs vals (row-major over shape) rounded to nearest with
// exponent rule r, slice by slice: gptq.ExpMax is manifest.PackBFP itself
// (the packer's rule); another rule rounds with gptq.RTNWith on the axis
// the orientation gives, weighted by diag when it is not nil, and packs
// the result exactly. A tensor holding NaN or Inf (stored only with
// AllowNonFinite) is packed as it comes, with the packer's rule.
func roundBFP(f bfp.Format, t bfp.Tile, vals []float32, shape []int64, orient string, r gptq.ExponentRule, diag []float64) ([]byte, error) {
	if r == 0 || r == gptq.ExpMax || !manifest.AllFinite(vals) {
		return manifest.PackBFP(f, t, vals, shape, orient)
	}
	slices, rows, cols := manifest.MatDims(shape)
	if len(vals) != slices*rows*cols {
		return nil, fmt.Errorf("%d values for shape %v", len(vals), shape)
	}
	axis := bfp.AxisInput
	if orient == manifest.OrientTransposed {
		axis = bfp.AxisOutput
	}
	g := gptq.NewBFPGrid(f, axis)
	q := make([]float32, 0, len(vals))
	n := rows * cols
	for s := 0; s < slices; s++ {
		qs, err := gptq.RTNWith(vals[s*n:(s+1)*n], rows, cols, g, gptq.RTNOptions{Exponent: r, Diag: diag})
		if err != nil {
			return nil, err
		}
		q = append(q, qs...)
	}
	packed, _, err := manifest.PackExact(f, t, q, shape, orient)
	if err != nil {
		return nil, fmt.Errorf("exponent rule %v: %w", r, err)
	}
	return packed, nil
}

// roundStored is roundBFP of a stored tensor's source values with the
// build's rule, weighted as hessianDiag says.
func (b *builder) roundStored(ctx context.Context, st *storedTensor, vals []float32) ([]byte, error) {
	diag, err := b.hessianDiag(ctx, st)
	if err != nil {
		return nil, err
	}
	return roundBFP(st.bfpF, st.tile, vals, st.shape, st.orient, b.rule, diag)
}

// ErrConvertCalib is returned by Convert, before any I/O, when it is
// given a calibration store without the weighted rule gptq.ExpSearch:
// there the store serves only to weight that rule's rounding.
var ErrConvertCalib = errors.New("build: a calibration store given to convert (--calib) only weights the exponent search; give --bfp-exponent search (BuildOptions.Exponent gptq.ExpSearch) or no store")
