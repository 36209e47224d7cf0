package ttnn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ttquant/ttquant/manifest"
)

// VerifyOptions configure VerifyExport.
type VerifyOptions struct {
	// Checkpoint, when set, is the exported checkpoint: its identity must
	// be the recorded one and every decoded payload must equal its stored
	// bytes.
	Checkpoint *manifest.Checkpoint
}

// VerifyReport is the result of VerifyExport; OK only when Failures is
// empty.
type VerifyReport struct {
	Dir               string             `json:"dir"`
	OK                bool               `json:"ok"`
	Identity          string             `json:"identity,omitempty"`
	CheckpointChecked bool               `json:"checkpoint_checked"`
	Files             int                `json:"files"`
	Tensors           int                `json:"tensors"`
	Bytes             int64              `json:"bytes"`
	Failures          []manifest.Failure `json:"failures"`
	// Unlisted are .tensorbin files in the directory that the record does
	// not list (ttnn would load them by name all the same).
	Unlisted []string `json:"unlisted,omitempty"`
}

// ErrNotExport is returned by VerifyExport for a directory without an
// export record.
var ErrNotExport = errors.New("not a ttnn export")

// VerifyExport checks an export directory against its ttnn_export.json:
// every listed file's size and sha256; its header (the flatbuffers
// verifier's rules, required fields, payload size against the spec,
// replicated shards identical); that the spec, memory config and mesh are
// the recorded ones; and that the payload decodes back to the recorded
// checkpoint bytes (sha256 of each source tensor's stored bytes). Files
// still being written (*.partial) are failures. With opt.Checkpoint, the
// identity and every source's bytes are compared with the checkpoint.
//
// Failed checks are listed in the report; the error is non-nil only when
// the check could not run.
func VerifyExport(ctx context.Context, dir string, opt VerifyOptions) (*VerifyReport, error) {
	rep := &VerifyReport{Dir: dir, Failures: []manifest.Failure{}}
	rec, err := ReadRecord(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no %s (an export that did not finish, or not an export)", ErrNotExport, dir, RecordName)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	fail := func(file, tensor, format string, args ...any) {
		rep.Failures = append(rep.Failures, manifest.Failure{File: file, Tensor: tensor, What: fmt.Sprintf(format, args...)})
	}
	rep.Identity = rec.Checkpoint.Identity
	if c := opt.Checkpoint; c != nil {
		rep.CheckpointChecked = true
		if c.Identity() != rec.Checkpoint.Identity {
			fail(RecordName, "", "exported from checkpoint %s, not %s (%s)", rec.Checkpoint.Identity, c.Identity(), c.Dir())
		}
	}
	mem, err := ParseMemoryConfig(rec.Options.MemoryConfig)
	if err != nil {
		fail(RecordName, "", "%v", err)
	}
	listed := map[string]bool{}
	for _, f := range rec.Files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		listed[f.Name] = true
		rep.Files++
		rep.Tensors += len(f.Sources)
		verifyFile(dir, f, mem, rec.Options.Mesh, opt.Checkpoint, rep, fail)
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		rel = filepath.ToSlash(rel)
		switch {
		case strings.HasSuffix(rel, ".partial"):
			fail(rel, "", "unfinished write (a temporary file of an interrupted export)")
		case strings.HasSuffix(rel, Ext) && !listed[rel]:
			rep.Unlisted = append(rep.Unlisted, rel)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rep.OK = len(rep.Failures) == 0
	return rep, nil
}

func verifyFile(dir string, f RecordFile, mem MemoryConfig, mesh []uint32, c *manifest.Checkpoint, rep *VerifyReport, fail func(file, tensor, format string, args ...any)) {
	if !validCacheName(f.Name) || !strings.HasSuffix(f.Name, Ext) {
		fail(RecordName, "", "file name %q is not a clean relative .tensorbin path", f.Name)
		return
	}
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f.Name)))
	if err != nil {
		fail(f.Name, "", "%v", err)
		return
	}
	rep.Bytes += int64(len(data))
	if int64(len(data)) != f.Size || manifest.SHA256Hex(data) != f.SHA256 {
		fail(f.Name, "", "size %d / sha256 differ from the record (size %d): the file was changed or replaced", len(data), f.Size)
		return
	}
	tf, payload, err := Parse(data)
	if err != nil {
		fail(f.Name, "", "%v", err)
		return
	}
	want, err := specOf(f, mem)
	if err != nil {
		fail(f.Name, "", "record: %v", err)
		return
	}
	got := tf.Spec
	if !slices.Equal(got.Shape, want.Shape) || got.DType != want.DType || got.Layout != want.Layout || got.Tile != want.Tile || got.Memory != want.Memory {
		fail(f.Name, "", "header spec %v %s %s %s %s differs from the record (%v %s %s %s %s)",
			got.Shape, got.DType, got.Layout, got.Tile, got.Memory, want.Shape, want.DType, want.Layout, want.Tile, want.Memory)
		return
	}
	if !slices.Equal(tf.MeshShape, mesh) {
		fail(f.Name, "", "mesh shape %v, the record says %v", tf.MeshShape, mesh)
	}
	if !tf.Aligned() {
		fail(f.Name, "", "data region at %d is not %d-byte aligned", tf.DataStart, DataAlign)
	}
	if got, want := FileName(f.CacheName, want.DType, want.Layout), f.Name; got != want {
		fail(f.Name, "", "name does not follow the as_tensor rule for cache name %q (%s)", f.CacheName, got)
	}
	parts, err := decodePayload(f, want, payload)
	if err != nil {
		fail(f.Name, "", "payload: %v", err)
		return
	}
	for i, s := range f.Sources {
		p := parts[i]
		if int64(len(p)) != s.Bytes || manifest.SHA256Hex(p) != s.SHA256 {
			fail(f.Name, s.Tensor, "payload does not decode to the recorded checkpoint bytes (%d bytes, recorded %d)", len(p), s.Bytes)
			continue
		}
		if c == nil {
			continue
		}
		e, err := c.TensorInfo(s.Tensor)
		if err != nil {
			fail(f.Name, s.Tensor, "%v", err)
			continue
		}
		if e.SHA256 != s.SHA256 || e.Format != s.Format || !slices.Equal(e.Shape, s.Shape) || e.Orientation != s.Orientation {
			fail(f.Name, s.Tensor, "recorded source (%s %v, sha256 %.12s) differs from the checkpoint's (%s %v, sha256 %.12s)", s.Format, s.Shape, s.SHA256, e.Format, e.Shape, e.SHA256)
			continue
		}
		b, err := c.ReadPacked(s.Tensor)
		if err != nil {
			fail(f.Name, s.Tensor, "%v", err)
			continue
		}
		if !bytes.Equal(b, p) {
			fail(f.Name, s.Tensor, "payload differs from the checkpoint's stored bytes")
		}
	}
}
