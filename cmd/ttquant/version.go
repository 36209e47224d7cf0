package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

func init() {
	register(&command{name: "version", summary: "print the module version and VCS revision", run: runVersion})
}

// buildInfo is the identity of this binary.
type buildInfo struct {
	SchemaVersion int    `json:"schema_version"`
	Module        string `json:"module"`
	Version       string `json:"version"`
	Revision      string `json:"revision,omitempty"`
	Modified      bool   `json:"modified,omitempty"`
	GoVersion     string `json:"go_version"`
}

// revision is the VCS revision when the build stamps none, set with
// -ldflags "-X main.revision=$(git rev-parse HEAD)". The go command stamps
// vcs.revision itself only when VCS stamping is on (-buildvcs, off when
// GOFLAGS says -buildvcs=false) and it recognises the checkout: it looks
// for a .git directory, so a linked git worktree, whose .git is a file, is
// not recognised (docs/cli.md).
var revision string

func readBuildInfo() buildInfo {
	info, _ := debug.ReadBuildInfo()
	return buildInfoOf(info, revision)
}

// buildInfoOf extracts the identity from build information (nil when the
// binary has none) and the -X fallback revision.
func buildInfoOf(info *debug.BuildInfo, fallbackRev string) buildInfo {
	b := buildInfo{SchemaVersion: schemaVersion, Module: "github.com/ttquant/ttquant", Version: "(unknown)", Revision: fallbackRev}
	if info == nil {
		return b
	}
	b.GoVersion = info.GoVersion
	if info.Main.Path != "" {
		b.Module = info.Main.Path
	}
	if info.Main.Version != "" {
		b.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

func runVersion(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "version", "[--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	b := readBuildInfo()
	if *asJSON {
		return writeJSON(e.stdout, b)
	}
	rev := b.Revision
	if rev == "" {
		rev = "unknown revision (built without VCS stamping: see docs/cli.md)"
	}
	if b.Modified {
		rev += " (modified)"
	}
	fmt.Fprintf(e.stdout, "ttquant %s %s, %s\n", b.Version, rev, b.GoVersion)
	return nil
}
