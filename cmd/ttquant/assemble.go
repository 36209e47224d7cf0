package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/shard"

	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/selection"
)

func init() {
	register(&command{name: "assemble", summary: "write the manifest of a build, the index of a calibration store, or the sensitivity file of a select measurement, split across workers (--shard) once every worker has finished", run: runAssemble})
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
	fmt.Fprintf(e.stdout, "  memory per node  worker %d about %s (its largest unit: %s); every node at most %s (estimated at 128 × 2,048 calibration tokens and --workers in flight)\n",
		sw.Worker, gib(sw.WorkerBytes), sw.WorkerBytesUnit, gib(sw.MaxWorkerBytes))
}

// gib spells a byte count in GiB.
func gib(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

func runAssemble(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "assemble", "DIR|STORE|PARTS [--workers N] [--json]")
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
	if isStoreDir(pos[0]) {
		return assembleStore(ctx, e, pos[0], *workers, *asJSON)
	}
	if selection.IsMeasurementDir(pos[0]) {
		return assembleMeasurement(ctx, e, pos[0], *workers, *asJSON)
	}
	res, err := build.Assemble(ctx, build.AssembleOptions{Dir: pos[0], Workers: *workers})
	if errors.Is(err, shard.ErrUnitDamaged) {
		return &statusError{status: exitVerifyKO, err: err}
	}
	if err != nil {
		return err
	}
	return printBuild(e, res, *asJSON)
}

// isStoreDir reports whether dir is a calibration store, assembled or
// still the workers' (their records), rather than a checkpoint.
func isStoreDir(dir string) bool {
	if calib.HasSplitRecords(dir) {
		return true
	}
	_, err := os.Stat(filepath.Join(dir, calib.StoreIndexName))
	return err == nil
}

// storeAssembleDoc is the --json document of assemble on a calibration
// store.
type storeAssembleDoc struct {
	SchemaVersion   int    `json:"schema_version"`
	Store           string `json:"store"`
	Workers         int    `json:"workers"`
	Units           int    `json:"units"`
	AlreadyComplete bool   `json:"already_complete"`
	*calib.StoreStats
}

// assembleStore writes the store of a split calib build.
func assembleStore(ctx context.Context, e *env, dir string, workers int, asJSON bool) error {
	res, err := calib.AssembleStore(ctx, calib.StoreAssembleOptions{Dir: dir, Workers: workers, Faults: testFaults})
	if errors.Is(err, shard.ErrUnitDamaged) {
		return &statusError{status: exitVerifyKO, err: err}
	}
	if err != nil {
		return err
	}
	stats, err := calib.ComputeStoreStats(res.Store, nil, nil, 0)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, storeAssembleDoc{SchemaVersion: schemaVersion, Store: dir, Workers: res.Workers, Units: res.Units,
			AlreadyComplete: res.AlreadyComplete, StoreStats: stats})
	}
	p := res.Store.Provenance()
	if res.AlreadyComplete {
		fmt.Fprintf(e.stdout, "store       %s already assembled; nothing to do\n", dir)
	} else {
		fmt.Fprintf(e.stdout, "assembled   %s from %d workers (%d units)\n", dir, res.Workers, res.Units)
	}
	fmt.Fprintf(e.stdout, "store       %d sites, %d sequences, %d tokens; token ids sha256 %s\n", len(stats.Sites), p.Sequences, p.Tokens, p.TokenIDsSHA256)
	return nil
}

// measureAssembleDoc is the --json document of assemble on a split
// measurement's directory.
type measureAssembleDoc struct {
	SchemaVersion int `json:"schema_version"`
	*selection.MeasureAssembly
}

// assembleMeasurement finishes a stage of a split select measurement.
func assembleMeasurement(ctx context.Context, e *env, dir string, workers int, asJSON bool) error {
	res, err := selection.AssembleMeasurement(ctx, selection.MeasureAssembleOptions{Dir: dir, Workers: workers})
	if errors.Is(err, shard.ErrUnitDamaged) {
		return &statusError{status: exitVerifyKO, err: err}
	}
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, measureAssembleDoc{SchemaVersion: schemaVersion, MeasureAssembly: res})
	}
	for _, f := range res.Assembled {
		fmt.Fprintf(e.stdout, "assembled   measurement build %s from %d workers\n", f, res.Workers)
	}
	switch {
	case res.Pending:
		fmt.Fprintf(e.stdout, "next        the single-change evaluations: run the %d workers again, then ttquant assemble %s\n", res.Workers, dir)
	case res.Unchanged:
		fmt.Fprintf(e.stdout, "sensitivity %s already assembled; nothing to do\n", res.SensitivityFile)
	default:
		fmt.Fprintf(e.stdout, "sensitivity %s written (%d matrices, %d single changes from %d workers)\n", res.SensitivityFile, len(res.Sensitivity.Tensors), res.Changes, res.Workers)
	}
	return nil
}
