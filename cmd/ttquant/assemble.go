package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/ttquant/ttquant/manifest/build"
)

func init() {
	register(&command{name: "assemble", summary: "write the manifest of a build split across workers (--shard) once every worker has finished", run: runAssemble})
}

// shardReport is the --json document of one worker of a split build.
type shardReport struct {
	SchemaVersion   int                `json:"schema_version"`
	Dir             string             `json:"dir"`
	Shard           *build.ShardWork   `json:"shard,omitempty"`
	Files           int                `json:"files"`
	Kept            int                `json:"kept"`
	AlreadyComplete bool               `json:"already_complete"`
	Work            *build.WorkSummary `json:"work"`
}

// printShard reports what one worker of a split build did.
func printShard(e *env, res *build.BuildResult, asJSON bool) error {
	var sw *build.ShardWork
	if res.Work != nil {
		sw = res.Work.Shards
	}
	if asJSON {
		return writeJSON(e.stdout, shardReport{SchemaVersion: schemaVersion, Dir: res.Dir, Shard: sw, Files: res.Files, Kept: res.Kept, AlreadyComplete: res.AlreadyComplete, Work: res.Work})
	}
	if sw == nil || (res.AlreadyComplete && res.Files == 0) {
		fmt.Fprintf(e.stdout, "checkpoint  %s already assembled; nothing to do\n", res.Dir)
		return nil
	}
	fmt.Fprintf(e.stdout, "worker      %d/%d: %d of %d units, %d files (%d kept from an earlier run)\n", sw.Worker, sw.Workers, sw.WorkerUnits, sw.Units, res.Files, res.Kept)
	fmt.Fprintf(e.stdout, "output      %s (unfinished until ttquant assemble %s)\n", res.Dir, res.Dir)
	return nil
}

// printShards prints the partition of a dry run with --shard.
func printShards(e *env, sw *build.ShardWork) {
	if sw == nil {
		return
	}
	fmt.Fprintf(e.stdout, "  split            %d units over %d workers; estimated seconds (nominal kernel rates): largest worker %.4g, mean %.4g (%+.1f%%), largest unit %.4g; worker %d has %d units in %d MoE layers\n",
		sw.Units, sw.Workers, sw.MaxSeconds, sw.MeanSeconds, 100*(sw.MaxSeconds/sw.MeanSeconds-1), sw.MaxUnitSeconds, sw.Worker, sw.WorkerUnits, sw.WorkerMoELayers)
}

func runAssemble(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "assemble", "DIR [--workers N] [--json]")
	workers := addWorkersFlag(fs, "files hashed")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("want one directory, the --out of the workers")
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	res, err := build.Assemble(ctx, build.AssembleOptions{Dir: pos[0], Workers: *workers})
	if errors.Is(err, build.ErrUnitDamaged) {
		return &statusError{status: exitVerifyKO, err: err}
	}
	if err != nil {
		return err
	}
	return printBuild(e, res, *asJSON)
}
