package calib

import (
	"context"
	"math"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/safetensors"
)

// Check opens every shard of every site and checks it against the index
// before any of it is used: the file is a regular file, a valid
// safetensors file (so a truncated or extended one fails), its metadata
// names this store, layer, site and token range, and its activations
// tensor has the index's dtype and [tokens, cols] shape. With deep it also
// reads every row and checks that it decodes to finite values. The first
// problem is returned, naming the shard file.
func (s *Store) Check(ctx context.Context, deep bool) error {
	for _, si := range s.sites {
		for _, sh := range si.Shards {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := checkShardFile(s.dir, s.idx.Provenance, si, sh); err != nil {
				return err
			}
		}
		if !deep {
			continue
		}
		err := s.Stream(si.Layer, si.Site, 0, si.Tokens, 0, func(first int64, rows []float32) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			for i, v := range rows {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					unit := "token"
					if si.Alignment != AlignToken {
						unit = "row"
					}
					return siteErr(ErrStoreValues, s.dir, si.Layer, si.Site, nil, "%s %d feature %d is %g",
						unit, first+int64(i/si.Cols), i%si.Cols, v)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// checkShardFile opens one shard's header in the store directory dir and
// checks it against the site and provenance.
func checkShardFile(dir string, p Provenance, si SiteInfo, sh ShardInfo) error {
	path := filepath.Join(dir, sh.File)
	fi, err := os.Lstat(path)
	if err != nil {
		return siteErr(ErrStoreShard, path, si.Layer, si.Site, err, "")
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		// Stores may be assembled from links; the target must be regular.
		if fi, err = os.Stat(path); err != nil {
			return siteErr(ErrStoreShard, path, si.Layer, si.Site, err, "")
		}
	}
	if !fi.Mode().IsRegular() {
		return siteErr(ErrStoreShard, path, si.Layer, si.Site, nil, "not a regular file")
	}
	f, err := safetensors.Open(path)
	if err != nil {
		return siteErr(ErrStoreShard, path, si.Layer, si.Site, err, "")
	}
	defer f.Close()
	return checkShardHeader(f, p, si, sh)
}

// validShardName reports whether a shard name from the index is a plain
// file name inside the store directory.
func validShardName(name string) bool {
	return name != "" && name != "." && name != ".." && filepath.Base(name) == name &&
		filepath.ToSlash(name) == name && !filepath.IsAbs(name) && filepath.VolumeName(name) == ""
}
