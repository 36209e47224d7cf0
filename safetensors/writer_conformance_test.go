package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// writerSpec is the input the reference writer was given for a w_*.safetensors
// file of the corpus.
type writerSpec struct {
	Metadata map[string]string `json:"metadata"`
	Tensors  []struct {
		Name  string  `json:"name"`
		DType string  `json:"dtype"`
		Shape []int64 `json:"shape"`
		Seed  int     `json:"seed"`
	} `json:"tensors"`
}

// specBytes generates a spec tensor's bytes as the corpus README defines
// them: byte j is (j*31 + 7 + seed*13) mod 256.
func specBytes(n int64, seed int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte((int64(j)*31 + 7 + int64(seed)*13) % 256)
	}
	return b
}

func loadSpec(t *testing.T, path string) (writerSpec, bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var s writerSpec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return s, string(raw.Metadata) != "null" && len(raw.Metadata) > 0
}

func writeSpec(t *testing.T, s writerSpec, hasMD bool, out string) error {
	t.Helper()
	w, err := Create(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range s.Tensors {
		dt, err := ParseDType(ts.DType)
		if err != nil {
			t.Fatal(err)
		}
		numel := int64(1)
		for _, d := range ts.Shape {
			numel *= d
		}
		n := (numel*int64(dt.Bits()) + 7) / 8
		if err := w.Add(ts.Name, dt, ts.Shape, specBytes(n, ts.Seed)); err != nil {
			w.Abort()
			return err
		}
	}
	if hasMD {
		md := s.Metadata
		if md == nil {
			md = map[string]string{}
		}
		w.SetMetadata(md)
	}
	return w.Close()
}

func TestWriterConformance(t *testing.T) {
	dir := testdata.Dir(t, "safetensors")
	specs, _ := filepath.Glob(filepath.Join(dir, "valid", "w_*.spec.json"))
	if len(specs) == 0 {
		t.Fatal("no writer specs found")
	}
	tmp := t.TempDir()
	identical, sameContent := 0, 0
	for _, sp := range specs {
		base := strings.TrimSuffix(filepath.Base(sp), ".spec.json")
		s, hasMD := loadSpec(t, sp)
		out := filepath.Join(tmp, base+".safetensors")
		if err := writeSpec(t, s, hasMD, out); err != nil {
			t.Errorf("%s: %v", base, err)
			continue
		}
		got, _ := os.ReadFile(out)
		want, err := os.ReadFile(filepath.Join(dir, "valid", base+".safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Metadata) <= 1 {
			if !bytes.Equal(got, want) {
				t.Errorf("%s: written bytes differ from the reference writer's (%d vs %d bytes)\n got header %q\nwant header %q",
					base, len(got), len(want), headerOf(got), headerOf(want))
				continue
			}
			identical++
			continue
		}
		// More than one metadata key: the reference's key order is random;
		// compare what a reader sees.
		if len(got) != len(want) {
			t.Errorf("%s: size %d, reference %d", base, len(got), len(want))
			continue
		}
		fg, err := Open(out)
		if err != nil {
			t.Fatalf("%s: reading back: %v", base, err)
		}
		fw, err := Open(filepath.Join(dir, "valid", base+".safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if !equalFiles(t, fg, fw) {
			t.Errorf("%s: content differs from the reference writer's", base)
		} else {
			sameContent++
		}
		fg.Close()
		fw.Close()
	}
	t.Logf("writer: %d specs; %d byte-identical, %d (multi-key metadata) identical in content", len(specs), identical, sameContent)
}

func headerOf(b []byte) string {
	if len(b) < 8 {
		return string(b)
	}
	n := int(b[0]) | int(b[1])<<8 | int(b[2])<<16
	if 8+n > len(b) {
		n = len(b) - 8
	}
	h := string(b[8 : 8+n])
	if len(h) > 400 {
		h = h[:400] + "..."
	}
	return h
}

func equalFiles(t *testing.T, a, b *File) bool {
	t.Helper()
	ta, tb := a.Tensors(), b.Tensors()
	if len(ta) != len(tb) {
		return false
	}
	for i := range ta {
		if ta[i].Name != tb[i].Name || ta[i].DType != tb[i].DType || !slices.Equal(ta[i].Shape, tb[i].Shape) ||
			ta[i].Begin != tb[i].Begin || ta[i].End != tb[i].End {
			return false
		}
		da, _ := a.ReadTensor(ta[i].Name)
		db, _ := b.ReadTensor(tb[i].Name)
		if !bytes.Equal(da, db) {
			return false
		}
	}
	ma, mb := a.Metadata(), b.Metadata()
	if len(ma) != len(mb) || (ma == nil) != (mb == nil) {
		return false
	}
	for k, v := range ma {
		if mb[k] != v {
			return false
		}
	}
	return true
}

// The reference writer's two known defects must not be reproduced.
func TestWriterAvoidsReferenceDefects(t *testing.T) {
	dir := testdata.Dir(t, "safetensors")
	tmp := t.TempDir()

	// No tensors and an empty metadata map: the reference writes a header
	// its own reader rejects; ours must write {"__metadata__":{}}.
	s, hasMD := loadSpec(t, filepath.Join(dir, "invalid", "e_writer_empty_meta_no_tensors.spec.json"))
	out := filepath.Join(tmp, "empty_meta.safetensors")
	if err := writeSpec(t, s, hasMD, out); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	want := "\x18\x00\x00\x00\x00\x00\x00\x00" + `{"__metadata__":{}}` + "     "
	if string(got) != want {
		t.Errorf("empty metadata, no tensors: wrote %q, want %q", got, want)
	}
	f, err := Open(out)
	if err != nil {
		t.Fatalf("reading back: %v", err)
	}
	if md := f.Metadata(); md == nil || len(md) != 0 {
		t.Errorf("metadata read back = %v, want empty non-nil", md)
	}
	f.Close()

	// A tensor called __metadata__ is refused before anything is written.
	s, hasMD = loadSpec(t, filepath.Join(dir, "invalid", "e_writer_reserved_name.spec.json"))
	out = filepath.Join(tmp, "reserved.safetensors")
	err = writeSpec(t, s, hasMD, out)
	if err == nil || !strings.Contains(err.Error(), "__metadata__") {
		t.Errorf("tensor named __metadata__: err = %v", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused file exists: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, ".reserved*")); len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}
