package main

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/safetensors"
)

// TestVerifyReportsNonFinite: a checkpoint stored with --allow-nonfinite
// from a source holding a NaN verifies, and verify says which tensors hold
// non-finite values, in text and in --json.
func TestVerifyReportsNonFinite(t *testing.T) {
	root, model := builtinModel(t)
	path := filepath.Join(model, "model.safetensors")
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var victim safetensors.TensorInfo
	for _, ti := range f.Tensors() {
		if ti.DType == safetensors.BF16 && strings.HasSuffix(ti.Name, "norm.weight") {
			victim = ti
			break
		}
	}
	off := f.DataOffset() + victim.Begin + 6
	f.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(b[off:], 0x7fc0)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(root, "ckpt")
	if code, so, se := runCLI(t, "convert", "--model", model, "--out", ckpt, "--allow-nonfinite", "--quiet"); code != exitOK {
		t.Fatalf("convert --allow-nonfinite: status %d\n%s\n%s", code, so, se)
	}
	code, so, _ := runCLI(t, "verify", ckpt)
	if code != exitOK || !strings.Contains(so, "NONFINITE") || !strings.Contains(so, victim.Name) {
		t.Errorf("verify: status %d, does not name the non-finite tensor %s:\n%s", code, victim.Name, so)
	}
	code, so, _ = runCLI(t, "verify", ckpt, "--json")
	var rep struct {
		OK        bool     `json:"ok"`
		NonFinite []string `json:"nonfinite_tensors"`
	}
	if code != exitOK || json.Unmarshal([]byte(so), &rep) != nil || !rep.OK || len(rep.NonFinite) != 1 || rep.NonFinite[0] != victim.Name {
		t.Errorf("verify --json: status %d, %+v\n%s", code, rep, so)
	}
}
