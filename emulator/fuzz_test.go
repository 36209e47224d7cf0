package emulator

import (
	"context"
	"encoding/binary"
	"math"
	"testing"
)

// FuzzCompareToken feeds arbitrary logit rows (pairs of float32 from the
// input bytes, NaN and ±Inf included) to CompareToken: it must never panic,
// must reject exactly the rows that define no distribution, and otherwise
// give a KL that is ≥ 0 (possibly +Inf, never NaN), arg-maxes in range and
// KL = 0 against itself.
func FuzzCompareToken(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 128, 191}, 0)
	f.Add([]byte{0, 0, 128, 255, 0, 0, 128, 255, 0, 0, 128, 63, 0, 0, 0, 0}, 1)
	f.Add([]byte{0, 0, 192, 127, 0, 0, 0, 0}, -1)
	f.Add([]byte{0, 0, 128, 127, 0, 0, 0, 0}, 0)
	f.Fuzz(func(t *testing.T, data []byte, target int) {
		n := len(data) / 8
		if n == 0 {
			return
		}
		ref := make([]float32, n)
		cand := make([]float32, n)
		for i := 0; i < n; i++ {
			ref[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[8*i:]))
			cand[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[8*i+4:]))
		}
		if target < -1 || target >= n {
			target = -1
		}
		bad := func(x []float32) bool {
			fin := false
			for _, v := range x {
				if v != v || math.IsInf(float64(v), 1) {
					return true
				}
				fin = fin || !math.IsInf(float64(v), -1)
			}
			return !fin
		}
		q, err := CompareToken(ref, cand, target)
		if (err != nil) != (bad(ref) || bad(cand)) {
			t.Fatalf("ref %v cand %v: error %v", ref, cand, err)
		}
		if err != nil {
			return
		}
		if math.IsNaN(q.KL) || q.KL < 0 || q.RefTop1 < 0 || q.RefTop1 >= n || q.CandTop1 < 0 || q.CandTop1 >= n {
			t.Fatalf("ref %v cand %v: %+v", ref, cand, q)
		}
		if target >= 0 && (math.IsNaN(q.RefNLL) || q.RefNLL < -1e-12 || math.IsNaN(q.CandNLL)) {
			t.Fatalf("ref %v cand %v target %d: %+v", ref, cand, target, q)
		}
		self, err := CompareToken(ref, ref, target)
		if err != nil || self.KL != 0 || self.RefTop1 != self.CandTop1 {
			t.Fatalf("ref %v against itself: %+v, %v", ref, self, err)
		}
	})
}

// FuzzDeviceMatMul feeds arbitrary activations (BF16 patterns) and weights
// (source-register data, any TF32 pattern) of one to three K-tiles to the
// device matmul fast path, for one token and one output column, and checks
// the Dst against a direct loop of MVMULStep in the device's order, for
// the fidelity, Dst format and architecture the first byte selects.
func FuzzDeviceMatMul(f *testing.F) {
	f.Add([]byte{0x00, 0x80, 0x3f, 0x00, 0x04, 0xfe, 0x01})
	f.Add([]byte{0x0f, 0xff, 0x7f, 0xff, 0xff, 0x03, 0x00, 0x80, 0xbf})
	f.Add(make([]byte, 1+6*96))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 {
			return
		}
		sel := data[0]
		cfg := Config{Fidelity: Fidelity(sel & 3), Dst: DstFormat(sel >> 2 & 1), Arch: Arch(sel >> 3 & 1)}
		if sel&0x10 != 0 { // the vector kernel's configuration, when present
			cfg.Dst, cfg.Arch = DstFP32, Blackhole
		}
		data = data[1:]
		in := min(len(data)/6, 3*TileDim)
		if in == 0 {
			return
		}
		x := make([]uint16, in)
		ws := make([]Src, in)
		for k := 0; k < in; k++ {
			x[k] = binary.LittleEndian.Uint16(data[6*k:])
			ws[k] = Src(binary.LittleEndian.Uint32(data[6*k+2:]) & (1<<19 - 1))
		}
		kp := (in + TileDim - 1) / TileDim * TileDim
		w := &DeviceWeights{out: 1, in: in, a: newSrcOperand(1, kp)}
		for k := 0; k < in; k++ {
			w.a.set(k, ws[k], true)
		}
		a, err := PrepareActivationsBF16(x, 1, in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DeviceMatMulDst(context.Background(), a, w, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var d uint32
		for kt := 0; kt < kp; kt += TileDim {
			for ph := 0; ph < cfg.Fidelity.Phases(); ph++ {
				for kb := kt; kb < kt+TileDim; kb += Lanes {
					var av, bv [Lanes]Src
					for i := 0; i < Lanes && kb+i < in; i++ {
						av[i], bv[i] = ws[kb+i], SrcFromBF16(x[kb+i])
					}
					d = MVMULStep(d, &av, &bv, ph, cfg.Dst, cfg.Arch)
				}
			}
		}
		if got[0] != d {
			t.Fatalf("%v, %d inputs: fast path %08x, MVMULStep %08x", cfg, in, got[0], d)
		}
	})
}
