package main

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cmpWriteST writes a minimal safetensors file; tensors maps a name to
// dtype, shape and little-endian data.
type cmpTensor struct {
	dtype string
	shape []int64
	data  []byte
}

func cmpWriteST(t *testing.T, path string, tensors map[string]cmpTensor) {
	t.Helper()
	hdr := map[string]any{}
	var data []byte
	// Deterministic order: sorted names.
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	for i := 1; i < len(names); i++ {
		for j := i; j > 0 && names[j] < names[j-1]; j-- {
			names[j], names[j-1] = names[j-1], names[j]
		}
	}
	for _, n := range names {
		ts := tensors[n]
		hdr[n] = map[string]any{"dtype": ts.dtype, "shape": ts.shape, "data_offsets": []int{len(data), len(data) + len(ts.data)}}
		data = append(data, ts.data...)
	}
	h, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	if err := os.WriteFile(path, append(append(out, h...), data...), 0o644); err != nil {
		t.Fatal(err)
	}
}

func cmpLogits(x []float32, bf16 bool) cmpTensor {
	var b []byte
	for _, v := range x {
		if bf16 {
			b = binary.LittleEndian.AppendUint16(b, uint16(math.Float32bits(v)>>16))
		} else {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	if bf16 {
		return cmpTensor{"BF16", nil, b}
	}
	return cmpTensor{"F32", nil, b}
}

func TestCompareCommand(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const tokens, vocab = 12, 50
	ref := make([]float32, tokens*vocab)
	cand := make([]float32, tokens*vocab)
	for i := range ref {
		ref[i] = math.Float32frombits(math.Float32bits(float32(r.NormFloat64()*3)) &^ 0xffff)
		cand[i] = ref[i] + float32(r.NormFloat64()*0.2)
	}
	var tgt []byte
	for i := 0; i < tokens; i++ {
		tgt = binary.LittleEndian.AppendUint64(tgt, uint64(r.IntN(vocab)))
	}
	dir := t.TempDir()
	refT := cmpLogits(ref, true)
	refT.shape = []int64{tokens, vocab}
	candT := cmpLogits(cand, false)
	candT.shape = []int64{tokens, vocab}
	refPath := filepath.Join(dir, "ref.safetensors")
	candPath := filepath.Join(dir, "cand.safetensors")
	tgtPath := filepath.Join(dir, "targets.safetensors")
	cmpWriteST(t, refPath, map[string]cmpTensor{"logits": refT})
	cmpWriteST(t, candPath, map[string]cmpTensor{"logits": candT})
	cmpWriteST(t, tgtPath, map[string]cmpTensor{"ids": {"I64", []int64{tokens}, tgt}})
	labels := filepath.Join(dir, "labels.txt")
	os.WriteFile(labels, []byte(strings.Repeat("wiki\ncode\n", tokens/2)), 0o644)

	code, out, errs := runCLI(t, "compare", "--reference", refPath, "--candidate", candPath, "--targets", tgtPath, "--corpus", labels, "--chunk", "5")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "| Corpus | Tokens | PPL (reference) | PPL (candidate) | ΔPPL | Top-1 agreement | Mean KL |") ||
		!strings.HasPrefix(lines[2], "| code | 6 |") || !strings.HasPrefix(lines[3], "| wiki | 6 |") || !strings.HasPrefix(lines[4], "| **Overall** | 12 |") {
		t.Errorf("table:\n%s", out)
	}

	code, out, errs = runCLI(t, "compare", "--reference", refPath, "--candidate", candPath, "--targets", tgtPath, "--json")
	if code != exitOK {
		t.Fatalf("--json: status %d: %s", code, errs)
	}
	var doc compareDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if doc.SchemaVersion != schemaVersion || doc.Tokens != tokens || doc.Vocab != vocab || len(doc.Rows) != 1 {
		t.Fatalf("doc %+v", doc)
	}
	o := doc.Rows[0]
	if o.RefPPL == nil || o.CandPPL == nil || o.MeanKL == nil || *o.MeanKL <= 0 || o.PPLTokens != tokens || o.P99KL == nil || *o.P99KL < *o.MeanKL {
		t.Errorf("overall row %+v", o)
	}

	// Identical runs: ΔPPL 0, top-1 1, KL 0.
	code, out, errs = runCLI(t, "compare", "--reference", refPath, "--candidate", refPath, "--targets", tgtPath, "--json")
	if code != exitOK {
		t.Fatalf("identical: status %d: %s", code, errs)
	}
	doc = compareDoc{}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	o = doc.Rows[0]
	if *o.DeltaPPLPercent != 0 || *o.Top1Agreement != 1 || *o.MeanKL != 0 || o.P99KL == nil || *o.P99KL != 0 {
		t.Errorf("identical runs: %+v", o)
	}

	// Usage and input errors.
	if code, _, _ := runCLI(t, "compare", "--reference", refPath); code != exitUsage {
		t.Errorf("missing --candidate: status %d", code)
	}
	os.WriteFile(labels, []byte("wiki\n\ncode\n"), 0o644)
	if code, _, errs := runCLI(t, "compare", "--reference", refPath, "--candidate", candPath, "--corpus", labels); code != exitError || !strings.Contains(errs, "line 2 is empty") {
		t.Errorf("bad labels: status %d, %s", code, errs)
	}
	os.WriteFile(labels, []byte("wiki\ncode\n"), 0o644)
	if code, _, errs := runCLI(t, "compare", "--reference", refPath, "--candidate", candPath, "--corpus", labels); code != exitError || !strings.Contains(errs, "2 corpus labels for the 12 tokens") {
		t.Errorf("short labels: status %d, %s", code, errs)
	}
	other := filepath.Join(dir, "other.safetensors")
	o2 := cmpLogits(ref[:tokens*10], false)
	o2.shape = []int64{tokens, 10}
	cmpWriteST(t, other, map[string]cmpTensor{"logits": o2})
	if code, _, errs := runCLI(t, "compare", "--reference", refPath, "--candidate", other); code != exitError || !strings.Contains(errs, "same tokens and vocabulary") {
		t.Errorf("vocabulary mismatch: status %d, %s", code, errs)
	}
}
