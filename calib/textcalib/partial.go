package textcalib

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/model/walk"
)

// PartialDir is the directory inside an unfinished store that holds what a
// resumed build needs, as internal/model/walk keeps it: the build's inputs
// (walk.json), one record per finished layer naming the sites it wrote
// (layer-NNN.json) and the residual stream leaving the last of them
// (stream-NNN.f32). It is removed once the index is written. The workers of
// a split build keep there their records and locks and, each in its own
// directory (calib.StoreWorkerDir), the same walk files and their parts.
const PartialDir = calib.StorePartialDir

// stepData is what a layer's record holds for a store build: the sites
// the layer wrote.
type stepData struct {
	Sites []calib.SiteInfo `json:"sites"`
}

// shardFileRE matches the store's shard files and their temporary files.
var shardFileRE = regexp.MustCompile(`^\.?layer[0-9]{3,}\..*\.safetensors(\.tmp-.*)?$`)

// strayShards lists the files of dir named like shards (or their
// temporary files) that keep is missing.
func strayShards(dir string, keep map[string]bool) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() && shardFileRE.MatchString(e.Name()) && !keep[e.Name()] {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// checkSplitMix refuses a whole build in a directory of split workers and
// a worker in a directory of an unfinished whole build: neither would
// finish the other's store.
func checkSplitMix(out string, split bool) error {
	if !split && calib.HasSplitRecords(out) {
		return fmt.Errorf("textcalib: %s holds the workers of a split store build (%s/shard-*.json); run the workers (--shard) and ttquant assemble, or choose another --out", out, PartialDir)
	}
	if _, err := os.Stat(filepath.Join(out, PartialDir, walk.InputsName)); split && err == nil {
		return fmt.Errorf("textcalib: %s holds an unfinished store build of one process (%s/%s); finish it without --shard, or choose another --out", out, PartialDir, walk.InputsName)
	}
	return nil
}

// cleanParts removes, from a worker's parts, every file that keep (by its
// path relative to the store, as the records give it) does not list: the
// parts of an unfinished step and the temporary files of interrupted
// writes.
func cleanParts(out, pdir string, keep map[string]bool) error {
	dir := filepath.Join(pdir, "parts")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("textcalib: %w", err)
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		rel, err := filepath.Rel(out, p)
		if err != nil {
			return fmt.Errorf("textcalib: %w", err)
		}
		if e.IsDir() || keep[filepath.ToSlash(rel)] {
			continue
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("textcalib: %w", err)
		}
	}
	return nil
}
