package build

import (
	"bytes"
	"context"
	"github.com/ttquant/ttquant/manifest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func readManifestBytes(t *testing.T, dir string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, manifest.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRerunKeepsManifestBytes: a build run twice into one directory and
// once into a fresh one gives three byte-identical manifests, for convert
// and for GPTQ from a calibration store (whose per-layer sums used to
// drift in the last digits on the rerun).
func TestRerunKeepsManifestBytes(t *testing.T) {
	for _, kind := range []string{"convert", "gptq1"} {
		first := filepath.Join(t.TempDir(), "ckpt")
		copyTree(t, reference(t, kind), first)
		want := readManifestBytes(t, first)
		fresh := filepath.Join(t.TempDir(), "fresh")
		for _, dir := range []string{first, fresh} {
			var err error
			if kind == "convert" {
				_, err = Convert(context.Background(), convertOpts(t, dir, 2))
			} else {
				_, err = GPTQ(context.Background(), gptq1Opts(t, dir, 2))
			}
			if err != nil {
				t.Fatalf("%s into %s: %v", kind, dir, err)
			}
			if got := readManifestBytes(t, dir); !bytes.Equal(got, want) {
				t.Errorf("%s: the manifest in %s differs from the first build's:\n%s", kind, filepath.Base(dir), firstDiff(want, got))
			}
		}
	}
}

// firstDiff shows the first differing line of two manifests after the
// integrity field (which differs whenever anything does).
func firstDiff(a, b []byte) string {
	al, bl := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := 0; i < len(al) && i < len(bl); i++ {
		if !bytes.Equal(al[i], bl[i]) && !bytes.Contains(al[i], []byte(integrityKey)) {
			return "line " + strconv.Itoa(i+1) + ":\n  " + string(al[i]) + "\n  " + string(bl[i])
		}
	}
	return "only the integrity field, or the lengths, differ"
}

// TestIdentityIgnoresTool: the same checkpoint written by two builds of
// the program (one stamped with a version-control revision, one not) has
// one identity, and each may rerun the other's build.
func TestIdentityIgnoresTool(t *testing.T) {
	devel := manifest.ToolInfo{Name: "ttquant", Version: "(devel)"}
	stamped := manifest.ToolInfo{Name: "ttquant", Version: "v0.0.0-20261201120000-11b78ea4c0de", Revision: "11b78ea4c0de11b78ea4c0de11b78ea4c0de11b7", Modified: true}

	a := filepath.Join(t.TempDir(), "a")
	oa := convertOpts(t, a, 2)
	oa.Tool = devel
	ra, err := Convert(context.Background(), oa)
	if err != nil {
		t.Fatal(err)
	}
	b := filepath.Join(t.TempDir(), "b")
	ob := convertOpts(t, b, 2)
	ob.Tool = stamped
	rb, err := Convert(context.Background(), ob)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(readManifestBytes(t, a), readManifestBytes(t, b)) {
		t.Fatal("the manifests do not record which program wrote them")
	}
	if ra.Identity != rb.Identity {
		t.Errorf("identity depends on the program's build: %s vs %s", ra.Identity, rb.Identity)
	}
	if rep := mustVerify(t, b, VerifyOptions{}); !rep.OK || rep.Identity != ra.Identity {
		t.Errorf("verify: ok=%v identity %s, want %s", rep.OK, rep.Identity, ra.Identity)
	}
	c, err := manifest.OpenCheckpoint(a)
	if err != nil || c.Identity() != ra.Identity {
		t.Errorf("manifest.OpenCheckpoint: %v, identity %v", err, c)
	}
	// The stamped build reruns the unstamped one's checkpoint: accepted,
	// every file kept, same identity, its own name recorded.
	oc := convertOpts(t, a, 1)
	oc.Tool = stamped
	again, err := Convert(context.Background(), oc)
	if err != nil {
		t.Fatalf("rerun by another build of the program: %v", err)
	}
	if !again.AlreadyComplete || again.Identity != ra.Identity || again.Manifest.Tool != stamped {
		t.Errorf("rerun: complete=%v identity %s (want %s), tool %+v", again.AlreadyComplete, again.Identity, ra.Identity, again.Manifest.Tool)
	}
	if !bytes.Equal(readManifestBytes(t, a), readManifestBytes(t, b)) {
		t.Error("after the rerun by the same program, the two manifests differ")
	}
}

// integrityKey opens the manifest's integrity field.
const integrityKey = `"integrity": "`

// TestVerifyRefusesRecordedPaths: docs/checkpoint.md promises that the
// calibration provenance is content only; verify holds a manifest to it.
// A checkpoint whose calibration data records the spec as typed or a
// source's path (as manifests written before the change did) fails.
func TestVerifyRefusesRecordedPaths(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	copyTree(t, reference(t, "gptq1"), dir)
	m, err := manifest.DecodeManifest(readManifestBytes(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if m.TTQuant.Calibration == nil {
		t.Fatal("the GPTQ reference records no calibration")
	}
	if rep := mustVerify(t, dir, VerifyOptions{}); !rep.OK {
		t.Fatalf("the reference does not verify: %v", rep.Failures)
	}
	m.TTQuant.Calibration.Data = []byte(`{"schema_version":1,"spec":"calib=../texts.jsonl","sources":[{"label":"calib","kind":"jsonl","path":"../texts.jsonl","files":[{"path":"../texts.jsonl","sha256":"00"}]}]}`)
	rewriteManifest(t, dir, m)
	rep := mustVerify(t, dir, VerifyOptions{})
	wantFailure(t, rep, manifest.ManifestName, "the spec", "calib=../texts.jsonl")
	wantFailure(t, rep, manifest.ManifestName, "source 0's path")
	wantFailure(t, rep, manifest.ManifestName, "file path")
}
