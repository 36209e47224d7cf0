package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ttquant/ttquant/emulator/eval/harness"
	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/text/tokenizer"
)

func init() {
	register(&command{
		name:    "run",
		summary: "run the model's CPU forward pass: next-token predictions, greedy continuation, logit and layer dumps",
		run:     runRun,
	})
}

type runDoc struct {
	SchemaVersion int                  `json:"schema_version"`
	Model         string               `json:"model"`
	Checkpoint    string               `json:"checkpoint,omitempty"`
	Family        string               `json:"family"`
	Tokens        []int32              `json:"tokens"`
	Top           []forward.Prediction `json:"top"`
	Continuation  []int32              `json:"continuation"`
	LogitsFile    string               `json:"logits_file,omitempty"`
	LayersFile    string               `json:"layers_file,omitempty"`
	Seconds       float64              `json:"seconds"`
}

func runRun(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "run", "--model DIR (--tokens 1,2,3 | --text TEXT) [--top K] [--generate N] [--dump-logits FILE [--mtp]] [--dump-layers FILE] [--json]")
	model := fs.String("model", "", "Hugging Face model directory (config.json and safetensors)")
	native := fs.String("checkpoint", "", "native ttquant checkpoint of this model: its decoded (dequantized) weights replace the model's")
	tokens := fs.String("tokens", "", "comma-separated token ids")
	text := fs.String("text", "", "text to tokenize with the model's tokenizer.json (instead of --tokens)")
	top := fs.Int("top", 5, "number of next-token predictions to print (1..100)")
	gen := fs.Int("generate", 8, "greedy continuation length (0..4096)")
	dumpLogits := fs.String("dump-logits", "", "write the logits of every position (tensor logits, F32 [T, V]) to this safetensors file")
	mtp := fs.Bool("mtp", false, "with --dump-logits, also write the MTP head's logits (mtp_logits, F32 [T-1, V])")
	dumpLayers := fs.String("dump-layers", "", "write the residual stream before layer 0 (embed) and after each layer (layer.N), F32 [T, hidden]")
	workers := addWorkersFlag(fs, "goroutines")
	asJSON := fs.Bool("json", false, "print a JSON document")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageErrorf("run takes no arguments, got %q", fs.Args())
	}
	if *model == "" {
		return usageErrorf("--model DIR is required")
	}
	if (*text == "") == (*tokens == "") {
		return usageErrorf("give exactly one of --tokens (comma-separated token ids) and --text")
	}
	if *top < 1 || *top > 100 {
		return usageErrorf("--top must be in 1..100, got %d", *top)
	}
	if *gen < 0 || *gen > 4096 {
		return usageErrorf("--generate must be in 0..4096, got %d", *gen)
	}
	if *mtp && *dumpLogits == "" {
		return usageErrorf("--mtp needs --dump-logits")
	}
	if err := checkWorkers(*workers); err != nil {
		return err
	}
	tok, ids, err := promptIDs(*model, *text, *tokens)
	if err != nil {
		return err
	}
	prev := kernels.SetWorkers(*workers)
	defer kernels.SetWorkers(prev)

	start := time.Now()
	src, err := forward.Open(*model)
	if err != nil {
		return err
	}
	defer src.Close()
	m, err := withCheckpoint(e, src, *model, *native)
	if err != nil {
		return err
	}
	cfg := m.Config
	if err := cfg.CheckTokens(ids); err != nil {
		if tok != nil {
			return fmt.Errorf("%s: the tokenized text's %w", *model, err)
		}
		return usageErrorf("--tokens: %v", err)
	}
	if *mtp && cfg.MTPLayers == 0 {
		return usageErrorf("--mtp: the model has no MTP layer")
	}
	e.log.Info("checking weights", "model", *model, "family", cfg.Arch.String(), "layers", cfg.Layers)
	if err := m.CheckFinite(); err != nil {
		return err
	}
	m.Resident = true
	if *dumpLogits != "" || *dumpLayers != "" {
		e.log.Info("dumping", "tokens", len(ids))
		if err := m.WriteDumps(ids, forward.DumpOptions{LogitsPath: *dumpLogits, MTP: *mtp, LayersPath: *dumpLayers}); err != nil {
			return err
		}
	}
	preds, cont, err := m.Generate(ids, *top, *gen)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, runDoc{SchemaVersion: schemaVersion, Model: *model, Checkpoint: *native, Family: cfg.Arch.String(),
			Tokens: ids, Top: preds, Continuation: cont, LogitsFile: *dumpLogits, LayersFile: *dumpLayers,
			Seconds: time.Since(start).Seconds()})
	}
	printRun(e, *model, *native, cfg, ids, preds, cont, tok)
	for _, f := range []string{*dumpLogits, *dumpLayers} {
		if f != "" {
			fmt.Fprintf(e.stdout, "wrote %s\n", f)
		}
	}
	return nil
}

// parseTokens parses "1,2,3" into token ids.
func parseTokens(s string) ([]int32, error) {
	parts := strings.Split(s, ",")
	ids := make([]int32, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		v, err := strconv.ParseInt(p, 10, 32)
		if err != nil || v < 0 {
			return nil, usageErrorf("--tokens: entry %d (%q) is not a non-negative token id", i, p)
		}
		ids = append(ids, int32(v))
	}
	return ids, nil
}

// promptIDs is the prompt: text encoded with the model's tokenizer (which
// it also returns), or the comma-separated token ids.
func promptIDs(model, text, tokens string) (*tokenizer.Tokenizer, []int32, error) {
	if text == "" {
		ids, err := parseTokens(tokens)
		return nil, ids, err
	}
	tok, err := tokenizer.Load(model)
	if err != nil {
		return nil, nil, err
	}
	var ids []int32
	for _, id := range tok.Encode(text) {
		ids = append(ids, int32(id))
	}
	if len(ids) == 0 {
		return nil, nil, usageErrorf("--text: the text encodes to no tokens")
	}
	return tok, ids, nil
}

// withCheckpoint is the model with the decoded weights of the native
// checkpoint in place of its own (src itself without one); the model's
// own tensors stay underneath for anything the checkpoint lacks.
func withCheckpoint(e *env, src *forward.Model, model, native string) (*forward.Model, error) {
	if native == "" {
		return src, nil
	}
	ns, err := harness.OpenNative(native)
	if err != nil {
		return nil, err
	}
	if err := ns.CheckSource(model, native); err != nil {
		return nil, err
	}
	m, err := forward.New(src.Config, forward.Overlay{ns, src.Src})
	if err != nil {
		return nil, fmt.Errorf("--checkpoint %s: %w", native, err)
	}
	e.log.Info("using decoded native weights", "checkpoint", native, "tensors", ns.Len())
	return m, nil
}

// printRun prints the predictions and the continuation as text.
func printRun(e *env, modelDir, native string, cfg *model.Config, ids []int32, preds []forward.Prediction, cont []int32, tok *tokenizer.Tokenizer) {
	fmt.Fprintf(e.stdout, "model %s (%s, %d layers, hidden %d, vocab %d), %d prompt tokens\n",
		modelDir, cfg.Arch, cfg.Layers, cfg.Hidden, cfg.Vocab, len(ids))
	if native != "" {
		fmt.Fprintf(e.stdout, "weights decoded from native checkpoint %s\n", native)
	}
	fmt.Fprintf(e.stdout, "next token after position %d:\n", len(ids)-1)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rank\tid\tlogit\tprob\t")
	for i, p := range preds {
		fmt.Fprintf(tw, "%d\t%d\t%.4f\t%.4f\t\n", i+1, p.ID, p.Logit, p.Prob)
	}
	tw.Flush()
	if len(cont) > 0 {
		s := make([]string, len(cont))
		for i, id := range cont {
			s[i] = strconv.Itoa(int(id))
		}
		fmt.Fprintf(e.stdout, "greedy continuation: %s\n", strings.Join(s, ","))
		if tok != nil {
			c := make([]int, len(cont))
			for i, id := range cont {
				c[i] = int(id)
			}
			if str, err := tok.Decode(c); err == nil {
				fmt.Fprintf(e.stdout, "as text: %q\n", str)
			}
		}
	}
}
