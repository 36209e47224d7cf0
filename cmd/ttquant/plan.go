package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
	"github.com/ttquant/ttquant/safetensors"
)

func init() {
	register(&command{name: "plan", summary: "show what a precision plan does to every tensor of a model (reads headers only)", run: runPlan})
}

// planDoc is the --json output of ttquant plan.
type planDoc struct {
	SchemaVersion   int                `json:"schema_version"`
	Model           string             `json:"model"`
	Plan            *plan.Plan         `json:"plan"`
	SourceTensors   int                `json:"source_tensors"`
	StoredTensors   int                `json:"stored_tensors"`
	SourceBytes     int64              `json:"source_bytes"`
	StoredBytes     int64              `json:"stored_bytes"`
	NumLayers       int                `json:"num_layers"`
	NumMTPLayers    int                `json:"num_mtp_layers"`
	Experts         int                `json:"experts"`
	ExpertsPerFile  int                `json:"experts_per_file"`
	ExpertFiles     int                `json:"expert_files"`
	DenseFiles      int                `json:"dense_files"`
	DenseShardBytes int64              `json:"dense_shard_bytes"`
	TensorFiles     int                `json:"tensor_files"`
	Totals          []plan.FormatTotal `json:"totals"`
	Tensors         []planTensorDoc    `json:"tensors"`
}

// planTensorDoc is one stored tensor of the --json output. Rule is
// 1-based, as in error messages; sources are listed only when the tensor is
// a slice of its source or a concatenation of several.
type planTensorDoc struct {
	Name        string                `json:"name"`
	Role        model.Role            `json:"role"`
	Rule        int                   `json:"rule"`
	Format      manifest.StoredFormat `json:"format"`
	Method      manifest.Method       `json:"method"`
	Axis        bfp.Axis              `json:"axis,omitempty"`
	Tile        string                `json:"tile,omitempty"`
	StoredDType string                `json:"stored_dtype,omitempty"`
	Shape       []int64               `json:"shape"`
	Source      string                `json:"source"`
	Sources     []plan.SourceSlice    `json:"sources,omitempty"`
	SourceDType string                `json:"source_dtype"`
	Expert      *int                  `json:"expert,omitempty"`
	ExpertGroup *int                  `json:"expert_group,omitempty"`
	Layer       *int                  `json:"layer,omitempty"`
	MTP         bool                  `json:"mtp,omitempty"`
	SourceBytes int64                 `json:"source_bytes"`
	StoredBytes int64                 `json:"stored_bytes"`
}

func tensorDocs(ts []plan.PlannedTensor) []planTensorDoc {
	out := make([]planTensorDoc, len(ts))
	for i := range ts {
		t := &ts[i]
		d := planTensorDoc{
			Name: t.Name, Role: t.Role, Rule: t.RuleIndex + 1, Format: t.Format, Method: t.Method, Axis: t.Axis, Tile: t.Tile,
			StoredDType: t.StoredDType, Shape: t.Shape, Source: t.Source, SourceDType: t.SourceDType, MTP: t.MTP,
			SourceBytes: t.SourceBytes, StoredBytes: t.StoredBytes,
		}
		if len(t.Sources) != 1 || t.Sources[0].Expert >= 0 {
			d.Sources = t.Sources
		}
		if t.Expert >= 0 {
			d.Expert, d.ExpertGroup = &t.Expert, &t.ExpertGroup
		}
		if t.Layer >= 0 {
			d.Layer = &t.Layer
		}
		out[i] = d
	}
	return out
}

func runPlan(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "plan", "--model PATH [--preset NAME | --plan FILE] [--axis input|output] [--json] [--all]\n       ttquant plan --list-presets\n       ttquant plan [--preset NAME | --plan FILE] [--axis input|output] --print-plan")
	model := fs.String("model", "", "source checkpoint: a .safetensors file, a directory or a *.index.json")
	pf := addPlanFlags(fs)
	asJSON := fs.Bool("json", false, "print the resolved plan as JSON (every stored tensor)")
	all := fs.Bool("all", false, "list every routed expert tensor instead of one line per expert block")
	list := fs.Bool("list-presets", false, "list the built-in presets and exit")
	printPlan := fs.Bool("print-plan", false, "print the plan as a plan file (JSON) and exit; a starting point for --plan")
	perFile := fs.Int("experts-per-file", manifest.DefaultExpertsPerFile, "routed experts per grouped expert file")
	denseShard := fs.Int64("dense-shard-bytes", manifest.DefaultDenseShardBytes, "size limit of a dense shard file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *list {
		for _, n := range plan.PresetNames() {
			p, _ := plan.Preset(n)
			fmt.Fprintf(e.stdout, "%-16s %s\n", n, p.Description)
		}
		return nil
	}
	if err := inRange("experts-per-file", int64(*perFile), 1, build.MaxExpertsPerFile); err != nil {
		return err
	}
	if err := inRange("dense-shard-bytes", *denseShard, 1, math.MaxInt64); err != nil {
		return err
	}
	pl, err := pf.load()
	if err != nil {
		return err
	}
	if *printPlan {
		b, err := pl.MarshalPlan()
		if err != nil {
			return err
		}
		_, err = e.stdout.Write(b)
		return err
	}
	if *model == "" {
		return usageErrorf("--model is required")
	}
	m, err := safetensors.OpenModel(*model)
	if err != nil {
		return err
	}
	defer m.Close()
	for _, w := range m.Warnings() {
		e.log.Warn(w)
	}
	r, err := pl.ResolveWith(m, plan.ResolveOptions{ExpertsPerFile: *perFile, DenseShardBytes: *denseShard})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, planDoc{
			SchemaVersion: schemaVersion, Model: r.Model, Plan: r.Plan,
			SourceTensors: r.SourceTensors, StoredTensors: len(r.Tensors),
			SourceBytes: r.SourceBytes, StoredBytes: r.StoredBytes,
			NumLayers: r.NumLayers, NumMTPLayers: r.NumMTPLayers, Experts: r.Experts,
			ExpertsPerFile: r.ExpertsPerFile, ExpertFiles: r.ExpertFiles, DenseFiles: r.DenseFiles,
			DenseShardBytes: r.DenseShardBytes, TensorFiles: r.TensorFiles(),
			Totals: r.Totals, Tensors: tensorDocs(r.Tensors),
		})
	}
	return printResolved(e.stdout, r, *all)
}

func planShape(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// printResolved prints one line per stored tensor, routed experts collapsed
// per block and kind when they share a rule (unless all), then the totals
// and the predicted files.
func printResolved(w io.Writer, r *plan.Resolved, all bool) error {
	fmt.Fprintf(w, "plan %s on %s\n", r.Plan.Name, r.Model)
	fmt.Fprintf(w, "%d source tensors (%d layers, %d MTP, %d experts) -> %d stored tensors\n\n",
		r.SourceTensors, r.NumLayers, r.NumMTPLayers, r.Experts, len(r.Tensors))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tFORMAT\tMETHOD\tSHAPE\tSTORED\tTENSOR\tSOURCE")
	// Group the routed experts of a block by kind, rule and source (unless
	// all): each group prints as one line where its first member stands.
	groups := map[string][]int{}
	var order [][]int
	var keys []string
	for i, t := range r.Tensors {
		if all || t.Expert < 0 {
			order = append(order, []int{i})
			keys = append(keys, "")
			continue
		}
		src := "per-expert"
		if len(t.Sources) == 1 && t.Sources[0].Expert >= 0 {
			src = t.Source
		}
		key := fmt.Sprintf("%d|%s|%d|%s", t.Layer, t.ExpertKind, t.RuleIndex, src)
		if _, ok := groups[key]; !ok {
			order = append(order, nil)
			keys = append(keys, key)
		}
		groups[key] = append(groups[key], i)
	}
	for k, members := range order {
		if keys[k] != "" {
			members = groups[keys[k]]
		}
		t := r.Tensors[members[0]]
		src := t.Source
		if len(t.Sources) > 1 {
			src = fmt.Sprintf("%s + %d more", t.Source, len(t.Sources)-1)
		}
		if src == t.Name {
			src = "="
		}
		name, shape := t.Name, planShape(t.Shape)
		var stored int64
		for _, i := range members {
			stored += r.Tensors[i].StoredBytes
		}
		if n := len(members); n > 1 {
			last := r.Tensors[members[n-1]]
			name = strings.Replace(t.Name, fmt.Sprintf("experts.%d.", t.Expert), fmt.Sprintf("experts.{%d..%d}.", t.Expert, last.Expert), 1)
			shape = fmt.Sprintf("%d x %s", n, shape)
			if len(t.Sources) == 1 && t.Sources[0].Expert >= 0 {
				src = t.Source
			} else {
				src = "per-expert tensors"
			}
		}
		method := t.Method.String()
		if t.Axis != "" {
			method += "/" + t.Axis.String()
		}
		format := t.Format.String()
		if t.Format == manifest.StoreAsIs {
			format += "(" + t.StoredDType + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", t.RuleIndex+1, format, method, shape, humanBytes(stored), name, src)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "FORMAT\tTENSORS\tELEMENTS\tSOURCE\tSTORED\t")
	for _, ft := range r.Totals {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t\n", ft.Format, ft.Tensors, ft.Elements, humanBytes(ft.SourceBytes), humanBytes(ft.StoredBytes))
	}
	fmt.Fprintf(tw, "total\t%d\t\t%s\t%s\t\n", len(r.Tensors), humanBytes(r.SourceBytes), humanBytes(r.StoredBytes))
	if err := tw.Flush(); err != nil {
		return err
	}
	ratio := 0.0
	if r.SourceBytes > 0 {
		ratio = 100 * float64(r.StoredBytes) / float64(r.SourceBytes)
	}
	fmt.Fprintf(w, "\npredicted checkpoint: %s (%d bytes of tensor data, %.1f%% of the source)\n", humanBytes(r.StoredBytes), r.StoredBytes, ratio)
	fmt.Fprintf(w, "predicted files: %d grouped expert files (%d experts per file, gate_up and down per group and layer) + %d dense shard(s) = %d tensor files, plus the manifest, checksums and configuration files\n",
		r.ExpertFiles, r.ExpertsPerFile, r.DenseFiles, r.TensorFiles())
	return nil
}
