package harness

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/ttquant/ttquant/internal/benchenv"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/testdata"
	"github.com/ttquant/ttquant/manifest/build"
	"github.com/ttquant/ttquant/manifest/plan"
)

// BenchmarkForwardNumerics runs one 256-token window (forward pass and
// logits) of the trained tiny model's RTN checkpoint (the 35B preset's
// rules) as an evaluation candidate does, in float32 and with device
// numerics at each fidelity, and reports tokens per second (and per
// CPU-second of the process, steadier on a shared machine). Weights are
// prepared before the timer starts, as a resident run keeps them.
func BenchmarkForwardNumerics(b *testing.B) {
	dir := testdata.Dir(b, "models", "tiny-qwen36-trained")
	ckpt := filepath.Join(b.TempDir(), "rtn")
	p, err := plan.Preset(plan.PresetQwen36MoE)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := build.Convert(context.Background(), build.BuildOptions{Source: dir, Out: ckpt, Plan: p}); err != nil {
		b.Fatal(err)
	}
	ref, err := forward.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer ref.Close()
	ns, err := OpenNative(ckpt)
	if err != nil {
		b.Fatal(err)
	}
	const T = 256
	ids := make([]int32, T)
	for i := range ids {
		ids[i] = int32((i*131 + 7) % 4064)
	}
	for _, mode := range []string{"cpu", "device:LoFi", "device:HiFi2", "device:HiFi3", "device:HiFi4"} {
		b.Run(mode, func(b *testing.B) {
			n, err := ParseNumerics(mode, "")
			if err != nil {
				b.Fatal(err)
			}
			m, err := forward.New(ref.Config, forward.Overlay{ns, ref.Src})
			if err != nil {
				b.Fatal(err)
			}
			m.Resident = true
			if err := n.apply(m, ns, 0, true); err != nil {
				b.Fatal(err)
			}
			r := newRunner(m)
			window := func() {
				wl, err := r.Forward(context.Background(), ids)
				if err != nil {
					b.Fatal(err)
				}
				lg := make([]float32, 64*ref.Config.Vocab)
				for lo := 0; lo < T; lo += 64 {
					if err := wl.Logits(lg, lo, lo+64); err != nil {
						b.Fatal(err)
					}
				}
			}
			window() // loads and prepares the weights
			c0 := benchenv.CPU()
			b.ResetTimer()
			for range b.N {
				window()
			}
			b.StopTimer()
			b.ReportMetric(float64(T*b.N)/b.Elapsed().Seconds(), "tokens/s")
			if c := benchenv.CPU() - c0; c > 0 {
				b.ReportMetric(float64(T*b.N)/c.Seconds(), "tokens/cpu-s")
			}
		})
	}
}
