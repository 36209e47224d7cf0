package safetensors

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

type corpusCase struct {
	file, verdict, kind, note string
}

func readCases(t testing.TB, dir string) []corpusCase {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "cases.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	var out []corpusCase
	for i, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		if i == 0 {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) < 5 {
			t.Fatalf("cases.tsv line %d: %d fields", i+1, len(f))
		}
		out = append(out, corpusCase{file: f[0], verdict: f[1], kind: f[2], note: f[4]})
	}
	return out
}

// expectLine formats a tensor the way the corpus's .expect files do.
func expectLine(t TensorInfo) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range t.Name {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r >= 0x21 && r <= 0x7e:
			b.WriteRune(r)
		case r > 0xffff:
			r -= 0x10000
			fmt.Fprintf(&b, "\\u%04x\\u%04x", 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	b.WriteByte('"')
	b.WriteString(" " + t.DType.String() + " [")
	for i, d := range t.Dims() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(d, 10))
	}
	fmt.Fprintf(&b, "] %d %d", t.Begin, t.End)
	return b.String()
}

func TestConformanceCorpus(t *testing.T) {
	dir := testdata.Dir(t, "safetensors")
	cases := readCases(t, dir)
	if len(cases) != 402 {
		t.Errorf("cases.tsv has %d cases, want 402", len(cases))
	}
	var okAgree, errAgree, listed int
	for _, c := range cases {
		path := filepath.Join(dir, c.file)
		f, err := Open(path)
		if c.verdict == "ok" {
			if err != nil {
				t.Errorf("%s: rejected (%v), reference accepts (%s)", c.file, err, c.note)
				continue
			}
			okAgree++
			want, rerr := os.ReadFile(strings.TrimSuffix(path, ".safetensors") + ".expect")
			if rerr != nil {
				t.Errorf("%s: %v", c.file, rerr)
				f.Close()
				continue
			}
			var got []string
			for _, name := range f.Names() {
				ti, _ := f.Lookup(name)
				got = append(got, expectLine(ti))
			}
			wantLines := strings.Split(strings.TrimRight(string(want), "\n"), "\n")
			if len(want) == 0 {
				wantLines = nil
			}
			if strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
				t.Errorf("%s: tensor listing differs\n got: %q\nwant: %q", c.file, got, wantLines)
			} else {
				listed++
			}
			checkMeta(t, c.file, f, strings.TrimSuffix(path, ".safetensors")+".meta.json")
			f.Close()
			continue
		}
		if err == nil {
			t.Errorf("%s: accepted, reference rejects with %s (%s)", c.file, c.kind, c.note)
			f.Close()
			continue
		}
		if got := KindName(err); got != c.kind {
			t.Errorf("%s: error kind %s (%v), reference %s (%s)", c.file, got, err, c.kind, c.note)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error does not name the file: %v", c.file, err)
		}
		errAgree++
	}
	t.Logf("corpus: %d cases; %d accepted as the reference does (%d with identical tensor listings), %d rejected with the reference's error kind",
		len(cases), okAgree, listed, errAgree)
}

func checkMeta(t *testing.T, name string, f *File, metaPath string) {
	t.Helper()
	data, err := os.ReadFile(metaPath)
	md := f.Metadata()
	if os.IsNotExist(err) {
		if md != nil {
			t.Errorf("%s: metadata %v, reference has none", name, md)
		}
		return
	}
	if err != nil {
		t.Error(err)
		return
	}
	var want map[string]string
	if err := json.Unmarshal(data, &want); err != nil {
		t.Errorf("%s: %v", metaPath, err)
		return
	}
	if md == nil || len(md) != len(want) {
		t.Errorf("%s: metadata %q, want %q", name, md, want)
		return
	}
	for k, v := range want {
		if md[k] != v {
			t.Errorf("%s: metadata[%q] = %q, want %q", name, k, md[k], v)
		}
	}
}
