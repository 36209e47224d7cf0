package manifest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/internal/testmodel"
)

func writeTiny(t testing.TB, v testmodel.Variant) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "src")
	if err := testmodel.Write(dir, testmodel.Tiny(), v); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestConvertVerify(t *testing.T) {
	src := writeTiny(t, testmodel.Default)
	plan, _ := Preset("qwen36-35b-a3b")
	out := filepath.Join(t.TempDir(), "out")
	res, err := Convert(context.Background(), BuildOptions{Source: src, Out: out, Plan: plan, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res.Work)
	rep, err := Verify(context.Background(), out, VerifyOptions{Source: src, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("%+v", rep.Failures)
	}
}

func TestDemo(t *testing.T) {
	res, err := Demo(context.Background(), DemoOptions{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range res.Layers {
		t.Logf("%+v", l)
	}
	for _, f := range res.Fallbacks {
		t.Logf("fallback %s: %s", f.Tensor, f.Fallback)
	}
	if !res.Verify.OK {
		t.Fatalf("%+v", res.Verify.Failures)
	}
}
