package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/manifest"
)

// checkpointDoc is the --json document of inspect on a native checkpoint.
type checkpointDoc struct {
	SchemaVersion  int                 `json:"schema_version"`
	Path           string              `json:"path"`
	Identity       string              `json:"identity"`
	CacheKey       string              `json:"cache_key"`
	FormatVersion  int                 `json:"format_version"`
	Command        string              `json:"command"`
	SourceIdentity string              `json:"source_identity"`
	Plan           string              `json:"plan"`
	PlanSHA256     string              `json:"plan_sha256"`
	Calibration    *manifest.CalibInfo `json:"calibration,omitempty"`
	Tensors        []checkpointTensor  `json:"tensors"`
	Files          int                 `json:"files"`
	Bytes          int64               `json:"bytes"`
	BytesByFormat  map[string]int64    `json:"bytes_by_format"`
	NonFinite      []string            `json:"nonfinite_tensors,omitempty"`
}

// checkpointTensor is one stored tensor as the checkpoint means it. Rule
// is 1-based, as plan prints it.
type checkpointTensor struct {
	Name     string          `json:"name"`
	Format   string          `json:"format"`
	DType    string          `json:"dtype"` // the safetensors dtype it is stored as
	Shape    []int64         `json:"shape"` // logical
	Rule     int             `json:"rule"`
	Pattern  string          `json:"pattern"`
	Method   manifest.Method `json:"method"`
	Axis     bfp.Axis        `json:"axis,omitempty"`
	Fallback string          `json:"fallback,omitempty"`
	File     string          `json:"file"`
	Bytes    int64           `json:"bytes"`
}

// isCheckpointDir reports whether path is a directory holding a native
// manifest.
func isCheckpointDir(path string) bool {
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
		return false
	}
	_, err := os.Stat(filepath.Join(path, manifest.ManifestName))
	return err == nil
}

// inspectCheckpoint describes a native checkpoint from its manifest: per
// tensor its stored format, logical shape, plan rule and method, and the
// calibration it was built from.
func inspectCheckpoint(e *env, path string, asJSON bool) error {
	c, err := manifest.OpenCheckpoint(path)
	if err != nil {
		return err
	}
	m := c.Manifest()
	doc := checkpointDoc{SchemaVersion: schemaVersion, Path: path, Identity: c.Identity(), CacheKey: c.CacheKey(), FormatVersion: m.FormatVersion,
		Command: m.TTQuant.Command, SourceIdentity: m.Source.Identity, Plan: m.Plan.Name, PlanSHA256: m.Plan.SHA256,
		Calibration: m.TTQuant.Calibration, Files: len(m.Files), BytesByFormat: map[string]int64{}, NonFinite: m.TTQuant.NonFinite}
	fallback := map[string]string{}
	for _, ms := range m.TTQuant.Matrices {
		if ms.Fallback != "" {
			fallback[ms.Tensor] = ms.Fallback
		}
	}
	for _, te := range m.Tensors {
		t := checkpointTensor{Name: te.Name, Format: te.Format, DType: te.DType, Shape: te.Shape, Rule: te.Rule + 1, Method: te.Method,
			Fallback: fallback[te.Name], File: te.File, Bytes: te.Length}
		if te.Rule >= 0 && te.Rule < len(m.Plan.Rules) {
			r := m.Plan.Rules[te.Rule]
			t.Pattern, t.Axis = r.Pattern, r.Axis
		}
		doc.Tensors = append(doc.Tensors, t)
		doc.Bytes += te.Length
		doc.BytesByFormat[te.Format] += te.Length
	}
	if asJSON {
		return writeJSON(e.stdout, doc)
	}
	w := e.stdout
	fmt.Fprintf(w, "checkpoint   %s (native format %d, %s)\n", path, doc.FormatVersion, doc.Command)
	fmt.Fprintf(w, "identity     %s\ncache key    %s\nsource       %s\n", doc.Identity, doc.CacheKey, doc.SourceIdentity)
	fmt.Fprintf(w, "plan %s (%d rules, sha256 %s)\n", doc.Plan, len(m.Plan.Rules), doc.PlanSHA256)
	printCalibration(w, doc.Calibration)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tFORMAT\tSHAPE\tRULE\tMETHOD\tBYTES\tFILE")
	for _, t := range doc.Tensors {
		method := string(t.Method)
		if t.Axis != "" {
			method += "/" + string(t.Axis)
		}
		if t.Fallback != "" {
			method += " (fallback; --json gives the reason)"
		}
		format := t.Format
		if manifest.StoredFormat(format) == manifest.StoreAsIs {
			format += "(" + t.DType + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d %s\t%s\t%d\t%s\n", inspectQuote(t.Name), format, planShape(t.Shape), t.Rule, t.Pattern, method, t.Bytes, t.File)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d tensors, %s in %d files\n", len(doc.Tensors), humanBytes(doc.Bytes), doc.Files)
	formats := make([]string, 0, len(doc.BytesByFormat))
	for f := range doc.BytesByFormat {
		formats = append(formats, f)
	}
	slices.Sort(formats)
	for _, f := range formats {
		fmt.Fprintf(w, "  %-12s %s\n", f, humanBytes(doc.BytesByFormat[f]))
	}
	if len(doc.NonFinite) > 0 {
		fmt.Fprintf(w, "stored from sources holding NaN or Inf: %s\n", strings.Join(doc.NonFinite, ", "))
	}
	return nil
}

// printCalibration prints the calibration summary line of a checkpoint:
// mode, sequences, tokens, held-out sequences, the token-id hash and the
// text's sources.
func printCalibration(w io.Writer, c *manifest.CalibInfo) {
	if c == nil {
		fmt.Fprintln(w, "calibration  none (rounded to nearest)")
		return
	}
	mode := c.Mode
	if mode == "" {
		mode = "store"
	}
	fmt.Fprintf(w, "calibration  %s: %d sequences, %d tokens (%d held out), sha256 %s\n", mode, c.Sequences, c.Tokens, c.HeldOutSequences, c.SHA256)
	if len(c.Data) == 0 {
		return
	}
	var p dataset.Provenance
	if err := json.Unmarshal(c.Data, &p); err != nil {
		fmt.Fprintf(w, "             text: unreadable provenance (%v)\n", err)
		return
	}
	for _, s := range p.Sources {
		fmt.Fprintf(w, "             text %s (%s): %d files, %d records, %d for calibration\n", s.Label, s.Kind, len(s.Files), s.Records, s.CalibrationRecords)
	}
}
