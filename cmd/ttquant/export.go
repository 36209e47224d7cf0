package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/ttnn"
)

func init() {
	register(&command{name: "export", summary: "write a checkpoint's tensors in another runtime's format (ttnn .tensorbin)", run: runExport})
}

// exportResult is the --json document of export ttnn.
type exportResult struct {
	SchemaVersion int    `json:"schema_version"`
	Dir           string `json:"dir"`
	Identity      string `json:"identity"`
	Files         int    `json:"files"`
	Tensors       int    `json:"tensors"`
	Bytes         int64  `json:"bytes"`
	Kept          int    `json:"kept_files"`
	MemoryConfig  string `json:"memory_config"`
	Mesh          string `json:"mesh"`
}

func runExport(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] != "ttnn" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(e.stdout, "usage: ttquant export ttnn CKPT --out DIR --names MAP|FILE [flags]")
			return &statusError{status: exitOK}
		}
		return usageErrorf("export: want a target format: ttquant export ttnn CKPT --out DIR --names MAP")
	}
	fs := newFlagSet(e, "export ttnn", "CKPT --out DIR --names MAP [--memory-config dram-interleaved|l1-interleaved] [--mesh RxC] [--overwrite] [--json]")
	out := fs.String("out", "", "output directory for the .tensorbin files and ttnn_export.json (required)")
	names := fs.String("names", "", "name map: checkpoint tensor names to ttnn cache names, a built-in map ("+strings.Join(ttnn.BuiltinNameMaps(), ", ")+") or a JSON file (required; see docs/ttnn-export.md)")
	memFlag := fs.String("memory-config", "dram-interleaved", "memory config stored in every file: dram-interleaved or l1-interleaved")
	meshFlag := fs.String("mesh", "1x1", "mesh shape the tensors are replicated over, RxC (e.g. 1x8, 2x4) or N")
	overwrite := fs.Bool("overwrite", false, "replace another export in --out (its files this export does not write are removed); the same export is resumed or kept without it")
	workers := addWorkersFlag(fs, "files checked")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("export ttnn: want exactly one checkpoint directory, got %d arguments", len(pos))
	}
	if *out == "" {
		return usageErrorf("--out is required")
	}
	if *names == "" {
		return usageErrorf("--names is required")
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	mem, err := ttnn.ParseMemoryConfig(*memFlag)
	if err != nil {
		return usageErrorf("--memory-config: %v", err)
	}
	mesh, err := parseMesh(*meshFlag)
	if err != nil {
		return usageErrorf("--mesh: %v", err)
	}
	m, err := ttnn.OpenNameMap(*names)
	if errors.Is(err, ttnn.ErrUnknownNameMap) {
		return usageErrorf("--names: %v", err)
	}
	if err != nil {
		return err
	}
	c, err := manifest.OpenCheckpoint(pos[0])
	if err != nil {
		return err
	}
	b := readBuildInfo()
	opt := ttnn.Options{Out: *out, Memory: mem, Mesh: mesh, Overwrite: *overwrite, Workers: *workers,
		Tool: strings.TrimSpace("ttquant " + b.Version + " " + b.Revision)}
	if !*quiet {
		var last time.Time
		opt.Progress = func(done, total int, file string) {
			if done == total || time.Since(last) > time.Second {
				last = time.Now()
				fmt.Fprintf(e.stderr, "exported %d/%d files  %s\n", done, total, file)
			}
		}
		fmt.Fprintf(e.stderr, "verifying %s before exporting\n", pos[0])
	}
	res, err := ttnn.Export(ctx, c, m, opt)
	if err != nil {
		if errors.Is(err, ttnn.ErrCheckpoint) {
			return &statusError{status: exitVerifyKO, err: err}
		}
		return err
	}
	tensors := 0
	for _, f := range res.Record.Files {
		tensors += len(f.Sources)
	}
	r := exportResult{SchemaVersion: schemaVersion, Dir: res.Dir, Identity: res.Identity, Files: res.Files, Tensors: tensors,
		Bytes: res.Bytes, Kept: res.Kept, MemoryConfig: mem.String(), Mesh: *meshFlag}
	if *asJSON {
		return writeJSON(e.stdout, r)
	}
	switch {
	case res.Kept == res.Files:
		fmt.Fprintf(e.stdout, "already exported: %d tensors in %d .tensorbin files (%s) in %s, every file checked and kept\n", tensors, res.Files, humanBytes(res.Bytes), res.Dir)
	case res.Kept > 0:
		fmt.Fprintf(e.stdout, "exported %d tensors to %d .tensorbin files (%s) in %s, resumed: %d files kept from an earlier run\n", tensors, res.Files, humanBytes(res.Bytes), res.Dir, res.Kept)
	default:
		fmt.Fprintf(e.stdout, "exported %d tensors to %d .tensorbin files (%s) in %s\n", tensors, res.Files, humanBytes(res.Bytes), res.Dir)
	}
	fmt.Fprintf(e.stdout, "memory config %s, mesh %s\ncheckpoint %s\nrecord %s\n", r.MemoryConfig, r.Mesh, res.Identity, ttnn.RecordName)
	return nil
}

// parseMesh parses a mesh shape: "RxC" or "N" (1×N), at most 4096
// devices.
func parseMesh(s string) ([]uint32, error) {
	parts := strings.Split(strings.ToLower(s), "x")
	if len(parts) == 1 {
		parts = []string{"1", parts[0]}
	}
	if len(parts) != 2 {
		return nil, fmt.Errorf("%q is not RxC (e.g. 1x1, 2x4) or N", s)
	}
	out := make([]uint32, 2)
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 4096 {
			return nil, fmt.Errorf("%q: each dimension must be an integer from 1 to 4096", s)
		}
		out[i] = uint32(n)
	}
	if out[0]*out[1] > 4096 {
		return nil, fmt.Errorf("%q: at most 4096 devices", s)
	}
	return out, nil
}

// ttnnVerifyReport is the --json document of verify --ttnn.
type ttnnVerifyReport struct {
	SchemaVersion int `json:"schema_version"`
	*ttnn.VerifyReport
}

// runVerifyTTNN is verify --ttnn DIR [CKPT]: it checks an export
// directory, and against the checkpoint when one is given.
func runVerifyTTNN(ctx context.Context, e *env, dir string, pos []string, asJSON bool) error {
	if len(pos) > 1 {
		return usageErrorf("verify --ttnn DIR takes at most one checkpoint directory, got %d arguments", len(pos))
	}
	var opt ttnn.VerifyOptions
	if len(pos) == 1 {
		c, err := manifest.OpenCheckpoint(pos[0])
		if err != nil {
			return err
		}
		opt.Checkpoint = c
	}
	rep, err := ttnn.VerifyExport(ctx, dir, opt)
	if err != nil {
		return err
	}
	if asJSON {
		if err := writeJSON(e.stdout, ttnnVerifyReport{SchemaVersion: schemaVersion, VerifyReport: rep}); err != nil {
			return err
		}
	} else {
		for _, f := range rep.Failures {
			fmt.Fprintf(e.stdout, "FAIL  %s\n", f)
		}
		for _, n := range rep.Unlisted {
			fmt.Fprintf(e.stdout, "note  %s: not in %s (ttnn would load it by name all the same)\n", n, ttnn.RecordName)
		}
		if rep.OK {
			src := ""
			if rep.CheckpointChecked {
				src = ", checked against the checkpoint"
			}
			fmt.Fprintf(e.stdout, "OK  %s: %d files, %d tensors, %s%s\n", rep.Dir, rep.Files, rep.Tensors, humanBytes(rep.Bytes), src)
			fmt.Fprintf(e.stdout, "checkpoint %s\n", rep.Identity)
		} else {
			fmt.Fprintf(e.stdout, "FAILED  %s: %d failed checks\n", rep.Dir, len(rep.Failures))
		}
	}
	if !rep.OK {
		return &statusError{status: exitVerifyKO}
	}
	return nil
}
