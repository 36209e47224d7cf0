package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ttquant/ttquant/internal/testmodel"
)

func init() {
	register(&command{name: "testmodel", summary: "write a built-in test checkpoint (tiny Qwen3.6-MoE, tiny dense Qwen3.5, or the sparse 35B and 27B shape replicas)", run: runTestModel})
}

// testModelDoc is the --json output of ttquant testmodel.
type testModelDoc struct {
	SchemaVersion int             `json:"schema_version"`
	Out           string          `json:"out"`
	Variant       string          `json:"variant"`
	Config        string          `json:"config"`
	Tensors       int             `json:"tensors"`
	DataBytes     int64           `json:"data_bytes"`
	Files         []testModelFile `json:"files"`
}

type testModelFile struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

const (
	replicaVariant    = "replica-35b"
	replica27BVariant = "replica-27b"
	qwen3NextVariant  = "qwen3-next"
	denseVariant      = "dense"
)

func runTestModel(ctx context.Context, e *env, args []string) error {
	var names []string
	for _, v := range testmodel.Variants() {
		names = append(names, v.String())
	}
	names = append(names, qwen3NextVariant, denseVariant, replicaVariant, replica27BVariant)
	fs := newFlagSet(e, "testmodel", "--out DIR [--variant "+strings.Join(names, "|")+"] [--vision] [--json]")
	out := fs.String("out", "", "output directory (created if needed; files of the same names are replaced)")
	variant := fs.String("variant", "default", "what to write: "+strings.Join(names, ", "))
	vision := fs.Bool("vision", false, "add three model.visual.* stub tensors to the tiny model")
	asJSON := fs.Bool("json", false, "print the written files as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *out == "" {
		return usageErrorf("--out is required")
	}
	var cfg testmodel.Config
	layout := testmodel.ExpertsFused
	fp8 := false
	if *variant == replicaVariant || *variant == replica27BVariant {
		if *vision {
			return usageErrorf("--vision applies to the tiny model only")
		}
		write := testmodel.WriteReplica35B
		cfg = testmodel.Qwen36_35B()
		if *variant == replica27BVariant {
			write, cfg = testmodel.WriteReplica27B, testmodel.Qwen35_27B()
		}
		if err := write(*out); err != nil {
			return err
		}
	} else if *variant == denseVariant {
		cfg = testmodel.DenseTiny()
		cfg.VisionStubs = *vision
		if err := testmodel.Write(*out, cfg, testmodel.Default); err != nil {
			return err
		}
	} else if *variant == qwen3NextVariant {
		if *vision {
			return usageErrorf("the Qwen3-Next flavour has no vision tower")
		}
		cfg = testmodel.Qwen3NextTiny()
		layout = testmodel.ExpertsPerExpert
		if err := testmodel.Write(*out, cfg, testmodel.Default); err != nil {
			return err
		}
	} else {
		v, err := testmodel.ParseVariant(*variant)
		if err != nil {
			return usageErrorf("--variant %q: want one of %s", *variant, strings.Join(names, ", "))
		}
		cfg = testmodel.Tiny()
		cfg.VisionStubs = *vision
		if v == testmodel.PerExpert {
			layout = testmodel.ExpertsPerExpert
		}
		fp8 = v == testmodel.FP8
		if err := testmodel.Write(*out, cfg, v); err != nil {
			return err
		}
	}
	specs, err := testmodel.Specs(cfg, layout, fp8)
	if err != nil {
		return err
	}
	doc := testModelDoc{SchemaVersion: schemaVersion, Out: *out, Variant: *variant, Config: cfg.Name, Tensors: len(specs)}
	for _, s := range specs {
		doc.DataBytes += s.Size()
	}
	entries, err := os.ReadDir(*out)
	if err != nil {
		return err
	}
	for _, en := range entries {
		n := en.Name()
		if !strings.HasSuffix(n, ".safetensors") && n != testmodel.IndexFile && n != "config.json" {
			continue
		}
		st, err := os.Stat(filepath.Join(*out, n))
		if err != nil {
			return err
		}
		doc.Files = append(doc.Files, testModelFile{Name: n, Size: st.Size()})
	}
	if *asJSON {
		return writeJSON(e.stdout, doc)
	}
	fmt.Fprintf(e.stdout, "wrote %s (%s, variant %s): %d tensors, %d data bytes, %d files\n",
		*out, cfg.Name, *variant, doc.Tensors, doc.DataBytes, len(doc.Files))
	return nil
}
