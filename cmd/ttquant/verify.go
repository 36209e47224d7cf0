package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/build"
)

func init() {
	register(&command{name: "verify", summary: "check a native checkpoint (exit 3 when a check fails)", run: runVerify})
}

// verifyReport is the --json document of verify.
type verifyReport struct {
	SchemaVersion int `json:"schema_version"`
	*manifest.VerifyReport
}

func runVerify(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "verify", "DIR [--source SRC] [--json] [--allow-symlinks] | --ttnn EXPORT [CKPT] [--json]")
	source := fs.String("source", "", "source checkpoint to compare every tensor against")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	workers := addWorkersFlag(fs, "files checked")
	allowSymlinks := fs.Bool("allow-symlinks", false, "accept symbolic links that resolve to regular files inside the checkpoint (others are always refused)")
	ttnnDir := fs.String("ttnn", "", "check a ttnn export directory (and, given CKPT, against that checkpoint)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	if *ttnnDir != "" {
		return runVerifyTTNN(ctx, e, *ttnnDir, pos, *asJSON)
	}
	if len(pos) != 1 {
		return usageErrorf("want exactly one checkpoint directory, got %d arguments", len(pos))
	}
	rep, err := build.Verify(ctx, pos[0], build.VerifyOptions{Source: *source, Workers: *workers, AllowSymlinks: *allowSymlinks})
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(e.stdout, verifyReport{SchemaVersion: schemaVersion, VerifyReport: rep}); err != nil {
			return err
		}
	} else {
		printVerify(e, rep)
	}
	if !rep.OK {
		return &statusError{status: exitVerifyKO}
	}
	return nil
}

func printVerify(e *env, rep *manifest.VerifyReport) {
	for _, f := range rep.Failures {
		fmt.Fprintf(e.stdout, "FAIL  %s\n", f)
	}
	switch {
	case rep.OK:
		src := ""
		if rep.SourceChecked {
			src = ", checked against the source"
		}
		fmt.Fprintf(e.stdout, "OK  %s: %d files, %d tensors, %s%s\n", rep.Dir, rep.Files, rep.Tensors, humanBytes(rep.Bytes), src)
		fmt.Fprintf(e.stdout, "identity   %s\ncache key  %s\n", rep.Identity, rep.CacheKey)
		if n := len(rep.NonFinite); n > 0 {
			fmt.Fprintf(e.stdout, "NONFINITE  %d tensors stored from NaN or Inf source values (built with --allow-nonfinite); they decode to non-finite values: %s\n", n, strings.Join(rep.NonFinite, ", "))
		}
	case rep.Incomplete:
		fmt.Fprintf(e.stdout, "INCOMPLETE  %s: %d failed checks\n", rep.Dir, len(rep.Failures))
	default:
		fmt.Fprintf(e.stdout, "FAILED  %s: %d failed checks\n", rep.Dir, len(rep.Failures))
	}
}
