package calib

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// ModelFile is one file behind a model identity: its base name, size and
// sha256 (hex).
type ModelFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// ModelIdentityOf is the identity of a model directory from its
// config.json and safetensors files: "sha256:" and the sha256 of the JSON
// list of the files sorted by name. A store built from text records it as
// its provenance's revision.
func ModelIdentityOf(files []ModelFile) string {
	fs := append([]ModelFile(nil), files...)
	sort.Slice(fs, func(i, j int) bool { return fs[i].Name < fs[j].Name })
	data, _ := json.Marshal(fs)
	s := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(s[:])
}

// ModelIdentity hashes the config.json and *.safetensors files of dir and
// returns ModelIdentityOf them.
func ModelIdentity(dir string) (string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return "", err
	}
	names = append(names, filepath.Join(dir, "config.json"))
	var files []ModelFile
	for _, n := range names {
		f, err := os.Open(n)
		if err != nil {
			return "", fmt.Errorf("calib: model identity: %w", err)
		}
		h := sha256.New()
		size, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("calib: model identity: %s: %w", n, err)
		}
		files = append(files, ModelFile{filepath.Base(n), size, hex.EncodeToString(h.Sum(nil))})
	}
	return ModelIdentityOf(files), nil
}
