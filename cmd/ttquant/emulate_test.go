package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/emulator"
	"github.com/ttquant/ttquant/internal/testmodel"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

// emuCheckpoint converts the tiny test model to a native checkpoint and
// returns its directory and a 2-D BFP weight stored in it.
func emuCheckpoint(t *testing.T) (string, *emulator.StoredTensor) {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "model")
	if err := testmodel.Write(src, testmodel.Tiny(), testmodel.Default); err != nil {
		t.Fatal(err)
	}
	pl, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "native")
	if _, err := build.Convert(context.Background(), build.BuildOptions{Source: src, Out: out, Plan: pl}); err != nil {
		t.Fatal(err)
	}
	c, err := manifest.OpenCheckpoint(out)
	if err != nil {
		t.Fatal(err)
	}
	lookup := emulator.CheckpointLookup(c)
	for _, name := range c.Names() {
		st, err := lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(st.Format, "BFP") && len(st.Layout.Shape) == 2 && st.Layout.Shape[0] > 32 && st.Layout.Shape[1] > 32 {
			return out, st
		}
	}
	t.Fatal("no 2-D BFP tensor in the tiny checkpoint")
	return "", nil
}

func TestEmulateCheckAndMatmul(t *testing.T) {
	ckpt, st := emuCheckpoint(t)
	want, err := emulator.EmulatedDecode(st)
	if err != nil {
		t.Fatal(err)
	}
	// A dump equal to the emulated decode, as F32, with one bit flipped at
	// element [33, 5].
	rows, cols := int(st.Layout.Shape[0]), int(st.Layout.Shape[1])
	dumpDir := t.TempDir()
	writeDump := func(flip int) {
		var data []byte
		for i, h := range want {
			b := uint32(h) << 16
			if i == flip {
				b ^= 1 << 16
			}
			data = binary.LittleEndian.AppendUint32(data, b)
		}
		if err := safetensors.WriteFile(filepath.Join(dumpDir, "dump.safetensors"), []safetensors.Tensor{{Name: st.Name, DType: safetensors.F32, Shape: st.Layout.Shape, Data: data}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	writeDump(-1)
	code, out, errs := runCLI(t, "emulate", "check", "--checkpoint", ckpt, "--dump", dumpDir)
	if code != exitOK || !strings.Contains(out, st.Name+": ok") {
		t.Fatalf("clean dump: status %d\n%s%s", code, out, errs)
	}
	writeDump(33*cols + 5)
	code, out, errs = runCLI(t, "emulate", "check", "--checkpoint", ckpt, "--dump", dumpDir)
	pr, pc := 33, 5
	if st.Layout.Transposed {
		pr, pc = pc, pr
	}
	tile := "tile (" + strconv.Itoa(pr/32) + "," + strconv.Itoa(pc/32) + ") element (" + strconv.Itoa(pr%32) + "," + strconv.Itoa(pc%32) + ")"
	if code != exitVerifyKO || !strings.Contains(out, `tensor "`+st.Name+`" element [33 5]: `+tile) || !strings.Contains(out, "1 mismatching elements") {
		t.Errorf("flipped bit: status %d\n%s%s", code, out, errs)
	}

	// A dump of every stored tensor, as the host decodes them (the same
	// values as the device for packer output), checks clean.
	c, err := manifest.OpenCheckpoint(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	var all []safetensors.Tensor
	for _, n := range c.Names() {
		info, err := c.TensorInfo(n)
		if err != nil {
			t.Fatal(err)
		}
		v, err := c.Float32s(n)
		if err != nil {
			t.Fatal(err)
		}
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
		all = append(all, safetensors.Tensor{Name: n, DType: safetensors.F32, Shape: info.Shape, Data: b})
	}
	allDir := t.TempDir()
	if err := safetensors.WriteFile(filepath.Join(allDir, "all.safetensors"), all, nil); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCLI(t, "emulate", "check", "--checkpoint", ckpt, "--dump", allDir, "--json")
	var doc checkDoc
	if code != exitOK || json.Unmarshal([]byte(out), &doc) != nil || doc.SchemaVersion != schemaVersion ||
		len(doc.Checked) != len(all) || doc.Mismatches != 0 || len(doc.Skipped) != 0 {
		t.Errorf("full dump: status %d, %d checked of %d\n%s", code, len(doc.Checked), len(all), errs)
	}

	// emulate matmul writes what the library computes.
	r := rand.New(rand.NewPCG(3, 3))
	const tokens = 3
	var xb []byte
	x := make([]uint16, tokens*cols)
	for i := range x {
		x[i] = uint16(math.Float32bits(float32(r.NormFloat64())) >> 16)
		xb = binary.LittleEndian.AppendUint16(xb, x[i])
	}
	in := filepath.Join(t.TempDir(), "x.safetensors")
	if err := safetensors.WriteFile(in, []safetensors.Tensor{{Name: "x", DType: safetensors.BF16, Shape: []int64{tokens, int64(cols)}, Data: xb}}, nil); err != nil {
		t.Fatal(err)
	}
	yPath := filepath.Join(t.TempDir(), "y.safetensors")
	code, _, errs = runCLI(t, "emulate", "matmul", "--checkpoint", ckpt, "--tensor", st.Name, "--input", in, "--fidelity", "hifi2", "--out", yPath)
	if code != exitOK {
		t.Fatalf("matmul: status %d: %s", code, errs)
	}
	wantY, n, err := emulator.MatMulStored(context.Background(), st, x, tokens, emulator.Config{Fidelity: emulator.HiFi2})
	if err != nil || n != rows {
		t.Fatal(n, err)
	}
	f, err := safetensors.Open(yPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, err := f.ReadTensor("y")
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != 4*len(wantY) {
		t.Fatalf("y has %d bytes, want %d", len(raw), 4*len(wantY))
	}
	for i, w := range wantY {
		if got := binary.LittleEndian.Uint32(raw[4*i:]); got != w {
			t.Fatalf("y[%d] = %08x, want %08x", i, got, w)
		}
	}
	if code, _, _ := runCLI(t, "emulate", "matmul", "--checkpoint", ckpt, "--tensor", st.Name, "--input", in, "--fidelity", "hifi5", "--out", yPath); code != exitUsage {
		t.Errorf("bad fidelity: status %d", code)
	}
	if code, _, errs := runCLI(t, "emulate", "matmul", "--checkpoint", ckpt, "--tensor", "no.such", "--input", in, "--out", yPath); code != exitError || !strings.Contains(errs, "no.such") {
		t.Errorf("unknown tensor: status %d, %s", code, errs)
	}
	if code, _, _ := runCLI(t, "emulate", "frobnicate"); code != exitUsage {
		t.Errorf("unknown subcommand: status %d", code)
	}
}
