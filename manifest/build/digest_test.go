package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/manifest"
)

// buildDigests are the sha256 of the SHA256SUMS file (the sha256 of every
// tensor file of the checkpoint) followed by native_manifest.json, of three
// builds of the trained tiny model, as the assembly
// kernels of an amd64 machine write them. The purego build runs the same
// builds through the portable kernels and must write the same bytes: the
// twins' bit-identity end to end, through the forward pass, the
// calibration walk, the Hessians and the GPTQ solver (the asymmetric
// build only with the assembly kernels: it takes minutes without them).
//
// How they were made: TTQUANT_PRINT_DIGESTS=1 go test -run
// TestBuildDigests ./manifest/build prints them; they change only with a
// commit that changes checkpoint bytes on purpose, which names itself.
var buildDigests = map[string]string{
	"convert":         "f601db3c2ccb5c5670131c5b9c76d9a65c9caac2ca13ff081d8de515b9296e6c",
	"sequential":      "4d9cc34db4c85138ecccf564950a195f753de50cc29c76bbfc5ebef056f22ad0",
	"sequential-asym": "5cb31855928eabb8dcc442aef6a9ff45a8a86697fac8186bd0f717bc04fa8551",
}

// TestBuildDigests builds the trained model rounded to nearest and with
// sequential GPTQ (symmetric on 6 × 96 calibration tokens; asymmetric on
// 12 × 256, enough rows for the shared experts' asymmetric fit) and
// compares each checkpoint's digest with buildDigests.
func TestBuildDigests(t *testing.T) {
	m := testdata.Dir(t, "models", "tiny-qwen36-trained")
	builds := []struct {
		name string
		run  func(out string) error
	}{
		{"convert", func(out string) error {
			_, err := Convert(context.Background(), BuildOptions{Source: m, Out: out, Plan: preset(t), Workers: 2})
			return err
		}},
		{"sequential", func(out string) error {
			_, err := GPTQ(context.Background(), seqOpts(t, out, 2))
			return err
		}},
		{"sequential-asym", func(out string) error {
			opt := seqOpts(t, out, 2)
			opt.Asymmetric = true
			opt.DataOptions.Calibration.Sequences, opt.DataOptions.Calibration.SeqLen = 12, 256
			_, err := GPTQ(context.Background(), opt)
			return err
		}},
	}
	print := os.Getenv("TTQUANT_PRINT_DIGESTS") != ""
	for _, b := range builds {
		if purego && b.name == "sequential-asym" && !print {
			// 2,560 calibration rows through the portable kernels take
			// minutes; the symmetric build runs the same kernels.
			continue
		}
		out := filepath.Join(t.TempDir(), b.name)
		if err := b.run(out); err != nil {
			t.Fatalf("%s: %v", b.name, err)
		}
		sums, err := os.ReadFile(filepath.Join(out, manifest.SumsName))
		if err != nil {
			t.Fatal(err)
		}
		mf, err := os.ReadFile(filepath.Join(out, manifest.ManifestName))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(append(sums, mf...))
		got := hex.EncodeToString(h[:])
		if print {
			t.Logf("%q: %q,", b.name, got)
			continue
		}
		if want := buildDigests[b.name]; got != want {
			t.Errorf("%s: checkpoint digest %s, want %s (purego: %v)\n%s", b.name, got, want, purego, sums)
		}
	}
}
