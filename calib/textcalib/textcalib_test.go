package textcalib

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/model"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/safetensors"
)

func trainedOptions(t *testing.T, out string, seqs, seqLen int) Options {
	t.Helper()
	dir := testdata.Dir(t, "models", "tiny-qwen36-trained")
	spec, err := dataset.ParseSpec(filepath.Join(dir, "calib.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	return Options{Model: dir, Out: out, Data: spec,
		DataOptions: dataset.Options{EvalFraction: dataset.DefaultEvalFraction, Seed: 1,
			Calibration: dataset.SetOptions{Sequences: seqs, SeqLen: seqLen, Mode: dataset.ModePack}},
		Store: calib.StoreOptions{DType: safetensors.F32}}
}

// TestBuildFromText: a store built from the trained model's calibration
// text holds every trunk layer's sites, exactly the activations an
// independent run of the forward pass gives (F32 store), no MTP sites, and
// provenance naming the text, the model and the token ids.
func TestBuildFromText(t *testing.T) {
	out := filepath.Join(t.TempDir(), "store")
	opt := trainedOptions(t, out, 3, 32)
	res, err := Build(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	st := res.Store
	m, err := forward.Open(opt.Model)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cfg := m.Config
	p := st.Provenance()
	if p.Synthetic || p.Sequences != 3 || p.Tokens != 96 || p.Model != "tiny-qwen36-trained" {
		t.Errorf("provenance %+v", p)
	}
	if id, err := calib.ModelIdentity(opt.Model); err != nil || p.Revision != id || !strings.HasPrefix(id, "sha256:") {
		t.Errorf("model identity %q, provenance %q (%v)", id, p.Revision, err)
	}
	var data dataset.Provenance
	if err := json.Unmarshal(p.Data, &data); err != nil {
		t.Fatalf("provenance data: %v", err)
	}
	if len(data.Sources) != 1 || len(data.Sources[0].Files) != 1 || len(data.Sources[0].Files[0].SHA256) != 64 ||
		data.Calibration == nil || data.Calibration.TokenIDsSHA256 != p.TokenIDsSHA256 || data.Options.Calibration.SeqLen != 32 {
		t.Errorf("text provenance %+v", data)
	}
	ids, err := st.TokenIDs()
	if err != nil {
		t.Fatal(err)
	}
	if calib.HashTokenIDs(ids) != p.TokenIDsSHA256 {
		t.Error("the stored token ids do not hash to the provenance's token-id hash")
	}
	// Every layer has mlp, attn and its mixer's output-projection input:
	// one row per token for the trunk, one per token with a successor for
	// the MTP layer.
	if st.FormatVersion() != 2 {
		t.Errorf("a store with MTP sites has format version %d, want 2", st.FormatVersion())
	}
	for l := 0; l < cfg.NumLayers(); l++ {
		out := calib.SiteOutProj
		if cfg.Kind(l) == model.FullAttention {
			out = calib.SiteOProj
		}
		rows, align := int64(96), calib.AlignToken
		if l >= cfg.Layers {
			rows, align = 93, calib.AlignNextToken
		}
		for _, s := range []string{calib.SiteMoE, calib.SiteAttn, out} {
			si, ok := st.Site(l, s)
			if !ok || si.Tokens != rows || si.Alignment != align || (s != out && si.Cols != cfg.Hidden) {
				t.Errorf("layer %d site %s: %+v (present %v)", l, s, si, ok)
			}
		}
	}
	// An independent forward over the same token ids gives the same rows.
	var x []float32
	lens := make([]int, len(ids))
	for i, s := range ids {
		e, err := m.Embed(s)
		if err != nil {
			t.Fatal(err)
		}
		x = append(x, e...)
		lens[i] = len(s)
	}
	b := &forward.Batch{Lens: lens, X: x}
	want := map[string][]float32{}
	const layer = 2
	for l := 0; l <= layer; l++ {
		ly, err := m.Layer(l)
		if err != nil {
			t.Fatal(err)
		}
		err = ly.Forward(b, func(a *forward.Activations) error {
			if l == layer && a.Site == forward.SiteMLPIn {
				want[calib.SiteMoE] = append(want[calib.SiteMoE], a.X[:a.Rows*a.Cols]...)
			}
			if l == layer && a.Site == forward.SiteAttnIn {
				want[calib.SiteAttn] = append(want[calib.SiteAttn], a.X[:a.Rows*a.Cols]...)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for site, w := range want {
		got, err := st.ReadRows(layer, site, 0, 96)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(w) {
			t.Fatalf("layer %d %s: %d values, want %d", layer, site, len(got), len(w))
		}
		for i := range got {
			if got[i] != w[i] {
				t.Fatalf("layer %d %s value %d: %v, the forward pass gives %v", layer, site, i, got[i], w[i])
			}
		}
	}
}

// TestBuildRefusals: no calibration sequences, an existing store and a
// data set too small for the request are refused.
func TestBuildRefusals(t *testing.T) {
	out := filepath.Join(t.TempDir(), "store")
	opt := trainedOptions(t, out, 0, 32)
	if _, err := Build(context.Background(), opt); !errors.Is(err, ErrNoCalibration) {
		t.Errorf("no sequences: %v", err)
	}
	opt = trainedOptions(t, out, 1, 16)
	if _, err := Build(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(context.Background(), opt); err == nil || !strings.Contains(err.Error(), "already holds") {
		t.Errorf("existing store: %v", err)
	}
	big := filepath.Join(t.TempDir(), "big")
	opt = trainedOptions(t, big, 100000, 2048)
	if _, err := Build(context.Background(), opt); err == nil {
		t.Error("a request for more tokens than the text holds was not refused")
	}
	if _, err := os.Stat(big); !os.IsNotExist(err) {
		t.Errorf("refused build left %s behind (%v)", big, err)
	}
}

// TestMTPRowsAlign pins the alignment docs/calibration.md describes for
// the MTP layer, which is why a store (one row per token) holds no MTP
// sites: a sequence of T tokens has T−1 MTP rows, row t combining the
// final hidden state at t with the embedding of token t+1, so the last
// token has no row and the first token's id is never read.
func TestMTPRowsAlign(t *testing.T) {
	m, err := forward.Open(testdata.Dir(t, "models", "tiny-qwen36-trained"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	H := m.Config.Hidden
	ids := []int32{11, 22, 33, 44, 55, 66}
	T := len(ids)
	hf := make([]float32, T*H)
	for i := range hf {
		hf[i] = float32(i%7) - 3
	}
	base, err := m.MTPInput(ids, hf)
	if err != nil {
		t.Fatal(err)
	}
	if len(base) != (T-1)*H {
		t.Fatalf("%d MTP values for %d tokens, want %d rows", len(base), T, T-1)
	}
	changed := func(got []float32) []int {
		var rows []int
		for r := 0; r < T-1; r++ {
			for c := 0; c < H; c++ {
				if got[r*H+c] != base[r*H+c] {
					rows = append(rows, r)
					break
				}
			}
		}
		return rows
	}
	try := func(what string, ids []int32, hf []float32, want []int) {
		t.Helper()
		got, err := m.MTPInput(ids, hf)
		if err != nil {
			t.Fatal(err)
		}
		if rows := changed(got); len(rows) != len(want) || (len(want) == 1 && rows[0] != want[0]) {
			t.Errorf("%s changed MTP rows %v, want %v", what, rows, want)
		}
	}
	// Token t+1's embedding feeds row t.
	ids2 := append([]int32(nil), ids...)
	ids2[3] = 99
	try("token 3", ids2, hf, []int{2})
	ids2 = append([]int32(nil), ids...)
	ids2[0] = 99
	try("token 0", ids2, hf, nil)
	// The hidden state at t feeds row t; the last one feeds nothing.
	hf2 := append([]float32(nil), hf...)
	hf2[2*H] += 1
	try("hidden state 2", ids, hf2, []int{2})
	hf2 = append([]float32(nil), hf...)
	hf2[(T-1)*H] += 1
	try("the last hidden state", ids, hf2, nil)
}

// TestMTPSitesMatchForward: the MTP layer's stored rows are exactly the
// rows forward.MTPInput and MTPHead give (F32 store): T−1 rows per
// sequence, sequence s starting at row offset_s − s, and the readers split
// and count them by sequence.
func TestMTPSitesMatchForward(t *testing.T) {
	out := filepath.Join(t.TempDir(), "store")
	opt := trainedOptions(t, out, 3, 32)
	res, err := Build(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	st := res.Store
	if res.MTPLayers != 1 || res.MTPSkipped != 0 {
		t.Errorf("result: %d MTP layers with sites, %d skipped", res.MTPLayers, res.MTPSkipped)
	}
	m, err := forward.Open(opt.Model)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	L, H := m.Config.Layers, m.Config.Hidden
	ids, err := st.TokenIDs()
	if err != nil {
		t.Fatal(err)
	}
	var x []float32
	lens := make([]int, len(ids))
	for i, s := range ids {
		e, err := m.Embed(s)
		if err != nil {
			t.Fatal(err)
		}
		x = append(x, e...)
		lens[i] = len(s)
	}
	if err := m.Trunk(&forward.Batch{Lens: lens, X: x}, nil, nil); err != nil {
		t.Fatal(err)
	}
	var z []float32
	mlens := make([]int, len(ids))
	off := 0
	for s, n := range lens {
		hf, err := m.FinalNorm(x[off*H : (off+n)*H])
		if err != nil {
			t.Fatal(err)
		}
		zs, err := m.MTPInput(ids[s], hf)
		if err != nil {
			t.Fatal(err)
		}
		z = append(z, zs...)
		mlens[s] = n - 1
		off += n
	}
	want := map[string][]float32{}
	_, err = m.MTPHead(&forward.Batch{Lens: mlens, X: z}, func(a *forward.Activations) error {
		name := map[forward.Site]string{forward.SiteAttnIn: calib.SiteAttn, forward.SiteMLPIn: calib.SiteMoE, forward.SiteAttnOut: calib.SiteOProj}[a.Site]
		if name != "" {
			want[name] = append(want[name], a.X[:a.Rows*a.Cols]...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, site := range []string{calib.SiteAttn, calib.SiteMoE, calib.SiteOProj} {
		si, _ := st.Site(L, site)
		got, err := st.ReadRows(L, site, 0, si.Tokens)
		if err != nil {
			t.Fatal(err)
		}
		w := want[site]
		if len(got) != len(w) || len(w) != 93*si.Cols {
			t.Fatalf("MTP %s: %d values, the forward pass gives %d (want 93 rows of %d)", site, len(got), len(w), si.Cols)
		}
		for i := range got {
			if got[i] != w[i] {
				t.Fatalf("MTP %s value %d (row %d): %v, the forward pass gives %v", site, i, i/si.Cols, got[i], w[i])
			}
		}
	}
	// The MTP input of slot t of sequence 1 is stored at row 31 + t.
	si, _ := st.Site(L, calib.SiteMoE)
	if ro := st.RowOffsets(si); len(ro) != 4 || ro[0] != 0 || ro[1] != 31 || ro[2] != 62 || ro[3] != 93 {
		t.Errorf("MTP row offsets %v, want [0 31 62 93]", ro)
	}
	if n := st.RowsBefore(si, 64); n != 62 {
		t.Errorf("rows of the first 64 tokens: %d, want 62", n)
	}
	if n := st.RowsBefore(si, 40); n != 31+8 {
		t.Errorf("rows of the first 40 tokens: %d, want 39", n)
	}
	cal, held, err := st.LoadActivations(L, calib.SiteMoE, 1)
	if err != nil || cal.Tokens != 62 || held.Tokens != 31 {
		t.Errorf("MTP split: %d calibration and %d held-out rows (%v), want 62 and 31", cal.Tokens, held.Tokens, err)
	}
	h, err := st.SiteHessian(context.Background(), L, calib.SiteAttn, 64)
	if err != nil || h.Tokens() != 62 {
		t.Errorf("MTP Hessian over the first 2 sequences: %v rows (%v), want 62", h, err)
	}
	if err := st.Check(context.Background(), true); err != nil {
		t.Error(err)
	}
}

// TestShortData: text that gives fewer tokens than sequences × seq-len is
// refused with the numbers, before anything is written, unless AllowShort
// is set: then the build uses the whole sequences the text gives.
func TestShortData(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "short.jsonl")
	var recs []string
	for i := 0; i < 6; i++ {
		recs = append(recs, fmt.Sprintf(`{"corpus": "prose", "text": "record %d: a few words of text to calibrate on"}`, i))
	}
	if err := os.WriteFile(data, []byte(strings.Join(recs, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := dataset.ParseSpec(data)
	if err != nil {
		t.Fatal(err)
	}
	// Pack and record mode with too few records; record mode with enough
	// records, all shorter than the sequence length.
	for _, c := range []struct {
		mode dataset.Mode
		seqs int
	}{{dataset.ModePack, 8}, {dataset.ModeRecord, 8}, {dataset.ModeRecord, 4}} {
		mode := c.mode
		t.Run(fmt.Sprintf("%s-%d", mode, c.seqs), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "store")
			opt := trainedOptions(t, out, c.seqs, 32)
			opt.Data = spec
			opt.DataOptions.EvalFraction = 0.01
			opt.DataOptions.Calibration.Mode = mode
			_, err := Build(context.Background(), opt)
			if !errors.Is(err, ErrShortData) || !strings.Contains(err.Error(), fmt.Sprintf("%d sequences × 32 tokens = %d tokens", c.seqs, 32*c.seqs)) || !strings.Contains(err.Error(), "allow-short") {
				t.Fatalf("short text: %v", err)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("refused build left %s behind (%v)", out, err)
			}
			opt.AllowShort = true
			var msgs []string
			opt.Progress = func(m string) { msgs = append(msgs, m) }
			res, err := Build(context.Background(), opt)
			if err != nil {
				t.Fatal(err)
			}
			p := res.Store.Provenance()
			if res.AskedTokens != int64(32*c.seqs) || p.Tokens >= res.AskedTokens || p.Tokens == 0 || !strings.Contains(strings.Join(msgs, "\n"), "--allow-short") {
				t.Errorf("allow-short: %d sequences, %d tokens of %d asked; progress %q", p.Sequences, p.Tokens, res.AskedTokens, msgs)
			}
			if mode == dataset.ModePack && (p.Sequences == 0 || p.Tokens != int64(32*p.Sequences)) {
				t.Errorf("pack mode: %d sequences of %d tokens, want whole sequences of 32", p.Sequences, p.Tokens)
			}
		})
	}
}

// TestUnsupportedConfigRefused: a model whose config.json the forward pass
// does not support is refused from the config alone — its weights file is
// not even a safetensors file — and no store is created.
func TestUnsupportedConfigRefused(t *testing.T) {
	src := testdata.Dir(t, "models", "tiny-qwen36-trained")
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, from, to, want string
	}{
		{"rope", `"rope_type": "default"`, `"rope_type": "yarn"`, "rope"},
		{"heads", `"num_key_value_heads": 1`, `"num_key_value_heads": 3`, "num_key_value_heads"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := strings.Replace(string(raw), c.from, c.to, 1)
			if cfg == string(raw) {
				t.Fatalf("config has no %s", c.from)
			}
			for name, data := range map[string][]byte{"config.json": []byte(cfg), "model.safetensors": []byte("not weights")} {
				if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
				b, err := os.ReadFile(filepath.Join(src, name))
				if err != nil {
					t.Fatal(err)
				}
				os.WriteFile(filepath.Join(dir, name), b, 0o644)
			}
			out := filepath.Join(t.TempDir(), "store")
			opt := trainedOptions(t, out, 1, 16)
			opt.Model = dir
			_, err := Build(context.Background(), opt)
			var ce *model.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("unsupported config: %v, want a config error naming %s", err, c.want)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("refused build created %s (%v)", out, err)
			}
		})
	}
}
