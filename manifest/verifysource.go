package manifest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/safetensors"
)

// verifySource compares a checkpoint with its source: the source files'
// identity and every stored tensor against the source values.
func verifySource(ctx context.Context, dir string, m *Manifest, opt VerifyOptions) ([]Failure, error) {
	model, err := safetensors.OpenModel(opt.Source)
	if err != nil {
		return nil, err
	}
	defer model.Close()
	var out []Failure
	shards, index, configs, err := sourceFiles(opt.Source, model)
	if err != nil {
		return nil, err
	}
	all := append(append([]string(nil), shards...), configs...)
	if index != "" {
		all = append(all, index)
	}
	have := make([]FileEntry, len(all))
	if err := parallelFor(ctx, len(all), opt.Workers, func(i int) error {
		n, sum, err := hashFile(all[i])
		have[i] = FileEntry{Name: filepath.Base(all[i]), Size: n, SHA256: sum}
		return err
	}); err != nil {
		return nil, err
	}
	byName := map[string]FileEntry{}
	for _, h := range have {
		byName[h.Name] = h
	}
	want := append([]FileEntry(nil), m.Source.Files...)
	if m.Source.Index != nil {
		want = append(want, *m.Source.Index)
	}
	for _, w := range want {
		h, ok := byName[w.Name]
		switch {
		case !ok:
			out = append(out, Failure{File: "source/" + w.Name, What: "the checkpoint was built from this file; the given source has none"})
		case h.SHA256 != w.SHA256 || h.Size != w.Size:
			out = append(out, Failure{File: "source/" + w.Name, What: fmt.Sprintf("differs from the file the checkpoint was built from (sha256 %.16s, recorded %.16s)", h.SHA256, w.SHA256)})
		}
	}

	stats := map[string]MatrixStats{}
	for _, s := range m.TTQuant.Matrices {
		stats[s.Tensor] = s
	}
	ts := append([]TensorEntry(nil), m.Tensors...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	res := make([][]Failure, len(ts))
	err = parallelFor(ctx, len(ts), opt.Workers, func(i int) error {
		res[i] = checkAgainstSource(dir, model, ts[i], stats)
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

func checkAgainstSource(dir string, model *safetensors.Model, t TensorEntry, stats map[string]MatrixStats) []Failure {
	var out []Failure
	bad := func(format string, args ...any) {
		out = append(out, Failure{File: t.File, Tensor: t.Name, What: fmt.Sprintf(format, args...)})
	}
	var src []byte
	for _, ref := range t.Sources {
		sf, info, ok := model.Lookup(ref.Tensor)
		if !ok {
			bad("source tensor %s is not in the source checkpoint", ref.Tensor)
			return out
		}
		if info.DType.String() != t.SourceDType {
			bad("source tensor %s is %s, the manifest says %s", ref.Tensor, info.DType, t.SourceDType)
			return out
		}
		if ref.Offset < 0 || ref.Length < 0 || ref.Offset+ref.Length > info.Size() {
			bad("source range [%d, %d) is outside source tensor %s (%d bytes)", ref.Offset, ref.Offset+ref.Length, ref.Tensor, info.Size())
			return out
		}
		part := make([]byte, ref.Length)
		if err := readPart(sf, ref.Tensor, part, ref.Offset); err != nil {
			bad("%v", err)
			return out
		}
		src = append(src, part...)
	}
	if len(t.Sources) == 0 {
		bad("no source recorded")
		return out
	}
	stored := make([]byte, t.Length)
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(t.File)))
	if err != nil {
		bad("cannot open: %v", err)
		return out
	}
	_, err = f.ReadAt(stored, t.Offset)
	f.Close()
	if err != nil {
		return out // size problems are reported by the file checks
	}
	fm, isBFP := parseBFP(t.Format)
	if !isBFP && t.DType == t.SourceDType {
		if !bytes.Equal(src, stored) {
			bad("differs from the source tensor's bytes")
		}
		return out
	}
	vals, err := decodeFloats(t.SourceDType, src)
	if err != nil {
		bad("source: %v", err)
		return out
	}
	if allFinite(vals) != t.Finite {
		bad("the manifest says the source is finite=%v, it is %v", t.Finite, allFinite(vals))
	}
	if !isBFP {
		if (t.DType != "BF16" && t.DType != "F32") || !bytes.Equal(encodeFloat(t.DType, vals), stored) {
			bad("is not the %s rounding of the source", t.DType)
		}
		return out
	}
	tile, err := bfp.ParseTile(t.Tile)
	if err != nil {
		return out
	}
	switch t.Method {
	case MethodRTN:
		want, err := packBFP(fm, tile, vals, t.Shape, t.Orientation)
		if err != nil {
			bad("packing the source: %v", err)
		} else if !bytes.Equal(want, stored) {
			bad("RTN tensor is not what %s packing of the source gives", t.Format)
		}
		if s, ok := stats[t.Name]; ok {
			q, err := unpackBFP(fm, tile, stored, t.Shape, t.Orientation)
			if err == nil && sqErr(vals, q) != s.Error {
				bad("error against the source is %g, the manifest records %g", sqErr(vals, q), s.Error)
			}
		}
	case MethodGPTQ:
		q, err := unpackBFP(fm, tile, stored, t.Shape, t.Orientation)
		if err != nil {
			bad("decode: %v", err)
			return out
		}
		again, err := packBFP(fm, tile, q, t.Shape, t.Orientation)
		if err != nil || !bytes.Equal(again, stored) {
			bad("GPTQ values are not exactly representable: re-packing the decoded values changes the bytes")
		}
		s, ok := stats[t.Name]
		if !ok {
			bad("GPTQ tensor without statistics in the manifest")
		} else if e := sqErr(vals, q); e != s.Error {
			bad("error against the source is %g, the manifest records %g", e, s.Error)
		}
	}
	return out
}
