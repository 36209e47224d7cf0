package emulator

import (
	"bytes"
	"context"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/benchenv"
)

var deviceTiles = flag.Int("device-tiles", 0, "random tiles per fidelity for TestDeviceMatMulMatchesTileMatmul (0: a short run; the full conformance run uses 10000)")

// randActBF16 draws a BF16 activation biased toward the special cases:
// exponent 0 (read as zero whatever the mantissa) and 255 (a finite huge
// value), small exponents, and values of very different sizes.
func randActBF16(r *rand.Rand) uint16 {
	var e uint16
	switch r.IntN(10) {
	case 0:
		e = 0
	case 1:
		e = 255 - uint16(r.IntN(2))
	case 2:
		e = uint16(r.IntN(6))
	case 3:
		e = uint16(90 + r.IntN(40))
	default:
		e = uint16(122 + r.IntN(10))
	}
	return uint16(r.IntN(2))<<15 | e<<7 | uint16(r.IntN(128))
}

// randWeightSrc draws a weight datum as an unpacker delivers it: decoded
// BFP8_b or BFP4_b codes (shared exponents that wrap, the sign-only code),
// BF16 values, or any TF32 datum.
func randWeightSrc(r *rand.Rand, kind int, exp uint8) Src {
	switch kind {
	case 0:
		return SrcFromBF16(UnpackBFP8(uint8(r.IntN(256)), exp))
	case 1:
		return SrcFromBF16(UnpackBFP4(uint8(r.IntN(16)), exp))
	case 2:
		return SrcFromBF16(randActBF16(r))
	}
	return randSrc(r)
}

func randSharedExp(r *rand.Rand) uint8 {
	switch r.IntN(6) {
	case 0:
		return uint8(r.IntN(8)) // wraps for small magnitudes
	case 1:
		return 255
	}
	return uint8(115 + r.IntN(15))
}

// TestDeviceMatMulMatchesTileMatmul checks the fast path against the
// bit-exact tile model: for random operand tiles, every fidelity, both Dst
// formats and both architectures, the fast path's Dst equals TileMatmul's,
// bit for bit, over one K-tile or two accumulated in the same Dst. Run with
// -device-tiles 10000 for the full conformance count.
func TestDeviceMatMulMatchesTileMatmul(t *testing.T) {
	tiles := *deviceTiles
	if tiles <= 0 {
		tiles = 60
		if testing.Short() {
			tiles = 10
		}
	}
	r := rand.New(rand.NewPCG(61, 62))
	ctx := context.Background()
	for _, fid := range []Fidelity{LoFi, HiFi2, HiFi3, HiFi4} {
		var steps int64
		vector := 0
		for n := 0; n < tiles; n++ {
			cfg := Config{Fidelity: fid, Dst: DstFormat(r.IntN(2)), Arch: Arch(r.IntN(2))}
			if n%2 == 0 { // the vector kernel's case
				cfg.Dst, cfg.Arch = DstFP32, Blackhole
				if deviceAsm {
					vector++
				}
			}
			ktiles := 1 + r.IntN(2)
			kind := r.IntN(4)
			kp := ktiles * TileDim
			xs := srcOperandOf(TileDim, kp)
			ws := srcOperandOf(TileDim, kp)
			in0 := make([]*[TileSize]uint16, ktiles)
			in1 := make([]*[TileSize]Src, ktiles)
			for kt := range ktiles {
				in0[kt], in1[kt] = new([TileSize]uint16), new([TileSize]Src)
				for m := 0; m < TileDim; m++ {
					for k := 0; k < TileDim; k++ {
						h := randActBF16(r)
						in0[kt][m*TileDim+k] = h
						xs.set(m*kp+kt*TileDim+k, SrcFromBF16(h), false)
					}
				}
				// Weights: column n of in1 is row n of W; one shared
				// exponent per 16 values along k, as BFP stores them.
				for nn := 0; nn < TileDim; nn++ {
					for k := 0; k < TileDim; k++ {
						if k%16 == 0 {
							exp := randSharedExp(r)
							for i := 0; i < 16; i++ {
								s := randWeightSrc(r, kind, exp)
								in1[kt][(k+i)*TileDim+nn] = s
								ws.set(nn*kp+kt*TileDim+k+i, s, true)
							}
						}
					}
				}
			}
			var want [TileSize]uint32
			for kt := range ktiles {
				TileMatmul(&want, in0[kt], in1[kt], cfg, nil)
			}
			got, err := deviceDst(ctx, &DeviceActivations{tokens: TileDim, in: kp, b: xs}, &DeviceWeights{out: TileDim, in: kp, a: ws}, DeviceConfig{Config: cfg, Workers: 1 + r.IntN(3)})
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%v tile %d (%d K-tiles, weight kind %d): element (%d,%d): fast %08x, TileMatmul %08x", cfg, n, ktiles, kind, i/TileDim, i%TileDim, got[i], want[i])
				}
			}
			steps += int64(TileSize * 2 * ktiles * fid.Phases())
		}
		t.Logf("%v: %d random tiles (%d Matrix Unit steps; %d tiles through the vector kernel) bit-identical", fid, tiles, steps, vector)
	}
}

// TestDeviceKernelMatchesGo compares the vector kernel (FP32 Dst,
// Blackhole) with the portable path on random matrices whose shapes are not
// whole column blocks or tiles.
func TestDeviceKernelMatchesGo(t *testing.T) {
	if !deviceAsm {
		t.Skip("no vector kernel in this build or on this processor")
	}
	defer func() { deviceAsm = true }()
	r := rand.New(rand.NewPCG(67, 68))
	ctx := context.Background()
	for trial := 0; trial < 12; trial++ {
		tokens, in, out := 1+r.IntN(9), 1+r.IntN(150), 1+r.IntN(40)
		if trial%4 == 0 {
			tokens = 60 + r.IntN(100) // several token blocks
		}
		kind := r.IntN(4)
		wb := make([]uint16, out*in)
		for i := range wb {
			wb[i] = uint16(uint32(randWeightSrc(r, kind, randSharedExp(r))) >> 3)
		}
		xb := make([]uint16, tokens*in)
		for i := range xb {
			xb[i] = randActBF16(r)
		}
		w, err := NewDeviceWeights(wb, out, in)
		if err != nil {
			t.Fatal(err)
		}
		a, err := PrepareActivationsBF16(xb, tokens, in)
		if err != nil {
			t.Fatal(err)
		}
		for _, fid := range []Fidelity{LoFi, HiFi2, HiFi3, HiFi4} {
			cfg := Config{Fidelity: fid}
			deviceAsm = true
			got, err := DeviceMatMulDst(ctx, a, w, cfg)
			if err != nil {
				t.Fatal(err)
			}
			deviceAsm = false
			want, err := DeviceMatMulDst(ctx, a, w, cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("trial %d (%d×%d by %d×%d, kind %d) %v element %d: vector %08x, Go %08x", trial, tokens, in, in, out, kind, fid, i, got[i], want[i])
				}
			}
		}
	}
}

// srcOperandOf returns a zeroed operand (every datum read as zero).
func srcOperandOf(rows, kp int) srcOperand { return newSrcOperand(rows, kp) }

// TestDeviceMatMulFloat checks the float32 interface on shapes that are not
// whole tiles: activations rounded as a packer writes BF16 (ties away from
// zero) or truncated to TF32, a BFP8 weight decoded by the device unpacker,
// and outputs packed to BF16, against MatMul and the packer functions.
func TestDeviceMatMulFloat(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	const tokens, in, out = 5, 70, 13
	x := make([]float32, tokens*in)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	x[3] = math.Float32frombits(0x3f808000) // a BF16 tie: rounds away from zero
	x[4] = math.Float32frombits(0xbf808000)
	wf := make([]float32, out*in)
	for i := range wf {
		wf[i] = float32(r.NormFloat64() * 0.05)
	}
	packed, err := bfp.Pack(bfp.BFP8, bfp.Tile32x32, wf, out, in)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewDeviceWeightsBFP(bfp.BFP8, bfp.Tile32x32, packed, out, in)
	if err != nil {
		t.Fatal(err)
	}
	wdec, err := DecodeBFP(bfp.BFP8, bfp.Tile32x32, packed, out, in)
	if err != nil {
		t.Fatal(err)
	}
	xb := make([]uint16, len(x))
	for i, v := range x {
		xb[i] = PackFP32ToBF16(math.Float32bits(v))
	}
	if xb[3] != 0x3f81 || xb[4] != 0xbf81 {
		t.Fatalf("ties: %04x %04x", xb[3], xb[4])
	}
	ctx := context.Background()
	for _, fid := range []Fidelity{LoFi, HiFi2, HiFi3, HiFi4} {
		for _, dfmt := range []DstFormat{DstFP32, DstBF16} {
			cfg := Config{Fidelity: fid, Dst: dfmt}
			want, err := MatMul(ctx, xb, tokens, in, wdec, out, cfg)
			if err != nil {
				t.Fatal(err)
			}
			wantBF16 := PackDstBF16(want, dfmt)
			got, err := DeviceMatMul(ctx, x, tokens, w, DeviceConfig{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			gotBF16, err := DeviceMatMul(ctx, x, tokens, w, DeviceConfig{Config: cfg, Output: OutBF16})
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float32bits(got[i]) != want[i] || math.Float32bits(gotBF16[i]) != uint32(wantBF16[i])<<16 {
					t.Fatalf("%v element %d: dst %08x want %08x, bf16 %08x want %04x", cfg, i, math.Float32bits(got[i]), want[i], math.Float32bits(gotBF16[i]), wantBF16[i])
				}
			}
		}
	}
	// BFP outputs: each row's Dst in blocks of 16 (zero-padded), cut to
	// E8M6 and rounded to the block's shared exponent, read back by the
	// unpacker.
	for _, of := range []OutputFormat{OutBFP8, OutBFP4} {
		cfg := Config{Fidelity: HiFi2}
		dst, err := MatMul(ctx, xb, tokens, in, wdec, out, cfg)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DeviceMatMul(ctx, x, tokens, w, DeviceConfig{Config: cfg, Output: of})
		if err != nil {
			t.Fatal(err)
		}
		for m := 0; m < tokens; m++ {
			for c0 := 0; c0 < out; c0 += 16 {
				var blk [16]uint16
				for i := 0; i < 16 && c0+i < out; i++ {
					blk[i] = PackFP32ToE8M6(dst[m*out+c0+i])
				}
				f := BFP8b
				if of == OutBFP4 {
					f = BFP4b
				}
				exp, codes := PackBFPBlock(f, &blk)
				for i := 0; i < 16 && c0+i < out; i++ {
					want := UnpackBFP8(codes[i], exp)
					if f == BFP4b {
						want = UnpackBFP4(codes[i], exp)
					}
					if g := math.Float32bits(got[m*out+c0+i]); g != uint32(want)<<16 {
						t.Fatalf("%v (%d,%d): %08x, want %04x", of, m, c0+i, g, want)
					}
				}
			}
		}
	}

	// TF32 activations: the same product through MVMULStep directly.
	a, err := PrepareActivations(x, tokens, in, ActTF32)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DeviceMatMulDst(ctx, a, w, Config{Fidelity: HiFi4})
	if err != nil {
		t.Fatal(err)
	}
	for m := 0; m < tokens; m++ {
		for n := 0; n < out; n++ {
			var d uint32
			for kt := 0; kt < in; kt += TileDim {
				for ph := 0; ph < 4; ph++ {
					for kb := kt; kb < kt+TileDim; kb += Lanes {
						var av, bv [Lanes]Src
						for i := 0; i < Lanes && kb+i < in; i++ {
							av[i] = SrcFromBF16(wdec[n*in+kb+i])
							bv[i] = SrcFromFP32TF32(math.Float32bits(x[m*in+kb+i]))
						}
						d = MVMULStep(d, &av, &bv, ph, DstFP32, Blackhole)
					}
				}
			}
			if got[m*out+n] != d {
				t.Fatalf("TF32 (%d,%d): fast %08x, MVMULStep %08x", m, n, got[m*out+n], d)
			}
		}
	}
}

func TestDeviceMatMulErrors(t *testing.T) {
	ctx := context.Background()
	w, err := NewDeviceWeights(make([]uint16, 6), 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if o, i := w.Shape(); o != 2 || i != 3 {
		t.Errorf("shape %d×%d", o, i)
	}
	if _, err := NewDeviceWeights(make([]uint16, 5), 2, 3); err == nil {
		t.Error("short weights accepted")
	}
	if _, err := DeviceMatMul(ctx, make([]float32, 4), 2, w, DeviceConfig{}); err == nil || !strings.Contains(err.Error(), "4 activations for 2 tokens of 3") {
		t.Errorf("short activations: %v", err)
	}
	if _, err := DeviceMatMul(ctx, make([]float32, 6), 2, w, DeviceConfig{Output: OutBFP4 + 1}); err == nil {
		t.Error("invalid output format accepted")
	}
	if _, err := DeviceMatMul(ctx, make([]float32, 6), 2, w, DeviceConfig{Config: Config{Fidelity: 9}}); err == nil {
		t.Error("invalid fidelity accepted")
	}
	a, _ := PrepareActivationsBF16(make([]uint16, 8), 2, 4)
	if _, err := DeviceMatMulPrepared(ctx, a, w, DeviceConfig{}); err == nil {
		t.Error("inner dimensions 4 and 3 accepted")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := DeviceMatMul(cctx, make([]float32, 6), 2, w, DeviceConfig{}); err == nil {
		t.Error("cancelled context ignored")
	}
}

func TestParseDeviceNumerics(t *testing.T) {
	for s, want := range map[string]Fidelity{"device": HiFi2, "device:LoFi": LoFi, "DEVICE:hifi4": HiFi4, "device:HiFi3": HiFi3} {
		c, err := ParseDeviceNumerics(s)
		if err != nil || c.Fidelity != want || c.Dst != DstFP32 || c.Arch != Blackhole {
			t.Errorf("%q: %v, %v", s, c, err)
		}
	}
	for _, s := range []string{"", "cpu", "device:", "device:HiFi5", "devices:lofi"} {
		if _, err := ParseDeviceNumerics(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

// BenchmarkDeviceMatMul runs the fast path on a 32-token × [512, 2048]
// BFP8_b weight (the shape of one 35B expert projection) at each fidelity
// with an FP32 Dst and reports emulated multiply-accumulates per second
// (MMAC/s), the equivalent GFLOP/s (2 flops per multiply-accumulate) and,
// because the machine may be shared, MMAC per CPU-second of the process.
// The "reference" case runs MatMul (the bit-exact reference path) at HiFi2
// on the same operands.
func BenchmarkDeviceMatMul(b *testing.B) {
	const tokens, in, out = 32, 2048, 512
	r := rand.New(rand.NewPCG(65, 66))
	x := make([]float32, tokens*in)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	wf := make([]float32, out*in)
	for i := range wf {
		wf[i] = float32(r.NormFloat64() * 0.05)
	}
	packed, err := bfp.Pack(bfp.BFP8, bfp.Tile32x32, wf, out, in)
	if err != nil {
		b.Fatal(err)
	}
	w, err := NewDeviceWeightsBFP(bfp.BFP8, bfp.Tile32x32, packed, out, in)
	if err != nil {
		b.Fatal(err)
	}
	a, err := PrepareActivations(x, tokens, in, ActBF16)
	if err != nil {
		b.Fatal(err)
	}
	report := func(b *testing.B, cpu time.Duration) {
		macs := float64(tokens*in*out) * float64(b.N)
		b.ReportMetric(macs/b.Elapsed().Seconds()/1e6, "MMAC/s")
		b.ReportMetric(2*macs/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		if cpu > 0 {
			b.ReportMetric(macs/cpu.Seconds()/1e6, "MMAC/cpu-s")
		}
	}
	for _, fid := range []Fidelity{LoFi, HiFi2, HiFi3, HiFi4} {
		b.Run(fid.String(), func(b *testing.B) {
			c0 := benchenv.CPU()
			for range b.N {
				if _, err := DeviceMatMulPrepared(context.Background(), a, w, DeviceConfig{Config: Config{Fidelity: fid}}); err != nil {
					b.Fatal(err)
				}
			}
			report(b, benchenv.CPU()-c0)
		})
	}
	b.Run("reference-HiFi2", func(b *testing.B) {
		xb := make([]uint16, len(x))
		for i, v := range x {
			xb[i] = PackFP32ToBF16(math.Float32bits(v))
		}
		wd, err := DecodeBFP(bfp.BFP8, bfp.Tile32x32, packed, out, in)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		c0 := benchenv.CPU()
		for range b.N {
			if _, err := MatMul(context.Background(), xb, tokens, in, wd, out, Config{Fidelity: HiFi2}); err != nil {
				b.Fatal(err)
			}
		}
		report(b, benchenv.CPU()-c0)
	})
}

// TestDeviceKernelGenerated checks that device_amd64.s is what
// gen_device_amd64.go writes.
func TestDeviceKernelGenerated(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generator")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out := filepath.Join(t.TempDir(), "device_amd64.s")
	cmd := exec.Command(goTool, "run", "gen_device_amd64.go", "-o", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generator: %v\n%s", err, msg)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("device_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("device_amd64.s differs from the generator's output; run go generate ./emulator")
	}
}

// TestPackRoundTrip compares PackRoundTrip with the packer and unpacker
// functions applied by hand: BFP8_b and BFP4_b blocks of 16 along each
// row (a partial last block padded with +0), BF16, and Dst unchanged.
func TestPackRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(81, 82))
	const rows, cols = 5, 40
	x := make([]float32, rows*cols)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Exp2(float64(r.IntN(20)-10)))
	}
	for _, out := range []OutputFormat{OutDst, OutBF16, OutBFP8, OutBFP4} {
		y, err := PackRoundTrip(x, rows, cols, out)
		if err != nil {
			t.Fatal(err)
		}
		changed := 0
		for rr := 0; rr < rows; rr++ {
			for c0 := 0; c0 < cols; c0 += 16 {
				var blk [16]uint32
				for i := 0; i < 16 && c0+i < cols; i++ {
					blk[i] = math.Float32bits(x[rr*cols+c0+i])
				}
				var exps, datums []uint8
				if out == OutBFP8 || out == OutBFP4 {
					f := BFP8b
					if out == OutBFP4 {
						f = BFP4b
					}
					if exps, datums, err = PackDstBFP(blk[:], 1, 16, DstFP32, f, false); err != nil {
						t.Fatal(err)
					}
				}
				for i := 0; i < 16 && c0+i < cols; i++ {
					var want uint32
					switch out {
					case OutDst:
						want = blk[i]
					case OutBF16:
						want = uint32(PackFP32ToBF16(blk[i])) << 16
					case OutBFP8:
						want = uint32(UnpackBFP8(datums[i], exps[0])) << 16
					case OutBFP4:
						want = uint32(UnpackBFP4(datums[i], exps[0])) << 16
					}
					k := rr*cols + c0 + i
					if got := math.Float32bits(y[k]); got != want {
						t.Fatalf("%v: element (%d,%d): %08x, want %08x", out, rr, c0+i, got, want)
					}
					if y[k] != x[k] {
						changed++
					}
				}
			}
		}
		if (changed == 0) != (out == OutDst) {
			t.Errorf("%v: %d of %d values changed", out, changed, len(x))
		}
	}
	if _, err := PackRoundTrip([]float32{1, float32(math.Inf(1))}, 1, 2, OutBFP8); err == nil {
		t.Error("an infinite value was packed")
	}
	if _, err := PackRoundTrip(x, rows, cols+1, OutBFP8); err == nil {
		t.Error("a wrong shape was accepted")
	}
	if _, err := PackRoundTrip(x, rows, cols, OutputFormat(9)); err == nil {
		t.Error("an invalid output format was accepted")
	}
}
