package build

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/gptq"
	modelpkg "github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/par"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

// VerifyOptions configure Verify.
type VerifyOptions struct {
	// Source, when set, is the source checkpoint to compare against.
	Source string
	// Workers is the number of files checked at once (default 1).
	Workers int
	// Family is the source's model family (default model.Qwen3).
	Family modelpkg.Family
	// AllowSymlinks and MaxManifestBytes are passed to manifest.Verify.
	AllowSymlinks    bool
	MaxManifestBytes int64
}

// Verify is manifest.Verify followed, when opt.Source is set and the
// manifest decodes, by the comparison with the source: the source files'
// identity, the recorded plan re-applied to the source, and every stored
// tensor against what its method makes of the source values (see
// docs/checkpoint.md). Failed checks are in the report; the error is
// non-nil only when verification could not run.
func Verify(ctx context.Context, dir string, opt VerifyOptions) (*manifest.VerifyReport, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if opt.Workers == 0 {
		opt.Workers = 1
	}
	rep, err := manifest.Verify(ctx, dir, manifest.VerifyOptions{
		Workers:          opt.Workers,
		AllowSymlinks:    opt.AllowSymlinks,
		MaxManifestBytes: opt.MaxManifestBytes,
	})
	if err != nil || opt.Source == "" || rep.Incomplete && rep.Identity == "" {
		return rep, err
	}
	data, err := manifest.ReadManifestFile(filepath.Join(dir, manifest.ManifestName), opt.MaxManifestBytes)
	if err != nil {
		return nil, err
	}
	m, err := manifest.DecodeManifest(data)
	if err != nil {
		return rep, nil // reported by manifest.Verify
	}
	sf, err := verifySource(ctx, dir, m, opt)
	if err != nil {
		return nil, err
	}
	rep.SourceChecked = true
	rep.AddFailures(sf...)
	return rep, nil
}

// Validate reports an option out of range.
func (o VerifyOptions) Validate() error {
	if o.Workers < 0 {
		return fmt.Errorf("verify: workers %d: want at least 1 (0 for the default)", o.Workers)
	}
	return nil
}

// verifySource compares a checkpoint with its source: the source files'
// identity and every stored tensor against the source values.
func verifySource(ctx context.Context, dir string, m *manifest.Manifest, opt VerifyOptions) ([]manifest.Failure, error) {
	model, err := safetensors.OpenModel(opt.Source)
	if err != nil {
		return nil, err
	}
	defer model.Close()
	var out []manifest.Failure
	shards, index, configs, err := sourceFiles(opt.Source, model)
	if err != nil {
		return nil, err
	}
	all := append(append([]string(nil), shards...), configs...)
	if index != "" {
		all = append(all, index)
	}
	have := make([]manifest.FileEntry, len(all))
	if err := par.For(ctx, len(all), opt.Workers, func(i int) error {
		n, sum, err := manifest.HashFileContext(ctx, all[i])
		have[i] = manifest.FileEntry{Name: filepath.Base(all[i]), Size: n, SHA256: sum}
		return err
	}); err != nil {
		return nil, err
	}
	byName := map[string]manifest.FileEntry{}
	for _, h := range have {
		byName[h.Name] = h
	}
	want := append([]manifest.FileEntry(nil), m.Source.Files...)
	if m.Source.Index != nil {
		want = append(want, *m.Source.Index)
	}
	for _, w := range want {
		h, ok := byName[w.Name]
		switch {
		case !ok:
			out = append(out, manifest.Failure{File: "source/" + w.Name, What: "the checkpoint was built from this file; the given source has none"})
		case h.SHA256 != w.SHA256 || h.Size != w.Size:
			out = append(out, manifest.Failure{File: "source/" + w.Name, What: fmt.Sprintf("differs from the file the checkpoint was built from (sha256 %.16s, recorded %.16s)", h.SHA256, w.SHA256)})
		}
	}

	out = append(out, checkPlan(m, model, opt.Family)...)

	stats := map[string]manifest.MatrixStats{}
	for _, s := range m.TTQuant.Matrices {
		stats[s.Tensor] = s
	}
	rule, err := exponentOf(m.TTQuant.Options.BFPExponent)
	if err != nil {
		return append(out, manifest.Failure{File: manifest.ManifestName, What: "options.bfp_exponent: " + err.Error()}), nil
	}
	// A weighted rule with calibration rows rounds with weights the
	// checkpoint does not hold: its rounded tensors are checked like GPTQ's
	// (exactly representable, the recorded error); every other rule is
	// applied to the source again.
	rc := rtnCheck{rule: rule, exact: rule != gptq.ExpSearch || m.TTQuant.Calibration == nil}
	ts := append([]manifest.TensorEntry(nil), m.Tensors...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	res := make([][]manifest.Failure, len(ts))
	err = par.For(ctx, len(ts), opt.Workers, func(i int) error {
		res[i] = checkAgainstSource(dir, model, ts[i], stats, rc)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, r := range res {
		out = append(out, r...)
	}
	return out, nil
}

// rtnCheck is how verification checks tensors rounded to nearest: with
// the build's exponent rule applied to the source again (exact), or, when
// the rule was weighted by calibration inputs, for representability.
type rtnCheck struct {
	rule  gptq.ExponentRule
	exact bool
}

func checkAgainstSource(dir string, model *safetensors.Model, t manifest.TensorEntry, stats map[string]manifest.MatrixStats, rc rtnCheck) []manifest.Failure {
	var out []manifest.Failure
	bad := func(format string, args ...any) {
		out = append(out, manifest.Failure{File: t.File, Tensor: t.Name, What: fmt.Sprintf(format, args...)})
	}
	src, problem := sourceBytes(model, t)
	if problem != "" {
		bad("%s", problem)
		return out
	}
	stored := make([]byte, t.Length)
	f, _, err := manifest.OpenRegular(filepath.Join(dir, filepath.FromSlash(t.File)))
	if err != nil {
		bad("cannot open: %v", err)
		return out
	}
	_, err = f.ReadAt(stored, t.Offset)
	f.Close()
	if err != nil {
		return out // size problems are reported by the file checks
	}
	fm, isBFP := manifest.ParseBFP(t.Format)
	if !isBFP && t.DType == t.SourceDType {
		if !bytes.Equal(src, stored) {
			bad("differs from the source tensor's bytes")
		}
		return out
	}
	vals, err := manifest.DecodeFloats(t.SourceDType, src)
	if err != nil {
		bad("source: %v", err)
		return out
	}
	if manifest.AllFinite(vals) != t.Finite {
		bad("the manifest says the source is finite=%v, it is %v", t.Finite, manifest.AllFinite(vals))
	}
	if !isBFP {
		if (t.DType != "BF16" && t.DType != "F32") || !bytes.Equal(manifest.EncodeFloats(t.DType, vals), stored) {
			bad("is not the %s rounding of the source", t.DType)
		}
		return out
	}
	tile, err := bfp.ParseTile(t.Tile)
	if err != nil {
		return out
	}
	switch {
	case t.Method == manifest.MethodRTN && rc.exact:
		want, err := roundBFP(fm, tile, vals, t.Shape, t.Orientation, rc.rule, nil)
		if err != nil {
			bad("packing the source: %v", err)
		} else if !bytes.Equal(want, stored) {
			bad("RTN tensor is not what %s packing of the source gives (exponent rule %v)", t.Format, rc.rule)
		}
		if s, ok := stats[t.Name]; ok {
			q, err := manifest.UnpackBFP(fm, tile, stored, t.Shape, t.Orientation)
			if err == nil && manifest.SquaredError(vals, q) != s.Error {
				bad("error against the source is %g, the manifest records %g", manifest.SquaredError(vals, q), s.Error)
			}
		}
	case t.Method == manifest.MethodRTN || t.Method == manifest.MethodGPTQ:
		q, err := manifest.UnpackBFP(fm, tile, stored, t.Shape, t.Orientation)
		if err != nil {
			bad("decode: %v", err)
			return out
		}
		again, err := manifest.PackBFP(fm, tile, q, t.Shape, t.Orientation)
		if err != nil || !bytes.Equal(again, stored) {
			bad("%s values are not exactly representable: re-packing the decoded values changes the bytes", strings.ToUpper(string(t.Method)))
		}
		if t.Method == manifest.MethodRTN {
			if s, ok := stats[t.Name]; ok && manifest.SquaredError(vals, q) != s.Error {
				bad("error against the source is %g, the manifest records %g", manifest.SquaredError(vals, q), s.Error)
			}
			break
		}
		s, ok := stats[t.Name]
		if !ok {
			bad("GPTQ tensor without statistics in the manifest")
		} else if e := manifest.SquaredError(vals, q); e != s.Error {
			bad("error against the source is %g, the manifest records %g", e, s.Error)
		}
	}
	return out
}

// checkPlan resolves the recorded plan against the source again and
// compares the planned tensors with the stored ones: the same names, rules,
// formats and shapes.
func checkPlan(m *manifest.Manifest, model *safetensors.Model, fam modelpkg.Family) []manifest.Failure {
	p := &plan.Plan{Name: m.Plan.Name}
	for _, r := range m.Plan.Rules {
		p.Rules = append(p.Rules, plan.Rule{Pattern: r.Pattern, Format: r.Format, Method: r.Method, Axis: r.Axis, Tile: r.Tile})
	}
	if planInfo(p).SHA256 != m.Plan.SHA256 {
		return []manifest.Failure{{File: manifest.ManifestName, What: "plan.sha256 does not match the recorded rules"}}
	}
	sts, err := resolveStored(p, model, plan.ResolveOptions{ExpertsPerFile: m.Layout.ExpertsPerFile, DenseShardBytes: m.Layout.DenseShardBytes, Family: fam})
	if err != nil {
		return []manifest.Failure{{File: manifest.ManifestName, What: "the recorded plan does not apply to the source: " + err.Error()}}
	}
	have := map[string]manifest.TensorEntry{}
	for _, t := range m.Tensors {
		have[t.Name] = t
	}
	var out []manifest.Failure
	for _, st := range sts {
		t, ok := have[st.name]
		if !ok {
			out = append(out, manifest.Failure{File: manifest.ManifestName, Tensor: st.name, What: "the plan stores this tensor; the checkpoint does not have it"})
			continue
		}
		delete(have, st.name)
		if t.Rule != st.rule || t.Format != st.format || !slices.Equal(t.Shape, st.shape) || t.DType != st.outDType {
			out = append(out, manifest.Failure{File: t.File, Tensor: t.Name, What: fmt.Sprintf("stored as %s %s %v by rule %d; the plan gives %s %s %v by rule %d",
				t.Format, t.DType, t.Shape, t.Rule, st.format, st.outDType, st.shape, st.rule)})
		}
	}
	for name, t := range have {
		out = append(out, manifest.Failure{File: t.File, Tensor: name, What: "not a tensor the plan stores for this source"})
	}
	return out
}

// sourceBytes gathers the source bytes a stored tensor was made from, or
// says why they cannot be read as the manifest records them.
func sourceBytes(model *safetensors.Model, t manifest.TensorEntry) (src []byte, problem string) {
	for _, ref := range t.Sources {
		sf, info, ok := model.Lookup(ref.Tensor)
		if !ok {
			return nil, fmt.Sprintf("source tensor %s is not in the source checkpoint", ref.Tensor)
		}
		if info.DType.String() != t.SourceDType {
			return nil, fmt.Sprintf("source tensor %s is %s, the manifest says %s", ref.Tensor, info.DType, t.SourceDType)
		}
		if ref.Offset < 0 || ref.Length < 0 || ref.Offset+ref.Length > info.Size() {
			return nil, fmt.Sprintf("source range [%d, %d) is outside source tensor %s (%d bytes)", ref.Offset, ref.Offset+ref.Length, ref.Tensor, info.Size())
		}
		part := make([]byte, ref.Length)
		if err := readPart(sf, ref.Tensor, part, ref.Offset); err != nil {
			return nil, fmt.Sprintf("%v", err)
		}
		src = append(src, part...)
	}
	if len(t.Sources) == 0 {
		return nil, "no source recorded"
	}
	return src, ""
}
