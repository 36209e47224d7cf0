package emulator

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// The shared FPU vectors (testdata/fpu) hold every
// bit pattern as a lowercase hex string. These tests reproduce each vector
// bit for bit and log how many were checked per file.

func hexU(t *testing.T, s string) uint32 {
	t.Helper()
	v, err := strconv.ParseUint(s, 16, 32)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return uint32(v)
}

func loadJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

type lanesFile struct {
	Format  string `json:"format"`
	Vectors []struct {
		Arch    string   `json:"arch"`
		Phase   int      `json:"phase"`
		DstMode string   `json:"dst_mode"`
		A       []string `json:"a"`
		B       []string `json:"b"`
		DstIn   string   `json:"dst_in"`
		DstOut  string   `json:"dst_out"`
	} `json:"vectors"`
}

func TestConformanceMVMULLanes(t *testing.T) {
	dir := testdata.Dir(t, "fpu")
	var f lanesFile
	loadJSON(t, filepath.Join(dir, "mvmul_lanes.json"), &f)
	if f.Format != "tensix-fpu-mvmul-lanes/1" {
		t.Fatalf("unexpected format %q", f.Format)
	}
	counts := map[string]int{}
	bad := 0
	for i, v := range f.Vectors {
		arch, err := ParseArch(v.Arch)
		if err != nil {
			t.Fatal(err)
		}
		dm, err := ParseDstFormat(v.DstMode)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.A) != Lanes || len(v.B) != Lanes {
			t.Fatalf("record %d: %d/%d lanes", i, len(v.A), len(v.B))
		}
		var a, b [Lanes]Src
		for j := 0; j < Lanes; j++ {
			a[j] = Src(hexU(t, v.A[j]))
			b[j] = Src(hexU(t, v.B[j]))
		}
		got := MVMULStep(hexU(t, v.DstIn), &a, &b, v.Phase, dm, arch)
		if want := hexU(t, v.DstOut); got != want {
			bad++
			if bad <= 10 {
				t.Errorf("record %d (%s, phase %d, %s): dst_in %s: got %08x, want %08x", i, v.Arch, v.Phase, v.DstMode, v.DstIn, got, want)
			}
			continue
		}
		counts[v.Arch]++
	}
	if len(f.Vectors) != 1200 {
		t.Errorf("%d records, want 1200", len(f.Vectors))
	}
	t.Logf("mvmul_lanes.json: %d/%d bit-exact (blackhole %d, wormhole %d)", len(f.Vectors)-bad, len(f.Vectors), counts["blackhole"], counts["wormhole"])
}

type packUnpackFile struct {
	Format     string `json:"format"`
	FP32ToBF16 struct {
		Pairs [][2]string `json:"pairs"`
	} `json:"fp32_to_bf16"`
	FP32ToE8M6 struct {
		Pairs [][2]string `json:"pairs"`
	} `json:"fp32_to_e8m6"`
	BFPBlocks struct {
		Blocks []struct {
			In      []string `json:"in_bf16"`
			BFP8Exp string   `json:"bfp8_exp"`
			BFP8    []string `json:"bfp8"`
			BFP4Exp string   `json:"bfp4_exp"`
			BFP4    []string `json:"bfp4"`
		} `json:"blocks"`
	} `json:"bfp_blocks"`
	UnpackBFP8 struct {
		Triples [][3]string `json:"triples"`
	} `json:"unpack_bfp8"`
	UnpackBFP4 struct {
		Triples [][3]string `json:"triples"`
	} `json:"unpack_bfp4"`
}

func TestConformancePackUnpack(t *testing.T) {
	dir := testdata.Dir(t, "fpu")
	var f packUnpackFile
	loadJSON(t, filepath.Join(dir, "pack_unpack.json"), &f)
	if f.Format != "tensix-pack-unpack/1" {
		t.Fatalf("unexpected format %q", f.Format)
	}
	check := func(what string, n *int, got, want uint32, ctx string) {
		t.Helper()
		if got != want {
			t.Errorf("%s %s: got %x, want %x", what, ctx, got, want)
			return
		}
		*n++
	}
	var nBF16, nE8M6, nBlocks, nU8, nU4 int
	for _, p := range f.FP32ToBF16.Pairs {
		check("fp32_to_bf16", &nBF16, uint32(PackFP32ToBF16(hexU(t, p[0]))), hexU(t, p[1]), p[0])
	}
	for _, p := range f.FP32ToE8M6.Pairs {
		check("fp32_to_e8m6", &nE8M6, uint32(PackFP32ToE8M6(hexU(t, p[0]))), hexU(t, p[1]), p[0])
	}
	for i, b := range f.BFPBlocks.Blocks {
		var in [16]uint16
		for j, s := range b.In {
			in[j] = uint16(hexU(t, s))
		}
		ok := true
		e8, d8 := PackBFPBlock(BFP8b, &in)
		e4, d4 := PackBFPBlock(BFP4b, &in)
		ok = ok && uint32(e8) == hexU(t, b.BFP8Exp) && uint32(e4) == hexU(t, b.BFP4Exp)
		for j := 0; j < 16; j++ {
			ok = ok && uint32(d8[j]) == hexU(t, b.BFP8[j]) && uint32(d4[j]) == hexU(t, b.BFP4[j])
		}
		if !ok {
			t.Errorf("bfp block %d: got bfp8 %02x %02x, bfp4 %02x %x; want %s %s, %s %s", i, e8, d8, e4, d4, b.BFP8Exp, b.BFP8, b.BFP4Exp, b.BFP4)
			continue
		}
		nBlocks++
	}
	for _, p := range f.UnpackBFP8.Triples {
		check("unpack_bfp8", &nU8, uint32(UnpackBFP8(uint8(hexU(t, p[0])), uint8(hexU(t, p[1])))), hexU(t, p[2]), p[0]+"@"+p[1])
	}
	for _, p := range f.UnpackBFP4.Triples {
		check("unpack_bfp4", &nU4, uint32(UnpackBFP4(uint8(hexU(t, p[0])), uint8(hexU(t, p[1])))), hexU(t, p[2]), p[0]+"@"+p[1])
	}
	t.Logf("pack_unpack.json: fp32_to_bf16 %d/%d, fp32_to_e8m6 %d/%d, bfp_blocks %d/%d, unpack_bfp8 %d/%d, unpack_bfp4 %d/%d",
		nBF16, len(f.FP32ToBF16.Pairs), nE8M6, len(f.FP32ToE8M6.Pairs), nBlocks, len(f.BFPBlocks.Blocks),
		nU8, len(f.UnpackBFP8.Triples), nU4, len(f.UnpackBFP4.Triples))
	if len(f.FP32ToBF16.Pairs) == 0 || len(f.FP32ToE8M6.Pairs) == 0 || len(f.BFPBlocks.Blocks) == 0 ||
		len(f.UnpackBFP8.Triples) == 0 || len(f.UnpackBFP4.Triples) == 0 {
		t.Error("a section of pack_unpack.json is empty")
	}
}

type bfpJSON struct {
	SharedExp []string `json:"shared_exp"`
	Datum     []string `json:"datum"`
}

type matmulFile struct {
	Format string `json:"format"`
	Case   string `json:"case"`
	Arch   string `json:"arch"`
	M, K   int
	N      int
	In0    struct {
		Format string   `json:"format"`
		Data   []string `json:"data"`
	} `json:"in0"`
	In1 struct {
		Format       string   `json:"format"`
		SharedExp    []string `json:"shared_exp"`
		Datum        []string `json:"datum"`
		UnpackedBF16 []string `json:"unpacked_bf16"`
	} `json:"in1"`
	Results []struct {
		Fidelity         string   `json:"fidelity"`
		Phases           []int    `json:"phases"`
		DstMode          string   `json:"dst_mode"`
		Dst              []string `json:"dst"`
		PackBF16         []string `json:"pack_bf16"`
		PackBFP8b        *bfpJSON `json:"pack_bfp8b"`
		PackBFP4b        *bfpJSON `json:"pack_bfp4b"`
		PackBFP8bPrecise *bfpJSON `json:"pack_bfp8b_precise"`
		Trace            *struct {
			M     int `json:"m"`
			N     int `json:"n"`
			Steps []struct {
				Phase  int    `json:"phase"`
				KBlock int    `json:"kblock"`
				DstIn  string `json:"dst_in"`
				DstOut string `json:"dst_out"`
			} `json:"steps"`
		} `json:"trace"`
	} `json:"results"`
}

// unpackIn1 turns the weight tile into SrcA datums through the device
// unpacker, and checks the intermediate BF16 against unpacked_bf16.
func unpackIn1(t *testing.T, f *matmulFile) (*[TileSize]Src, int) {
	t.Helper()
	var src [TileSize]Src
	checked := 0
	switch f.In1.Format {
	case "bf16":
		// A BF16 weight tile is given only as unpacked_bf16 (a bit copy).
		if len(f.In1.UnpackedBF16) != TileSize {
			t.Fatalf("in1: %d values", len(f.In1.UnpackedBF16))
		}
		for i, s := range f.In1.UnpackedBF16 {
			src[i] = SrcFromBF16(uint16(hexU(t, s)))
		}
	case "bfp8_b", "bfp4_b":
		if len(f.In1.Datum) != TileSize || len(f.In1.SharedExp) != 64 || len(f.In1.UnpackedBF16) != TileSize {
			t.Fatalf("in1: %d datums, %d exponents, %d unpacked", len(f.In1.Datum), len(f.In1.SharedExp), len(f.In1.UnpackedBF16))
		}
		for i := range f.In1.Datum {
			k, n := i/TileDim, i%TileDim
			e := uint8(hexU(t, f.In1.SharedExp[k*2+n/16]))
			d := uint8(hexU(t, f.In1.Datum[i]))
			var h uint16
			if f.In1.Format == "bfp8_b" {
				h = UnpackBFP8(d, e)
			} else {
				h = UnpackBFP4(d, e)
			}
			if want := uint16(hexU(t, f.In1.UnpackedBF16[i])); h != want {
				t.Errorf("%s: in1 element (%d,%d): unpacked %04x, want %04x", f.Case, k, n, h, want)
			} else {
				checked++
			}
			src[i] = SrcFromBF16(h)
		}
	default:
		t.Fatalf("in1 format %q", f.In1.Format)
	}
	return &src, checked
}

func TestConformanceTileMatmul(t *testing.T) {
	dir := testdata.Dir(t, "fpu")
	files, err := filepath.Glob(filepath.Join(dir, "matmul_*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 6 {
		t.Errorf("found %d matmul files, want 6", len(files))
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".json"), func(t *testing.T) {
			var f matmulFile
			loadJSON(t, path, &f)
			if f.Format != "tensix-fpu-matmul-testvector/1" || f.M != 32 || f.K != 32 || f.N != 32 || f.In0.Format != "bf16" {
				t.Fatalf("unexpected header: %s %dx%dx%d in0 %s", f.Format, f.M, f.K, f.N, f.In0.Format)
			}
			arch, err := ParseArch(f.Arch)
			if err != nil {
				t.Fatal(err)
			}
			var in0 [TileSize]uint16
			for i, s := range f.In0.Data {
				in0[i] = uint16(hexU(t, s))
			}
			in1, nUnpacked := unpackIn1(t, &f)
			counts := map[string]int{}
			totals := map[string]int{}
			cmpList := func(what string, got []uint32, want []string) {
				t.Helper()
				totals[what] += len(want)
				if len(got) != len(want) {
					t.Errorf("%s: %d values, want %d", what, len(got), len(want))
					return
				}
				bad := 0
				for i := range want {
					if got[i] != hexU(t, want[i]) {
						bad++
						if bad <= 5 {
							t.Errorf("%s[%d] (m %d, n %d): got %x, want %s", what, i, i/32, i%32, got[i], want[i])
						}
					}
				}
				counts[what] += len(want) - bad
			}
			if len(f.Results) != 8 {
				t.Errorf("%d results, want 8", len(f.Results))
			}
			for _, r := range f.Results {
				fid, err := ParseFidelity(r.Fidelity)
				if err != nil {
					t.Fatal(err)
				}
				dm, err := ParseDstFormat(r.DstMode)
				if err != nil {
					t.Fatal(err)
				}
				if len(r.Phases) != fid.Phases() {
					t.Errorf("%s: phases %v do not match fidelity", r.Fidelity, r.Phases)
				}
				for i, p := range r.Phases {
					if p != i {
						t.Errorf("%s: phases %v are not 0..n-1", r.Fidelity, r.Phases)
					}
				}
				cfg := Config{Fidelity: fid, Dst: dm, Arch: arch}
				var dst [TileSize]uint32
				var trace []StepTrace
				TileMatmul(&dst, &in0, in1, cfg, func(m, n int, s StepTrace) {
					if r.Trace != nil && m == r.Trace.M && n == r.Trace.N {
						trace = append(trace, s)
					}
				})
				tag := cfg.String()
				// BF16 Dst contents are given as BF16 patterns.
				dstBits := dst[:]
				if dm == DstBF16 {
					dstBits = make([]uint32, TileSize)
					for i, x := range dst {
						if x&0xffff != 0 {
							t.Fatalf("%s: BF16 Dst value %08x has low bits set", tag, x)
						}
						dstBits[i] = x >> 16
					}
				}
				cmpList(tag+" dst", dstBits, r.Dst)
				cmpList(tag+" pack_bf16", widen(PackDstBF16(dst[:], dm)), r.PackBF16)
				cmpBFP := func(name string, want *bfpJSON, f BlockFormat, precise bool) {
					if want == nil {
						if dm == DstFP32 {
							t.Errorf("%s: %s missing", tag, name)
						}
						return
					}
					exps, datums, err := PackDstBFP(dst[:], TileDim, TileDim, dm, f, precise)
					if err != nil {
						t.Fatal(err)
					}
					cmpList(tag+" "+name+" shared_exp", widen(exps), want.SharedExp)
					cmpList(tag+" "+name+" datum", widen(datums), want.Datum)
				}
				cmpBFP("pack_bfp8b", r.PackBFP8b, BFP8b, false)
				cmpBFP("pack_bfp4b", r.PackBFP4b, BFP4b, false)
				cmpBFP("pack_bfp8b_precise", r.PackBFP8bPrecise, BFP8b, true)
				if r.Trace != nil {
					totals["trace steps"] += len(r.Trace.Steps)
					if len(trace) != len(r.Trace.Steps) {
						t.Errorf("%s trace: %d steps, want %d", tag, len(trace), len(r.Trace.Steps))
					} else {
						ok := 0
						for i, s := range r.Trace.Steps {
							g := trace[i]
							if g.Phase != s.Phase || g.KBlock != s.KBlock || g.In != hexU(t, s.DstIn) || g.Out != hexU(t, s.DstOut) {
								t.Errorf("%s trace step %d: got %+v, want %+v", tag, i, g, s)
								continue
							}
							ok++
						}
						counts["trace steps"] += ok
					}
				}
			}
			// Summarise per output kind (over all 8 configurations).
			kinds := map[string][2]int{}
			for k, n := range totals {
				kind := k
				if i := strings.Index(k, " "); i >= 0 && strings.Contains(k[:i], "/") {
					kind = k[i+1:]
				}
				c := kinds[kind]
				c[0] += counts[k]
				c[1] += n
				kinds[kind] = c
			}
			var parts []string
			for _, kind := range []string{"dst", "pack_bf16", "pack_bfp8b shared_exp", "pack_bfp8b datum", "pack_bfp4b shared_exp", "pack_bfp4b datum", "pack_bfp8b_precise shared_exp", "pack_bfp8b_precise datum", "trace steps"} {
				c := kinds[kind]
				parts = append(parts, fmt.Sprintf("%s %d/%d", kind, c[0], c[1]))
			}
			if f.In1.Format != "bf16" {
				parts = append(parts, fmt.Sprintf("unpacked_bf16 %d/%d", nUnpacked, TileSize))
			}
			t.Logf("%s: %s", filepath.Base(path), strings.Join(parts, ", "))
		})
	}
}

func widen[T uint8 | uint16](b []T) []uint32 {
	out := make([]uint32, len(b))
	for i, v := range b {
		out[i] = uint32(v)
	}
	return out
}
