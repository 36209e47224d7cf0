package builtin

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// TestSameAsTestdata checks that the embedded files are the test data's
// files byte for byte, and that both match the checksums shipped with the
// model.
func TestSameAsTestdata(t *testing.T) {
	td := testdata.Dir(t, "models", Name)
	sums, err := os.ReadFile(filepath.Join(td, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			want[f[1]] = f[0]
		}
	}
	all := append(append([]string(nil), ModelFiles...), CalibText, EvalText)
	for _, n := range all {
		got, err := File(n)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := os.ReadFile(filepath.Join(td, n))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, ref) {
			t.Errorf("%s: the embedded copy differs from testdata's", n)
		}
		s := sha256.Sum256(got)
		if w, ok := want[n]; ok && hex.EncodeToString(s[:]) != w {
			t.Errorf("%s: sha256 %x, SHA256SUMS says %s", n, s, w)
		} else if !ok && n != "README.md" {
			t.Errorf("%s is not listed in the model's SHA256SUMS", n)
		}
	}
	dir, err := Write(filepath.Join(t.TempDir(), "m"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range all {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Errorf("Write did not write %s: %v", n, err)
		}
	}
}
