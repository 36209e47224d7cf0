package model

import (
	"os"
	"path/filepath"
)

// ConfigName is the file beside a model's tensors that describes it.
const ConfigName = "config.json"

// Dir is the directory of a model given as its directory or as one of its
// files (a shard, the shard index): where its config.json and
// tokenizer.json are.
func Dir(src string) string {
	if fi, err := os.Stat(src); err == nil && !fi.IsDir() {
		return filepath.Dir(src)
	}
	return src
}

// ConfigPath is the config.json of the model given as src (Dir).
func ConfigPath(src string) string { return filepath.Join(Dir(src), ConfigName) }
