package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// treeHash hashes a directory tree: every entry's path, type, permission
// bits and, for regular files, content.
func treeHash(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		line := filepath.ToSlash(rel) + " " + fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s := sha256.Sum256(b)
			line += " " + hex.EncodeToString(s[:])
		}
		lines = append(lines, line)
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return "absent"
	}
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	s := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(s[:])
}

// TestRefusedRunLeavesDirectoryAsItWas: every run that is refused leaves
// its output directory exactly as it found it: a finished checkpoint still
// verifies, an unfinished build can still be resumed, a foreign directory
// gains nothing.
func TestRefusedRunLeavesDirectoryAsItWas(t *testing.T) {
	src, store := tinyFixture(t)
	finished := func() string {
		d := filepath.Join(t.TempDir(), "ckpt")
		copyTree(t, reference(t, "convert"), d)
		return d
	}
	unfinished := func() string {
		d := filepath.Join(t.TempDir(), "part")
		if _, err := interruptAt(t, convertOpts(t, d, 1), "convert", 3, ""); !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		return d
	}
	noConfig := filepath.Join(t.TempDir(), "model")
	copyTree(t, src, noConfig)
	os.Remove(filepath.Join(noConfig, "config.json"))
	badStore := filepath.Join(t.TempDir(), "store")
	copyTree(t, store, badStore)
	shards, _ := filepath.Glob(filepath.Join(badStore, "layer003.mlp.*.safetensors"))
	if len(shards) == 0 {
		t.Fatal("no layer 3 shard in the fixture store")
	}
	os.Truncate(shards[0], 100)

	cases := []struct {
		name string
		dir  func() string
		run  func(out string) error
	}{
		{"other option on a finished checkpoint", finished, func(out string) error {
			o := convertOpts(t, out, 1)
			o.ExpertsPerFile = 8
			_, err := Convert(context.Background(), o)
			return err
		}},
		{"other command on a finished checkpoint", finished, func(out string) error {
			_, err := GPTQ(context.Background(), gptqOpts(t, out, 1))
			return err
		}},
		{"other option on an unfinished build", unfinished, func(out string) error {
			o := convertOpts(t, out, 1)
			o.ExpertsPerFile = 8
			_, err := Convert(context.Background(), o)
			return err
		}},
		{"foreign directory", func() string {
			d := t.TempDir()
			os.WriteFile(filepath.Join(d, "notes.txt"), []byte("x"), 0o644)
			return d
		}, func(out string) error {
			_, err := Convert(context.Background(), convertOpts(t, out, 1))
			return err
		}},
		{"the source model itself", func() string {
			d := filepath.Join(t.TempDir(), "model")
			copyTree(t, src, d)
			return d
		}, func(out string) error {
			o := convertOpts(t, out, 1)
			o.Source = out
			_, err := Convert(context.Background(), o)
			return err
		}},
		{"bad config", finished, func(out string) error {
			o := convertOpts(t, out, 1)
			o.Source = noConfig
			_, err := Convert(context.Background(), o)
			return err
		}},
		{"bad store", finished, func(out string) error {
			o := gptqOpts(t, out, 1)
			o.Calib = badStore
			_, err := GPTQ(context.Background(), o)
			return err
		}},
		{"synthetic store without the option", finished, func(out string) error {
			o := gptqOpts(t, out, 1)
			o.AllowSyntheticCalibration = false
			_, err := GPTQ(context.Background(), o)
			if !errors.Is(err, ErrSyntheticCalibration) {
				t.Errorf("synthetic store: got %v, want ErrSyntheticCalibration", err)
			}
			return err
		}},
		{"synthetic store without the option, new directory", func() string { return filepath.Join(t.TempDir(), "new") }, func(out string) error {
			o := gptqOpts(t, out, 1)
			o.AllowSyntheticCalibration = false
			_, err := GPTQ(context.Background(), o)
			if !errors.Is(err, ErrSyntheticCalibration) {
				t.Errorf("synthetic store: got %v, want ErrSyntheticCalibration", err)
			}
			return err
		}},
		{"bad layer selection", finished, func(out string) error {
			o := gptqOpts(t, out, 1)
			o.Layers = "(["
			_, err := GPTQ(context.Background(), o)
			return err
		}},
		{"too many held-out sequences", finished, func(out string) error {
			o := gptqOpts(t, out, 1)
			o.HeldOutSequences = 1000
			_, err := GPTQ(context.Background(), o)
			return err
		}},
		{"new directory, bad config", func() string { return filepath.Join(t.TempDir(), "new") }, func(out string) error {
			o := convertOpts(t, out, 1)
			o.Source = noConfig
			_, err := Convert(context.Background(), o)
			return err
		}},
	}
	for _, c := range cases {
		dir := c.dir()
		before := treeHash(t, dir)
		err := c.run(dir)
		if err == nil {
			t.Errorf("%s: not refused", c.name)
			continue
		}
		if after := treeHash(t, dir); after != before {
			ents, _ := os.ReadDir(dir)
			names := []string{}
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s (refused: %v): the directory changed; it now holds %v", c.name, err, names)
		}
	}
	// The finished checkpoint still verifies after all that.
	d := finished()
	o := convertOpts(t, d, 1)
	o.ExpertsPerFile = 8
	if _, err := Convert(context.Background(), o); err == nil {
		t.Fatal("not refused")
	}
	if rep := mustVerify(t, d, VerifyOptions{}); !rep.OK {
		t.Errorf("a refused run broke a good checkpoint: %v", rep.Failures)
	}
}
