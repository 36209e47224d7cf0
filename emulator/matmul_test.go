package emulator

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

func randBF16(r *rand.Rand, n int, scale float64) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = uint16(math.Float32bits(float32(r.NormFloat64()*scale)) >> 16)
	}
	return out
}

// TestMatMulMatchesTileMatmul checks the matrix-level product against the
// tile-level one: MatMul over K = 64 must equal two TileMatmul calls
// accumulating into the same Dst, and every output tile must be computed.
func TestMatMulMatchesTileMatmul(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const tokens, in, out = 40, 64, 48 // tokens and out not tile multiples
	x := randBF16(r, tokens*in, 1)
	w := randBF16(r, out*in, 0.05)
	for _, cfg := range []Config{{HiFi2, DstFP32, Blackhole}, {LoFi, DstBF16, Blackhole}, {HiFi4, DstFP32, Wormhole}} {
		y, err := MatMul(context.Background(), x, tokens, in, w, out, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Reference: tile by tile with zero padding.
		for mt := 0; mt < 2; mt++ {
			for nt := 0; nt < 2; nt++ {
				var dst [TileSize]uint32
				for kt := 0; kt < 2; kt++ {
					var in0 [TileSize]uint16
					var in1 [TileSize]Src
					for i := 0; i < TileDim; i++ {
						for k := 0; k < TileDim; k++ {
							if m := mt*32 + i; m < tokens {
								in0[i*32+k] = x[m*in+kt*32+k]
							}
							if n := nt*32 + i; n < out {
								in1[k*32+i] = SrcFromBF16(w[n*in+kt*32+k])
							}
						}
					}
					TileMatmul(&dst, &in0, &in1, cfg, nil)
				}
				for i := 0; i < TileDim; i++ {
					for j := 0; j < TileDim; j++ {
						m, n := mt*32+i, nt*32+j
						if m >= tokens || n >= out {
							continue
						}
						if got, want := y[m*out+n], dst[i*32+j]; got != want {
							t.Fatalf("%v: y[%d][%d] = %08x, tile matmul gives %08x", cfg, m, n, got, want)
						}
					}
				}
			}
		}
	}
}

// TestMatMulAccuracy checks that HiFi4 with FP32 Dst stays within the
// documented error bound of the exact product (a sanity check of the model,
// independent of the vectors).
func TestMatMulAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const tokens, in, out = 8, 96, 8
	x := randBF16(r, tokens*in, 1)
	w := randBF16(r, out*in, 1)
	y, err := MatMul(context.Background(), x, tokens, in, w, out, Config{Fidelity: HiFi4})
	if err != nil {
		t.Fatal(err)
	}
	for m := 0; m < tokens; m++ {
		for n := 0; n < out; n++ {
			exact, maxp := 0.0, 0.0
			for k := 0; k < in; k++ {
				p := float64(math.Float32frombits(uint32(x[m*in+k])<<16)) * float64(math.Float32frombits(uint32(w[n*in+k])<<16))
				exact += p
				maxp = max(maxp, math.Abs(p))
			}
			got := float64(math.Float32frombits(y[m*out+n]))
			// Each of the 3 K-tiles × 2 blocks errs by at most ~3.5·2^-10 of
			// the largest product; allow 6 such terms.
			if d := math.Abs(got - exact); d > 6*3.5*math.Ldexp(maxp, -10) {
				t.Errorf("y[%d][%d] = %g, exact %g (largest product %g)", m, n, got, exact, maxp)
			}
		}
	}
}

func TestMatMulErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := MatMul(ctx, make([]uint16, 5), 2, 3, make([]uint16, 6), 2, Config{}); err == nil {
		t.Error("short activations accepted")
	}
	if _, err := MatMul(ctx, make([]uint16, 6), 2, 3, make([]uint16, 5), 2, Config{}); err == nil {
		t.Error("short weights accepted")
	}
	if _, err := MatMul(ctx, nil, 0, 3, nil, 0, Config{Fidelity: 9}); err == nil {
		t.Error("invalid fidelity accepted")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := MatMul(cctx, make([]uint16, 6), 2, 3, make([]uint16, 6), 2, Config{}); err == nil {
		t.Error("cancelled context ignored")
	}
}

// TestDecodeBFPMatchesHost checks the device decode against the host decoder
// of package bfp on packer output, where the two agree (the device quirks
// only show on codes the host packer never emits), for several tile shapes
// and a matrix that is not a tile multiple.
func TestDecodeBFPMatchesHost(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const rows, cols = 45, 70
	vals := make([]float32, rows*cols)
	for i := range vals {
		vals[i] = float32(r.NormFloat64() * math.Exp2(float64(r.IntN(10)-5)))
	}
	for _, f := range []bfp.Format{bfp.BFP8, bfp.BFP4} {
		for _, tile := range []bfp.Tile{bfp.Tile32x32, bfp.Tile16x32, bfp.Tile1x16} {
			packed, err := bfp.Pack(f, tile, vals, rows, cols)
			if err != nil {
				t.Fatal(err)
			}
			host, err := bfp.Unpack(f, tile, packed, rows, cols)
			if err != nil {
				t.Fatal(err)
			}
			dev, err := DecodeBFP(f, tile, packed, rows, cols)
			if err != nil {
				t.Fatal(err)
			}
			for i := range host {
				hb := math.Float32bits(host[i])
				if hb == 0x80000000 { // host -0 never arises from packer output
					t.Fatalf("%v %v: host decode gave -0 at %d", f, tile, i)
				}
				if uint32(dev[i])<<16 != hb {
					t.Fatalf("%v %v: element (%d,%d): device %04x, host %08x", f, tile, i/cols, i%cols, dev[i], hb)
				}
			}
		}
	}
	if _, err := DecodeBFP(bfp.BFP8, bfp.Tile32x32, make([]byte, 10), 32, 32); err == nil {
		t.Error("short buffer accepted")
	}
	if _, err := DecodeBFP(bfp.BFP2, bfp.Tile32x32, make([]byte, 320), 32, 32); err == nil {
		t.Error("BFP2 accepted")
	}
}

// TestDecodeBFPQuirks checks the device-only behaviour on hand-made codes:
// the sign-only code decodes to 0xFF80, and a small shared exponent wraps.
func TestDecodeBFPQuirks(t *testing.T) {
	packed := make([]byte, bfp.TileBytes(bfp.BFP8, bfp.Tile32x32))
	packed[0] = 0x01    // group 0 exponent
	packed[64] = 0x80   // element (0,0): sign-only
	packed[64+1] = 0x01 // element (0,1): magnitude 1 with exponent 1 → wraps
	packed[1] = 0x85    // group 1: face 0 row 1
	packed[64+16] = 0x40
	got, err := DecodeBFP(bfp.BFP8, bfp.Tile32x32, packed, 32, 32)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 0xff80 {
		t.Errorf("sign-only code: %04x, want ff80", got[0])
	}
	// exponent (1-6) mod 256 = 251 = 0xfb, mantissa 0 → 0x7d80.
	if got[1] != 0x7d80 {
		t.Errorf("wrapping code: %04x, want 7d80", got[1])
	}
	if got[32] != 0x85<<7 {
		t.Errorf("element (1,0): %04x, want %04x", got[32], 0x85<<7)
	}
}

func TestMatMulStored(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	const tokens, in, out = 3, 40, 20
	w := make([]float32, out*in)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.05)
	}
	packed, err := bfp.Pack(bfp.BFP8, bfp.Tile32x32, w, out, in)
	if err != nil {
		t.Fatal(err)
	}
	st := &StoredTensor{Name: "w", Format: "BFP8_b", Layout: Layout{Shape: []int64{out, in}, Tile: bfp.Tile32x32}, Data: packed}
	x := randBF16(r, tokens*in, 1)
	cfg := Config{Fidelity: HiFi2}
	y, n, err := MatMulStored(context.Background(), st, x, tokens, cfg)
	if err != nil || n != out {
		t.Fatal(n, err)
	}
	dec, err := DecodeBFP(bfp.BFP8, bfp.Tile32x32, packed, out, in)
	if err != nil {
		t.Fatal(err)
	}
	want, err := MatMul(context.Background(), x, tokens, in, dec, out, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if y[i] != want[i] {
			t.Fatalf("y[%d] = %08x, want %08x", i, y[i], want[i])
		}
	}
	if _, _, err := MatMulStored(context.Background(), st, x[:in], 3, cfg); err == nil || !strings.Contains(err.Error(), `"w"`) {
		t.Errorf("short activations: %v", err)
	}
	st.Layout.Shape = []int64{1, out, in}
	if _, _, err := MatMulStored(context.Background(), st, x, tokens, cfg); err == nil {
		t.Error("3-D weight accepted")
	}
}
