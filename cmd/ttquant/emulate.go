package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/ttquant/ttquant/emulator"
	"github.com/ttquant/ttquant/manifest"
	"github.com/ttquant/ttquant/safetensors"
)

func init() {
	register(&command{
		name:    "emulate",
		summary: "device numerics on the CPU: emulate matmul (y = x·Wᵀ) or check device dumps bit for bit",
		run:     runEmulate,
	})
}

func runEmulate(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		w, status := e.stderr, exitUsage
		if len(args) > 0 {
			w, status = e.stdout, exitOK
		}
		fmt.Fprintln(w, "usage: ttquant emulate matmul|check [flags]")
		fmt.Fprintln(w, "  matmul  y = x·Wᵀ for a checkpoint weight, as the device's Matrix Unit computes it")
		fmt.Fprintln(w, "  check   compare tensors read back from a device with the emulated decode, bit for bit")
		return &statusError{status: status}
	}
	switch args[0] {
	case "matmul":
		return runEmulateMatmul(ctx, e, args[1:])
	case "check":
		return runEmulateCheck(ctx, e, args[1:])
	}
	return usageErrorf("unknown emulate subcommand %q (want matmul or check)", args[0])
}

// checkDoc is the --json document of `emulate check`.
type checkDoc struct {
	SchemaVersion int    `json:"schema_version"`
	Checkpoint    string `json:"checkpoint"`
	Dump          string `json:"dump"`
	*emulator.CheckReport
}

func runEmulateCheck(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "emulate check", "--checkpoint DIR --dump DIR [--limit N] [--json]")
	ckpt := fs.String("checkpoint", "", "native checkpoint `directory`")
	dump := fs.String("dump", "", "`directory` of .safetensors files holding tensors read back from the device (BF16 or F32, logical shapes, checkpoint names)")
	limit := fs.Int("limit", 20, "mismatches listed per tensor (all are counted)")
	asJSON := fs.Bool("json", false, "print a JSON document")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageErrorf("unexpected arguments %q", fs.Args())
	}
	if *ckpt == "" || *dump == "" {
		return usageErrorf("--checkpoint and --dump are required")
	}
	if err := inRange("limit", int64(*limit), 0, math.MaxInt32); err != nil {
		return err
	}
	c, err := manifest.OpenCheckpoint(*ckpt)
	if err != nil {
		return err
	}
	rep, err := emulator.CheckDumpDir(ctx, *dump, emulator.CheckpointLookup(c), *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(e.stdout, checkDoc{SchemaVersion: schemaVersion, Checkpoint: *ckpt, Dump: *dump, CheckReport: rep}); err != nil {
			return err
		}
	} else {
		var b strings.Builder
		for _, r := range rep.Checked {
			status := "ok"
			if r.Mismatches > 0 {
				status = fmt.Sprintf("MISMATCH (%d of %d elements)", r.Mismatches, r.Elements)
			}
			fmt.Fprintf(&b, "%s: %s\n", r.Tensor, status)
			for _, m := range r.First {
				fmt.Fprintf(&b, "  %s\n", m)
			}
			if n := r.Mismatches - len(r.First); n > 0 {
				fmt.Fprintf(&b, "  ... and %d more\n", n)
			}
		}
		for _, s := range rep.Skipped {
			fmt.Fprintf(&b, "%s: skipped (%s): %s\n", s.Tensor, s.File, s.Reason)
		}
		fmt.Fprintf(&b, "%d tensors checked, %d skipped, %d mismatching elements\n", len(rep.Checked), len(rep.Skipped), rep.Mismatches)
		if _, err := e.stdout.Write([]byte(b.String())); err != nil {
			return err
		}
	}
	if rep.Mismatches > 0 {
		return &statusError{status: exitVerifyKO, err: fmt.Errorf("%d elements differ from the emulated decode", rep.Mismatches)}
	}
	return nil
}

func runEmulateMatmul(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "emulate matmul", "--checkpoint DIR --tensor NAME --input X.safetensors --fidelity hifi2 [--dst fp32|bf16] [--arch blackhole|wormhole] [--pack dst|bf16] --out Y.safetensors")
	ckpt := fs.String("checkpoint", "", "native checkpoint `directory`")
	tensor := fs.String("tensor", "", "weight tensor `name` [out, in] in the checkpoint")
	input := fs.String("input", "", "activations: safetensors `file` with a [tokens, in] (or [in]) BF16 tensor; F32 is rounded to BF16 (nearest, ties to even)")
	inputTensor := fs.String("input-tensor", "", "tensor `name` in --input (default: \"x\", or the only tensor)")
	fid := fs.String("fidelity", "hifi2", "math fidelity: lofi, hifi2, hifi3 or hifi4")
	dst := fs.String("dst", "fp32", "destination register format: fp32 (fp32_dest_acc_en) or bf16")
	arch := fs.String("arch", "blackhole", "device numerics: blackhole or wormhole")
	pack := fs.String("pack", "dst", "output: dst (the Dst contents: F32 for fp32 Dst, BF16 for bf16 Dst) or bf16 (the packer's BF16 output)")
	outPath := fs.String("out", "", "output safetensors `file`, tensor \"y\" [tokens, out]")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageErrorf("unexpected arguments %q", fs.Args())
	}
	if *ckpt == "" || *tensor == "" || *input == "" || *outPath == "" {
		return usageErrorf("--checkpoint, --tensor, --input and --out are required")
	}
	var cfg emulator.Config
	var err error
	if cfg.Fidelity, err = emulator.ParseFidelity(*fid); err != nil {
		return usageErrorf("%v", err)
	}
	if cfg.Dst, err = emulator.ParseDstFormat(*dst); err != nil {
		return usageErrorf("%v", err)
	}
	if cfg.Arch, err = emulator.ParseArch(*arch); err != nil {
		return usageErrorf("%v", err)
	}
	if *pack != "dst" && *pack != "bf16" {
		return usageErrorf("--pack must be dst or bf16, not %q", *pack)
	}
	c, err := manifest.OpenCheckpoint(*ckpt)
	if err != nil {
		return err
	}
	st, err := emulator.CheckpointLookup(c)(*tensor)
	if err != nil {
		return err
	}
	x, tokens, err := readActivations(*input, *inputTensor)
	if err != nil {
		return err
	}
	if sh := st.Layout.Shape; len(sh) == 2 && int64(len(x)) != int64(tokens)*sh[1] {
		return fmt.Errorf("%s: activations are [%d, %d] but %s: tensor %q is %v; --input must be [tokens, %d]",
			*input, tokens, len(x)/tokens, *ckpt, *tensor, sh, sh[1])
	}
	e.log.Info("emulating matmul", "tensor", *tensor, "format", st.Format, "shape", st.Layout.Shape, "tokens", tokens, "config", cfg.String())
	y, out, err := emulator.MatMulStored(ctx, st, x, tokens, cfg)
	if err != nil {
		return fmt.Errorf("%s: %w", *ckpt, err)
	}
	var data []byte
	dtype := safetensors.F32
	switch {
	case *pack == "bf16":
		dtype = safetensors.BF16
		for _, h := range emulator.PackDstBF16(y, cfg.Dst) {
			data = binary.LittleEndian.AppendUint16(data, h)
		}
	case cfg.Dst == emulator.DstBF16:
		dtype = safetensors.BF16
		for _, v := range y {
			data = binary.LittleEndian.AppendUint16(data, uint16(v>>16))
		}
	default:
		for _, v := range y {
			data = binary.LittleEndian.AppendUint32(data, v)
		}
	}
	md := map[string]string{
		"ttquant.emulate.tensor":     *tensor,
		"ttquant.emulate.checkpoint": c.Identity(),
		"ttquant.emulate.fidelity":   cfg.Fidelity.String(),
		"ttquant.emulate.dst":        cfg.Dst.String(),
		"ttquant.emulate.arch":       cfg.Arch.String(),
		"ttquant.emulate.pack":       *pack,
	}
	return safetensors.WriteFile(*outPath, []safetensors.Tensor{{Name: "y", DType: dtype, Shape: []int64{int64(tokens), int64(out)}, Data: data}}, md)
}

// readActivations reads BF16 activations [tokens, in] (or [in], one token)
// from a safetensors file; F32 values are rounded to BF16.
func readActivations(path, name string) ([]uint16, int, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	if name == "" {
		if _, ok := f.Lookup("x"); ok {
			name = "x"
		} else if ts := f.Tensors(); len(ts) == 1 {
			name = ts[0].Name
		} else {
			return nil, 0, fmt.Errorf("%s: no tensor named \"x\" and %d tensors to choose from (use --input-tensor)", path, len(ts))
		}
	}
	info, ok := f.Lookup(name)
	if !ok {
		return nil, 0, fmt.Errorf("%s: no tensor %q", path, name)
	}
	tokens := 1
	switch len(info.Shape) {
	case 1:
	case 2:
		tokens = int(info.Shape[0])
	default:
		return nil, 0, fmt.Errorf("%s: tensor %q has shape %v; activations must be [tokens, in] or [in]", path, name, info.Shape)
	}
	if info.NumElements() == 0 {
		return nil, 0, fmt.Errorf("%s: tensor %q is empty", path, name)
	}
	raw, err := f.ReadTensor(name)
	if err != nil {
		return nil, 0, err
	}
	x := make([]uint16, info.NumElements())
	switch info.DType {
	case safetensors.BF16:
		for i := range x {
			x[i] = binary.LittleEndian.Uint16(raw[2*i:])
		}
	case safetensors.F32:
		v := make([]float32, len(x))
		if err := safetensors.DecodeFloat32s(v, raw, safetensors.F32); err != nil {
			return nil, 0, fmt.Errorf("%s: tensor %q: %w", path, name, err)
		}
		for i, fv := range v {
			x[i] = safetensors.Float32ToBF16(fv)
		}
	default:
		return nil, 0, fmt.Errorf("%s: tensor %q is %v; activations must be BF16 or F32", path, name, info.DType)
	}
	return x, tokens, nil
}
