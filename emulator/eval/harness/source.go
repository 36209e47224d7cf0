package harness

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/manifest"
)

// maxHashed bounds the source files whose sha256 checkSource recomputes:
// the config and tokenizer files; shards are compared by size (ttquant
// verify --source recomputes everything).
const maxHashed = 64 << 20

// SourceMismatchError reports that a checkpoint was not built from the
// source model it is evaluated against.
type SourceMismatchError struct {
	Checkpoint, Model, File, Problem string
}

func (e *SourceMismatchError) Error() string {
	return fmt.Sprintf("%s was not built from %s: %s %s", e.Checkpoint, e.Model, e.File, e.Problem)
}

// checkSource compares the source files a checkpoint's manifest records
// with the model directory: every recorded file must exist with the
// recorded size, and files up to maxHashed bytes (config, tokenizer) with
// the recorded sha256.
func checkSource(model, ckpt string, src manifest.SourceInfo) error {
	files := append([]manifest.FileEntry(nil), src.Files...)
	if src.Index != nil {
		files = append(files, *src.Index)
	}
	for _, f := range files {
		p := filepath.Join(model, filepath.FromSlash(f.Name))
		fi, err := os.Stat(p)
		if err != nil {
			return &SourceMismatchError{ckpt, model, f.Name, "is missing"}
		}
		if fi.Size() != f.Size {
			return &SourceMismatchError{ckpt, model, f.Name, fmt.Sprintf("has %d bytes; the manifest records %d", fi.Size(), f.Size)}
		}
		if f.Size > maxHashed || f.SHA256 == "" {
			continue
		}
		_, h, err := atomicfile.HashFile(p)
		if err != nil {
			return err
		}
		if h != f.SHA256 {
			return &SourceMismatchError{ckpt, model, f.Name, "has other contents than the manifest records (sha256 " + h[:16] + "…, recorded " + f.SHA256[:min(16, len(f.SHA256))] + "…)"}
		}
	}
	return nil
}

// CheckSource refuses model as the base of the native checkpoint in dir when
// the checkpoint was built from another model: the files the manifest
// records must be present with their sizes, and the small ones with their
// sha256. Substituting one model's quantized weights into another would
// otherwise run silently.
func (s *Native) CheckSource(model, dir string) error {
	return checkSource(model, dir, s.Checkpoint().Manifest().Source)
}
