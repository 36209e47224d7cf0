package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/ttquant/ttquant/safetensors"
)

func init() {
	register(&command{
		name:    "inspect",
		summary: "describe a native checkpoint (format, shape, plan rule, method per tensor; calibration) or list the tensors of a safetensors file, directory or sharded model",
		run:     runInspect,
	})
}

// inspectTensor is one tensor of the --json document.
type inspectTensor struct {
	Name  string   `json:"name"`
	DType string   `json:"dtype"`
	Shape []uint64 `json:"shape"` // exact, dimensions above 2⁶³−1 included
	Bytes int64    `json:"bytes"`
	Shard string   `json:"shard"`
	Begin int64    `json:"begin"` // data-section offsets within the shard
	End   int64    `json:"end"`
}

type inspectFile struct {
	Path       string            `json:"path"`
	Size       int64             `json:"size"`
	HeaderSize int64             `json:"header_size"`
	Tensors    int               `json:"tensors"`
	Bytes      int64             `json:"bytes"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

type inspectTotals struct {
	Tensors int              `json:"tensors"`
	Bytes   int64            `json:"bytes"`
	Files   int              `json:"files"`
	ByDType map[string]int64 `json:"bytes_by_dtype"`
}

type inspectDoc struct {
	SchemaVersion int             `json:"schema_version"`
	Path          string          `json:"path"`
	Error         string          `json:"error,omitempty"`
	ErrorKind     string          `json:"error_kind,omitempty"`
	Files         []inspectFile   `json:"files,omitempty"`
	Tensors       []inspectTensor `json:"tensors,omitempty"`
	Totals        *inspectTotals  `json:"totals,omitempty"`
	Warnings      []string        `json:"warnings,omitempty"`
}

func runInspect(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "inspect", "PATH [--json]")
	asJSON := fs.Bool("json", false, "print a JSON document")
	// Flags may come before or after the path.
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("inspect takes exactly one PATH (a native checkpoint directory, a .safetensors file, a directory, an index .json or a .tensorbin), got %d", len(pos))
	}
	path := pos[0]
	if strings.HasSuffix(path, ".tensorbin") {
		return inspectTensorbin(e, path, *asJSON)
	}
	if isCheckpointDir(path) {
		return inspectCheckpoint(e, path, *asJSON)
	}

	m, err := safetensors.OpenModel(path)
	if err != nil {
		kind := safetensors.KindName(err)
		if *asJSON {
			if werr := writeJSON(e.stdout, inspectDoc{SchemaVersion: schemaVersion, Path: path, Error: err.Error(), ErrorKind: kind}); werr != nil {
				return werr
			}
		}
		if kind != "" {
			return fmt.Errorf("%w [%s]", err, kind)
		}
		return err
	}
	defer m.Close()
	for _, w := range m.Warnings() {
		e.log.Warn(w)
	}
	doc := inspectDoc{SchemaVersion: schemaVersion, Path: path, Warnings: m.Warnings(),
		Totals: &inspectTotals{ByDType: map[string]int64{}}}
	for _, f := range m.Files() {
		fi := inspectFile{Path: f.Path(), Size: f.Size(), HeaderSize: f.HeaderSize(), Tensors: f.Len(), Metadata: f.Metadata()}
		for _, t := range f.Tensors() {
			fi.Bytes += t.Size()
		}
		doc.Files = append(doc.Files, fi)
	}
	for _, name := range m.Names() {
		f, t, _ := m.Lookup(name)
		doc.Tensors = append(doc.Tensors, inspectTensor{Name: name, DType: t.DType.String(), Shape: t.Dims(),
			Bytes: t.Size(), Shard: filepath.Base(f.Path()), Begin: t.Begin, End: t.End})
		doc.Totals.Tensors++
		doc.Totals.Bytes += t.Size()
		doc.Totals.ByDType[t.DType.String()] += t.Size()
	}
	doc.Totals.Files = len(doc.Files)
	if *asJSON {
		return writeJSON(e.stdout, doc)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDTYPE\tSHAPE\tBYTES\tSHARD")
	for _, t := range doc.Tensors {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", inspectQuote(t.Name), t.DType, inspectShape(t.Shape), t.Bytes, t.Shard)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\n%d tensors, %d bytes in %d file(s)\n", doc.Totals.Tensors, doc.Totals.Bytes, doc.Totals.Files)
	dts := make([]string, 0, len(doc.Totals.ByDType))
	for d := range doc.Totals.ByDType {
		dts = append(dts, d)
	}
	slices.Sort(dts)
	for _, d := range dts {
		fmt.Fprintf(e.stdout, "  %-12s %d bytes\n", d, doc.Totals.ByDType[d])
	}
	for _, f := range doc.Files {
		fmt.Fprintf(e.stdout, "file %s: %d bytes, header %d bytes, %d tensors", f.Path, f.Size, f.HeaderSize, f.Tensors)
		if len(f.Metadata) > 0 {
			keys := make([]string, 0, len(f.Metadata))
			for k := range f.Metadata {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			fmt.Fprint(e.stdout, ", metadata:")
			for _, k := range keys {
				fmt.Fprintf(e.stdout, " %s=%q", inspectQuote(k), f.Metadata[k])
			}
		}
		fmt.Fprintln(e.stdout)
	}
	return nil
}

// inspectQuote quotes names that contain spaces or non-printable
// characters so that each listing line stays unambiguous.
func inspectQuote(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if r <= ' ' || r == '"' || r == 0x7f || r > 0x7e {
			return fmt.Sprintf("%q", s)
		}
	}
	return s
}

func inspectShape(s []uint64) string {
	b := []byte{'['}
	for i, d := range s {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%d", d)
	}
	return string(append(b, ']'))
}
