package selection

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/internal/text/dataset"
)

// TestSplitOptionsRefused: each rule of a split measurement's options is
// refused by RunShard and Run before anything is read, with a *SplitError
// naming the rule; its message names the options, or the names a caller
// gives.
func TestSplitOptionsRefused(t *testing.T) {
	parts := t.TempDir()
	flags := SplitNames{Shard: "--shard", Parts: "--parts", Data: "--data", Calib: "--calib"}
	for _, c := range []struct {
		shard       shard.Spec
		fromText    bool
		parts       string
		rule        SplitRule
		want, flags string
	}{
		{shard.Spec{Index: 3, Count: 3}, false, parts, SplitBadShard, "selection: Shard 3/3 names no worker", "--shard 3/3 names no worker"},
		{shard.Spec{Index: 0, Count: 2}, true, parts, SplitFromText, "selection: Shard splits a measurement from a calibration store (Measure.Calib)", "--shard splits a measurement from a calibration store (--calib); the sequential builds of --data stay on one machine"},
		{shard.Spec{Index: 0, Count: 3}, false, "", SplitNoParts, "selection: Shard 0/3 needs Parts,", "--shard 0/3 needs --parts,"},
		{shard.Spec{}, false, parts, SplitPartsAlone, "selection: Parts is for the workers of a split measurement (Shard i/N)", "--parts is for the workers of a split measurement (--shard i/N)"},
	} {
		opt := RunOptions{Measure: MeasureOptions{Source: filepath.Join(t.TempDir(), "none"), Calib: "store"}, Shard: c.shard, Parts: c.parts,
			SensitivityFile: filepath.Join(t.TempDir(), "s.json")}
		if c.fromText {
			opt.Measure.Calib, opt.Measure.Data = "", &dataset.Spec{}
		}
		run := RunShard
		if c.shard.Count == 0 {
			run = func(ctx context.Context, opt RunOptions) (*ShardReport, error) {
				_, err := Run(ctx, opt)
				return nil, err
			}
		}
		_, err := run(context.Background(), opt)
		var se *SplitError
		if !errors.As(err, &se) || se.Rule != c.rule || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%+v: %v, want rule %d: %q", c.shard, err, c.rule, c.want)
			continue
		}
		if got := se.Message(flags); !strings.HasPrefix(got, c.flags) {
			t.Errorf("%+v: message %q, want %q", c.shard, got, c.flags)
		}
	}
	for _, ok := range []RunOptions{{}, {Shard: shard.Spec{Index: 0, Count: 1}, Parts: parts}, {Shard: shard.Spec{Index: 2, Count: 3}, Parts: parts}} {
		if err := CheckSplit(ok.Shard, false, ok.Parts); err != nil {
			t.Errorf("%+v: %v", ok.Shard, err)
		}
	}
	if _, err := Run(context.Background(), RunOptions{Shard: shard.Spec{Index: 0, Count: 2}, Parts: parts}); err == nil || !strings.Contains(err.Error(), "RunShard") {
		t.Errorf("Run as a worker: %v", err)
	}
}
