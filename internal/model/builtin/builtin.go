// Package builtin carries the built-in model in the binary: the trained
// tiny Qwen3.6-MoE (tiny-qwen36-trained/README.md gives its provenance,
// training and reference quality) with its calibration and evaluation
// text, so that `ttquant demo` runs the main job on a model whose numbers
// mean something, from an installed binary as from a clone.
//
// The files are an unchanged copy of testdata/models/tiny-qwen36-trained
// (the tests check the two copies are identical, and that both match the
// SHA256SUMS that came with the data); git stores each file once.
package builtin

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Name is the built-in model's name.
const Name = "tiny-qwen36-trained"

//go:embed tiny-qwen36-trained/README.md tiny-qwen36-trained/config.json tiny-qwen36-trained/model.safetensors
//go:embed tiny-qwen36-trained/tokenizer.json tiny-qwen36-trained/tokenizer_config.json
//go:embed tiny-qwen36-trained/calib.jsonl tiny-qwen36-trained/eval-dev.jsonl
var files embed.FS

// ModelFiles are the files of the model directory (Hugging Face layout).
var ModelFiles = []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"}

// Text files: calibration records (from the training split) and evaluation
// records (from files never trained on), JSON lines with "corpus" and
// "text".
const (
	CalibText = "calib.jsonl"
	EvalText  = "eval-dev.jsonl"
)

// Write writes the model directory (ModelFiles) into dir and the two text
// files beside them, creating dir. It returns dir.
func Write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, n := range append(append([]string(nil), ModelFiles...), CalibText, EvalText) {
		data, err := fs.ReadFile(files, Name+"/"+n)
		if err != nil {
			return "", fmt.Errorf("builtin: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), data, 0o644); err != nil {
			return "", fmt.Errorf("builtin: writing the built-in model: %w", err)
		}
	}
	return dir, nil
}

// File returns one embedded file's bytes.
func File(name string) ([]byte, error) { return fs.ReadFile(files, Name+"/"+name) }
