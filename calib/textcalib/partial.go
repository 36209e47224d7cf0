package textcalib

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"

	"github.com/ttquant/ttquant/calib"
)

// PartialDir is the directory inside an unfinished store that holds what a
// resumed build needs, as internal/model/walk keeps it: the build's inputs
// (walk.json), one record per finished layer naming the sites it wrote
// (layer-NNN.json) and the residual stream leaving the last of them
// (stream-NNN.f32). It is removed once the index is written.
const PartialDir = "partial"

// stepData is what a layer's record holds for a store build: the sites
// the layer wrote.
type stepData struct {
	Sites []calib.SiteInfo `json:"sites"`
}

func strictJSON(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
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
