package calib

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/safetensors"
)

// writeTestStore writes a store of 3 sequences (lengths 5, 9, 6) with two
// sites and returns the activations written per site.
func writeTestStore(t testing.TB, dir string, opt StoreOptions) map[string][]float32 {
	t.Helper()
	lens := []int{5, 9, 6}
	ids := [][]int32{{1, 2, 3, 4, 5}, {9, 8, 7, 6, 5, 4, 3, 2, 1}, {100, 200, 300, 400, 500, 600}}
	prov := Provenance{Model: "test/model", Revision: "r1", Sequences: 3, Tokens: 20}
	w, err := CreateStore(dir, prov, lens, ids, opt)
	if err != nil {
		t.Fatal(err)
	}
	sites := map[string][]float32{}
	for _, s := range []struct {
		layer int
		name  string
		cols  int
	}{{1, SiteMoE, 12}, {0, SiteOProj, 7}} {
		sw, err := w.BeginSite(s.layer, s.name, s.cols)
		if err != nil {
			t.Fatal(err)
		}
		x := synthX(t, 20, s.cols, uint64(s.cols))
		// Write in uneven pieces: 3 rows, 0 rows, 11 rows, 6 rows.
		for _, cut := range [][2]int{{0, 3}, {3, 3}, {3, 14}, {14, 20}} {
			if err := sw.Write(x[cut[0]*s.cols : cut[1]*s.cols]); err != nil {
				t.Fatal(err)
			}
		}
		if err := sw.Close(); err != nil {
			t.Fatal(err)
		}
		sites[filepath.Join(string(rune('0'+s.layer)), s.name)] = x
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return sites
}

func TestStoreRoundTrip(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F32} {
		t.Run(dt.String(), func(t *testing.T) {
			dir := t.TempDir()
			// 4 rows of 12 columns per shard for the MoE site.
			rowBytes := int64(12 * dt.Bits() / 8)
			written := writeTestStore(t, dir, StoreOptions{DType: dt, ShardBytes: 4 * rowBytes})
			s, err := OpenStore(dir)
			if err != nil {
				t.Fatal(err)
			}
			p := s.Provenance()
			if p.Model != "test/model" || p.Revision != "r1" || p.Sequences != 3 || p.Tokens != 20 || len(p.TokenIDsSHA256) != 64 || p.Synthetic {
				t.Errorf("provenance %+v", p)
			}
			if got := s.SequenceOffsets(); len(got) != 4 || got[1] != 5 || got[2] != 14 || got[3] != 20 {
				t.Errorf("sequence offsets %v", got)
			}
			ids, err := s.TokenIDs()
			if err != nil || len(ids) != 3 || ids[1][0] != 9 || ids[2][5] != 600 {
				t.Errorf("token ids %v, %v", ids, err)
			}
			sites := s.Sites()
			if len(sites) != 2 || sites[0].Layer != 0 || sites[1].Site != SiteMoE || len(sites[1].Shards) != 5 {
				t.Fatalf("sites %+v", sites)
			}
			want := written["1/mlp"]
			for _, chunk := range []int{1, 3, 7, 100} {
				var got []float32
				next := int64(2)
				err := s.Stream(1, SiteMoE, 2, 15, chunk, func(first int64, rows []float32) error {
					if first != next || len(rows)%12 != 0 || len(rows)/12 > chunk {
						t.Fatalf("chunk at %d (expected %d) of %d values", first, next, len(rows))
					}
					next += int64(len(rows) / 12)
					got = append(got, rows...)
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != 15*12 {
					t.Fatalf("chunk %d: %d values", chunk, len(got))
				}
				for i, v := range got {
					w := want[2*12+i]
					if dt == safetensors.BF16 {
						w = safetensors.BF16ToFloat32(safetensors.Float32ToBF16(w))
					}
					if math.Float32bits(v) != math.Float32bits(w) {
						t.Fatalf("chunk %d value %d: %g, want %g", chunk, i, v, w)
					}
				}
			}
			all, err := s.ReadRows(0, SiteOProj, 0, 20)
			if err != nil || len(all) != 140 {
				t.Fatalf("ReadRows: %d values, %v", len(all), err)
			}
		})
	}
}

func TestStoreErrors(t *testing.T) {
	dir := t.TempDir()
	prov := Provenance{Model: "m", Sequences: 2, Tokens: 7}
	if _, err := CreateStore(dir, prov, []int{3, 3}, nil, StoreOptions{}); err == nil {
		t.Error("sequence lengths not matching the token count accepted")
	}
	if _, err := CreateStore(dir, prov, []int{3, 4}, [][]int32{{1, 2, 3}, {1}}, StoreOptions{}); err == nil {
		t.Error("token ids not matching the lengths accepted")
	}
	prov.TokenIDsSHA256 = "00"
	if _, err := CreateStore(dir, prov, []int{3, 4}, [][]int32{{1, 2, 3}, {1, 2, 3, 4}}, StoreOptions{}); err == nil {
		t.Error("token ids with a different hash accepted")
	}
	prov.TokenIDsSHA256 = ""
	if _, err := CreateStore(dir, prov, []int{3, 4}, nil, StoreOptions{DType: safetensors.F16}); err == nil {
		t.Error("F16 store accepted")
	}
	w, err := CreateStore(dir, prov, []int{3, 4}, nil, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.BeginSite(0, "Bad Name", 4); err == nil {
		t.Error("bad site name accepted")
	}
	sw, err := w.BeginSite(0, SiteMoE, 4)
	if err != nil {
		t.Fatal(err)
	}
	// Several sites may be open at once, but the index is not written
	// while one is.
	sw2, err := w.BeginSite(1, SiteMoE, 4)
	if err != nil {
		t.Fatalf("second open site: %v", err)
	}
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), "was not closed") {
		t.Errorf("store closed with an open site: %v", err)
	}
	sw2.Abort()
	if err := sw.Write(make([]float32, 6)); err == nil {
		t.Error("partial row accepted")
	}
	if err := sw.Write(make([]float32, 32)); err == nil {
		t.Error("more rows than tokens accepted")
	}
	if err := sw.Write(make([]float32, 24)); err != nil {
		t.Fatal(err)
	}
	if err := sw.Close(); err == nil || !strings.Contains(err.Error(), "6 rows") {
		t.Errorf("short site closed: %v", err)
	}
	if _, err := w.BeginSite(0, SiteMoE, 4); err == nil {
		t.Error("site written twice accepted")
	}

	// A good store, then corruptions of it.
	good := t.TempDir()
	writeTestStore(t, good, StoreOptions{ShardBytes: 8 * 24})
	if _, err := CreateStore(good, Provenance{Sequences: 1, Tokens: 1}, []int{1}, nil, StoreOptions{}); err == nil {
		t.Error("CreateStore over an existing store accepted")
	}
	copyStore := func() string {
		d := t.TempDir()
		ents, _ := os.ReadDir(good)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(good, e.Name()))
			os.WriteFile(filepath.Join(d, e.Name()), b, 0o644)
		}
		return d
	}
	editIndex := func(d string, f func(m map[string]any)) {
		raw, _ := os.ReadFile(filepath.Join(d, StoreIndexName))
		var m map[string]any
		json.Unmarshal(raw, &m)
		f(m)
		raw, _ = json.Marshal(m)
		os.WriteFile(filepath.Join(d, StoreIndexName), raw, 0o644)
	}
	cases := []struct {
		name string
		edit func(d string)
		want string // substring of the error (OpenStore or Stream)
	}{
		{"version", func(d string) { editIndex(d, func(m map[string]any) { m["format_version"] = 9 }) }, "version 9"},
		{"tokens", func(d string) {
			editIndex(d, func(m map[string]any) { m["provenance"].(map[string]any)["tokens"] = 21 })
		}, "sum to 20"},
		{"unknown field", func(d string) { editIndex(d, func(m map[string]any) { m["extra"] = 1 }) }, "extra"},
		{"shard gap", func(d string) {
			editIndex(d, func(m map[string]any) {
				sh := m["sites"].([]any)[1].(map[string]any)["shards"].([]any)
				sh[1].(map[string]any)["first_token"] = 9
			})
		}, "expected to start at 8"},
		{"missing shard", func(d string) { os.Remove(filepath.Join(d, "layer001.mlp.00001.safetensors")) }, "layer001.mlp.00001"},
		{"swapped shards", func(d string) {
			a, b := filepath.Join(d, "layer001.mlp.00000.safetensors"), filepath.Join(d, "layer001.mlp.00001.safetensors")
			ra, _ := os.ReadFile(a)
			rb, _ := os.ReadFile(b)
			os.WriteFile(a, rb, 0o644)
			os.WriteFile(b, ra, 0o644)
		}, "first_token"},
		{"truncated shard", func(d string) {
			p := filepath.Join(d, "layer001.mlp.00002.safetensors")
			raw, _ := os.ReadFile(p)
			os.WriteFile(p, raw[:len(raw)-2], 0o644)
		}, "layer001.mlp.00002"},
	}
	for _, c := range cases {
		d := copyStore()
		c.edit(d)
		s, err := OpenStore(d)
		if err == nil {
			_, err = s.ReadRows(1, SiteMoE, 0, 20)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.want)
		}
	}
	s, _ := OpenStore(good)
	if _, err := s.ReadRows(2, SiteMoE, 0, 1); err == nil {
		t.Error("missing site read")
	}
	if _, err := s.ReadRows(1, SiteMoE, 15, 6); err == nil {
		t.Error("rows past the end read")
	}
}

// BenchmarkStoreStream measures reading a BF16 site back as float32.
func BenchmarkStoreStream(b *testing.B) {
	const rows, cols = 8192, 2048
	dir := b.TempDir()
	w, err := CreateStore(dir, Provenance{Model: "bench", Sequences: 1, Tokens: rows}, []int{rows}, nil, StoreOptions{ShardBytes: 16 << 20})
	if err != nil {
		b.Fatal(err)
	}
	sw, _ := w.BeginSite(0, SiteMoE, cols)
	x := synthX(b, rows, cols, 3)
	if err := sw.Write(x); err != nil {
		b.Fatal(err)
	}
	if err := sw.Close(); err != nil {
		b.Fatal(err)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	s, err := OpenStore(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(rows * cols * 2)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var sum float32
		err := s.Stream(0, SiteMoE, 0, rows, 4096, func(_ int64, r []float32) error {
			sum += r[0]
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*cols*2)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// TestStoreNextTokenAlignment: a next_token site holds T−1 rows per
// sequence; the index says so and is version 2 (version 1 when every site
// is token-aligned); readers split and count its rows by sequence; an
// index or shard that contradicts the alignment is refused.
func TestStoreNextTokenAlignment(t *testing.T) {
	// Token-aligned sites only: version 1, no alignment anywhere.
	v1 := t.TempDir()
	writeTestStore(t, v1, StoreOptions{})
	raw, _ := os.ReadFile(filepath.Join(v1, StoreIndexName))
	if !strings.Contains(string(raw), `"format_version": 1`) || strings.Contains(string(raw), "alignment") {
		t.Errorf("a store of token-aligned sites is not written as version 1:\n%s", raw)
	}
	dir := t.TempDir()
	lens := []int{5, 9, 6}
	prov := Provenance{Model: "test/model", Revision: "r1", Sequences: 3, Tokens: 20}
	w, err := CreateStore(dir, prov, lens, nil, StoreOptions{DType: safetensors.F32, ShardBytes: 6 * 4 * 4})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := w.BeginSite(4, SiteAttn, 4)
	if err != nil {
		t.Fatal(err)
	}
	next, err := w.BeginAlignedSite(4, SiteMoE, 4, AlignNextToken)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.BeginAlignedSite(4, "x", 4, Alignment(0)); err == nil {
		t.Error("the zero alignment was accepted")
	}
	x := synthX(t, 20, 4, 7)
	if err := tok.Write(x); err != nil {
		t.Fatal(err)
	}
	if err := next.Write(x[:18*4]); err == nil {
		t.Error("18 rows accepted by a next_token site of 3 sequences, 20 tokens")
	}
	if err := next.Write(x[:17*4]); err != nil {
		t.Fatal(err)
	}
	for _, sw := range []*SiteWriter{tok, next} {
		if err := sw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	si, _ := s.Site(4, SiteMoE)
	if s.FormatVersion() != 2 || si.Alignment != AlignNextToken || si.Tokens != 17 || len(si.Shards) != 3 {
		t.Fatalf("version %d, site %+v", s.FormatVersion(), si)
	}
	if ro := s.RowOffsets(si); ro[1] != 4 || ro[2] != 12 || ro[3] != 17 {
		t.Errorf("row offsets %v, want [0 4 12 17]", ro)
	}
	for _, c := range [][2]int64{{0, 0}, {3, 3}, {5, 4}, {6, 5}, {7, 6}, {13, 12}, {14, 12}, {19, 17}, {20, 17}, {21, 18}} {
		if got := s.RowsBefore(si, c[0]); got != c[1] {
			t.Errorf("rows of the first %d tokens: %d, want %d", c[0], got, c[1])
		}
	}
	cal, held, err := s.LoadActivations(4, SiteMoE, 1)
	if err != nil || cal.Tokens != 12 || held.Tokens != 5 || held.X[0] != x[12*4] {
		t.Errorf("split: %d + %d rows (%v)", cal.Tokens, held.Tokens, err)
	}
	if h, err := s.SiteHessian(context.Background(), 4, SiteMoE, 14); err != nil || h.Tokens() != 12 {
		t.Errorf("Hessian of the first 2 sequences: %v", err)
	}
	if _, err := s.SiteHessian(context.Background(), 4, SiteMoE, 21); err == nil {
		t.Error("Hessian over more tokens than the store holds accepted")
	}
	if err := s.Check(context.Background(), true); err != nil {
		t.Fatal(err)
	}

	// Contradictions.
	edit := func(f func(m map[string]any)) string {
		d := t.TempDir()
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			os.WriteFile(filepath.Join(d, e.Name()), b, 0o644)
		}
		raw, _ := os.ReadFile(filepath.Join(d, StoreIndexName))
		var m map[string]any
		json.Unmarshal(raw, &m)
		f(m)
		raw, _ = json.Marshal(m)
		os.WriteFile(filepath.Join(d, StoreIndexName), raw, 0o644)
		return d
	}
	site := func(m map[string]any) map[string]any {
		for _, s := range m["sites"].([]any) {
			if s.(map[string]any)["site"] == SiteMoE {
				return s.(map[string]any)
			}
		}
		return nil
	}
	for _, c := range []struct {
		name string
		f    func(m map[string]any)
		want string
	}{
		{"version 1 with an alignment", func(m map[string]any) { m["format_version"] = 1 }, "format version 1 does not have"},
		{"unknown alignment", func(m map[string]any) { site(m)["alignment"] = "previous_token" }, "previous_token"},
		{"token rows", func(m map[string]any) { delete(site(m), "alignment") }, "token-aligned"},
	} {
		if _, err := OpenStore(edit(c.f)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// A next_token shard listed as token-aligned (row counts adjusted) is
	// refused by its metadata.
	d := edit(func(m map[string]any) {
		s := site(m)
		delete(s, "alignment")
		s["tokens"] = 20
		sh := s["shards"].([]any)
		sh[len(sh)-1].(map[string]any)["tokens"] = 8
	})
	st, err := OpenStore(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(context.Background(), false); err == nil || !strings.Contains(err.Error(), "alignment") {
		t.Errorf("shard of another alignment: %v", err)
	}
}

// TestAddWrittenSite: a resumed writer lists sites already on disk after
// checking their shards.
func TestAddWrittenSite(t *testing.T) {
	dir := t.TempDir()
	lens := []int{5, 9, 6}
	prov := Provenance{Model: "test/model", Revision: "r1", Sequences: 3, Tokens: 20}
	opt := StoreOptions{DType: safetensors.F32, ShardBytes: 8 * 3 * 4}
	w, err := CreateStore(dir, prov, lens, nil, opt)
	if err != nil {
		t.Fatal(err)
	}
	sw, _ := w.BeginAlignedSite(2, SiteMoE, 3, AlignNextToken)
	if err := sw.Write(synthX(t, 17, 3, 1)); err != nil {
		t.Fatal(err)
	}
	if err := sw.Close(); err != nil {
		t.Fatal(err)
	}
	info := sw.Info()
	w.Abort()
	// A second writer over the same directory adopts the site.
	w2, err := CreateStore(dir, prov, lens, nil, opt)
	if err != nil {
		t.Fatal(err)
	}
	bad := info
	bad.Shards = append([]ShardInfo(nil), info.Shards...)
	bad.Shards[1].File = info.Shards[0].File
	if err := w2.AddWrittenSite(bad); err == nil {
		t.Error("a site whose shard list names the wrong file was accepted")
	}
	bad = info
	bad.Alignment = AlignToken
	if err := w2.AddWrittenSite(bad); err == nil {
		t.Error("a site with the wrong alignment was accepted")
	}
	if err := w2.AddWrittenSite(info); err != nil {
		t.Fatal(err)
	}
	if err := w2.AddWrittenSite(info); err == nil {
		t.Error("a site added twice was accepted")
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(context.Background(), true); err != nil {
		t.Error(err)
	}
}
