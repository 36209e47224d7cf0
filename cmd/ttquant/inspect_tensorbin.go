package main

import (
	"fmt"
	"os"

	"github.com/ttquant/ttquant/manifest/ttnn"
)

// tensorbinDoc is the --json document of inspect FILE.tensorbin.
type tensorbinDoc struct {
	SchemaVersion int            `json:"schema_version"`
	Path          string         `json:"path"`
	Size          int64          `json:"size"`
	HeaderSize    uint64         `json:"header_size"`
	DataStart     int64          `json:"data_start"`
	Aligned64     bool           `json:"aligned_64"`
	Shape         []uint32       `json:"shape"`
	PaddedShape   []uint64       `json:"padded_shape,omitempty"`
	DType         string         `json:"dtype"`
	Layout        string         `json:"layout"`
	Tile          string         `json:"tile,omitempty"`
	TransposeTile bool           `json:"transpose_tile,omitempty"`
	MemoryConfig  string         `json:"memory_config"`
	Alignment     []uint32       `json:"alignment"`
	Mesh          []uint32       `json:"mesh_shape"`
	Shards        []ttnn.Shard   `json:"shards"`
	Topology      *ttnn.Topology `json:"topology,omitempty"`
	PayloadSize   int64          `json:"payload_size"`
	// Check is "ok" or why the payload does not fit the spec.
	Check string `json:"check"`
}

// inspectTensorbin shows a .tensorbin header and checks the payload against
// the spec; a file that fails the check exits with status 3.
func inspectTensorbin(e *env, path string, asJSON bool) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return err
	}
	f, err := ttnn.ReadHeaderRaw(fh, st.Size())
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	s := f.Spec
	doc := tensorbinDoc{SchemaVersion: schemaVersion, Path: path, Size: f.Size, HeaderSize: f.HeaderSize, DataStart: f.DataStart,
		Aligned64: f.Aligned(), Shape: s.Shape, DType: s.DType.String(), Layout: s.Layout.String(), TransposeTile: s.TransposeTile,
		MemoryConfig: s.Memory.String(), Alignment: s.Alignment, Mesh: f.MeshShape, Shards: f.Shards, Topology: f.Topology,
		PayloadSize: f.PayloadSize, Check: "ok"}
	if s.Layout == ttnn.TileLayout {
		doc.Tile = s.Tile.String()
	}
	doc.PaddedShape, _ = s.PaddedShape()
	checkErr := f.Check(uint64(f.Size - f.DataStart))
	if checkErr != nil {
		doc.Check = checkErr.Error()
	}
	if asJSON {
		if err := writeJSON(e.stdout, doc); err != nil {
			return err
		}
	} else {
		w := e.stdout
		fmt.Fprintf(w, "file         %s: %d bytes, header %d bytes, data region at %d (64-byte aligned: %v)\n", path, f.Size, f.HeaderSize, f.DataStart, doc.Aligned64)
		fmt.Fprintf(w, "spec         shape %s %s %s", inspectShape(u32s64(s.Shape)), s.DType, s.Layout)
		if doc.Tile != "" {
			fmt.Fprintf(w, " tile %s", doc.Tile)
		}
		fmt.Fprintf(w, ", padded %v, alignment %v\n", doc.PaddedShape, s.Alignment)
		fmt.Fprintf(w, "memory       %s\n", s.Memory)
		fmt.Fprintf(w, "mesh         %v, %d shard(s)\n", f.MeshShape, len(f.Shards))
		for _, sh := range f.Shards {
			fmt.Fprintf(w, "  shard %v  data [%d, %d)  %d bytes\n", sh.Coord, sh.Offset, sh.Offset+sh.Size, sh.Size)
		}
		if t := f.Topology; t != nil {
			fmt.Fprintf(w, "topology     distribution %v, placements", t.DistributionShape)
			for _, p := range t.Placements {
				if p.Kind == ttnn.ShardDim {
					fmt.Fprintf(w, " shard(%d)", p.Dim)
				} else {
					fmt.Fprintf(w, " %s", p.Kind)
				}
			}
			fmt.Fprintf(w, ", %d coordinate(s)\n", len(t.MeshCoords))
		} else {
			fmt.Fprintln(w, "topology     none (replicated over the mesh)")
		}
		fmt.Fprintf(w, "payload      %d bytes per shard by the spec: %s\n", f.PayloadSize, doc.Check)
	}
	if checkErr != nil {
		return &statusError{status: exitVerifyKO, err: fmt.Errorf("%s: %w", path, checkErr)}
	}
	return nil
}

func u32s64(v []uint32) []uint64 {
	out := make([]uint64, len(v))
	for i, d := range v {
		out[i] = uint64(d)
	}
	return out
}
