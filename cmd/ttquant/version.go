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

func readBuildInfo() buildInfo {
	b := buildInfo{SchemaVersion: schemaVersion, Module: "github.com/ttquant/ttquant", Version: "(unknown)"}
	info, ok := debug.ReadBuildInfo()
	if !ok {
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
		rev = "unknown revision"
	}
	if b.Modified {
		rev += " (modified)"
	}
	fmt.Fprintf(e.stdout, "ttquant %s %s, %s\n", b.Version, rev, b.GoVersion)
	return nil
}
