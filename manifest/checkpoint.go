package manifest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/ttquant/ttquant/bfp"
)

// Checkpoint is an open native checkpoint: its manifest, read and checked
// for integrity and schema, and positional access to its tensors. Opening
// does not hash the data files (Verify does); every read checks the sha256
// of the bytes it returns. A Checkpoint is safe for concurrent use.
type Checkpoint struct {
	dir      string
	m        *Manifest
	identity string
	byName   map[string]int
}

// ErrNoTensor is wrapped by errors for a tensor name the checkpoint does
// not hold.
var ErrNoTensor = errors.New("no such tensor")

// OpenCheckpoint reads dir/native_manifest.json. A directory without a
// manifest is reported as an unfinished build.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	data, err := ReadManifestFile(filepath.Join(dir, ManifestName), 0)
	if errors.Is(err, os.ErrNotExist) {
		if ents, e := os.ReadDir(dir); e == nil && len(ents) > 0 {
			return nil, fmt.Errorf("%s: incomplete checkpoint: no %s (the build did not finish)", dir, ManifestName)
		}
		return nil, fmt.Errorf("%s: %w: no %s", dir, ErrNotCheckpoint, ManifestName)
	}
	if err != nil {
		return nil, err
	}
	if err := checkIntegrity(data); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	m, err := DecodeManifest(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if fs := checkSchema(m); len(fs) > 0 {
		return nil, fmt.Errorf("%s: %s", dir, fs[0])
	}
	c := &Checkpoint{dir: dir, m: m, identity: Identity(data), byName: map[string]int{}}
	for i, t := range m.Tensors {
		c.byName[t.Name] = i
	}
	return c, nil
}

// Dir returns the checkpoint directory.
func (c *Checkpoint) Dir() string { return c.dir }

// Manifest returns the decoded manifest; callers must not modify it.
func (c *Checkpoint) Manifest() *Manifest { return c.m }

// Identity returns the sha256 of the manifest, the checkpoint's identity.
func (c *Checkpoint) Identity() string { return c.identity }

// CacheKey returns the short cache key (the first 16 hex digits of the
// identity).
func (c *Checkpoint) CacheKey() string { return CacheKey(c.identity) }

// Names returns the stored tensor names, sorted.
func (c *Checkpoint) Names() []string {
	out := make([]string, 0, len(c.m.Tensors))
	for _, t := range c.m.Tensors {
		out = append(out, t.Name)
	}
	sort.Strings(out)
	return out
}

// TensorInfo returns a stored tensor's manifest entry: stored format and
// dtype, tile, logical and padded shape, orientation, method, file and byte
// range.
func (c *Checkpoint) TensorInfo(name string) (TensorEntry, error) {
	i, ok := c.byName[name]
	if !ok {
		return TensorEntry{}, fmt.Errorf("%s: tensor %q: %w", c.dir, name, ErrNoTensor)
	}
	return c.m.Tensors[i], nil
}

// BFP returns the BFP format and tile of a BFP tensor entry.
func (t TensorEntry) BFP() (bfp.Format, bfp.Tile, bool) {
	f, ok := ParseBFP(t.Format)
	return WithTile(f, ok, t.Tile)
}

// ReadPacked returns a tensor's stored bytes (the packed tiles of a BFP
// tensor, the element bytes otherwise), after checking their sha256 against
// the manifest.
func (c *Checkpoint) ReadPacked(name string) ([]byte, error) {
	t, err := c.TensorInfo(name)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(c.dir, filepath.FromSlash(t.File))
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, t.Length)
	if n, err := f.ReadAt(buf, t.Offset); int64(n) != t.Length {
		return nil, fmt.Errorf("%s: tensor %s: reading bytes [%d, %d): %v", path, name, t.Offset, t.Offset+t.Length, err)
	}
	if SHA256Hex(buf) != t.SHA256 {
		return nil, fmt.Errorf("%s: tensor %s: sha256 of bytes [%d, %d) differs from the manifest", path, name, t.Offset, t.Offset+t.Length)
	}
	return buf, nil
}

// Float32s returns a tensor's logical values, row-major over its logical
// shape: BFP tensors are decoded (and a transposed orientation undone),
// float tensors converted exactly.
func (c *Checkpoint) Float32s(name string) ([]float32, error) {
	t, err := c.TensorInfo(name)
	if err != nil {
		return nil, err
	}
	b, err := c.ReadPacked(name)
	if err != nil {
		return nil, err
	}
	if f, tile, ok := t.BFP(); ok {
		v, err := UnpackBFP(f, tile, b, t.Shape, t.Orientation)
		if err != nil {
			return nil, fmt.Errorf("%s: tensor %s: %w", c.dir, name, err)
		}
		return v, nil
	}
	v, err := DecodeFloats(t.DType, b)
	if err != nil {
		return nil, fmt.Errorf("%s: tensor %s (%s): %w", c.dir, name, t.DType, err)
	}
	return v, nil
}
