package manifest

// Packing and verification throughput on Qwen3.6-35B-A3B tensor shapes,
// for the projections of docs/projections.md. Only -bench runs them:
//
//	go test ./manifest -run '^$' -bench Shape35B -benchtime 20x

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/benchenv"
)

// shape35BTensors are the tensors timed: a routed expert's gate/up and down
// matrices (BFP4_b, GPTQ) and a Gated DeltaNet in_proj_qkv (BFP8_b, RTN).
var shape35BTensors = []struct {
	name   string
	f      bfp.Format
	rows   int
	cols   int
	onGrid bool // GPTQ output: values already on the grid (PackExact)
}{
	{"expert-gate_up-bfp4", bfp.BFP4, 1024, 2048, true},
	{"expert-down-bfp4", bfp.BFP4, 2048, 512, true},
	{"in_proj_qkv-bfp8", bfp.BFP8, 8192, 2048, false},
}

// bf16Source returns BF16 bytes of a rows×cols matrix of scaled normal
// values and their float32 values.
func bf16Source(rows, cols int) ([]byte, []float32) {
	r := rand.New(rand.NewPCG(3, 4))
	raw := make([]byte, 2*rows*cols)
	vals := make([]float32, rows*cols)
	sc := 1 / math.Sqrt(float64(cols))
	for i := range vals {
		b := math.Float32bits(float32(r.NormFloat64() * sc))
		b += 0x7fff + (b>>16)&1
		h := uint16(b >> 16)
		binary.LittleEndian.PutUint16(raw[2*i:], h)
		vals[i] = math.Float32frombits(uint32(h) << 16)
	}
	return raw, vals
}

// BenchmarkShape35BPack times what a build does per stored BFP tensor
// after reading it: decode the BF16 source, check it is finite, pack it
// (RTN) or pack the GPTQ output and check it decodes back exactly
// (PackExact), and hash the packed bytes. Single goroutine (the build runs
// tensors in parallel). GB/s counts the BF16 source bytes; params/s the
// elements.
func BenchmarkShape35BPack(b *testing.B) {
	for _, tc := range shape35BTensors {
		b.Run(tc.name, func(b *testing.B) {
			raw, vals := bf16Source(tc.rows, tc.cols)
			shape := []int64{int64(tc.rows), int64(tc.cols)}
			q := vals
			if tc.onGrid {
				var err error
				if q, err = bfp.Quantize(tc.f, bfp.Tile32x32, vals, tc.rows, tc.cols); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(raw)))
			b.ResetTimer()
			c0 := shape35BCPU()
			for i := 0; i < b.N; i++ {
				v, err := DecodeFloats("BF16", raw)
				if err != nil {
					b.Fatal(err)
				}
				if !AllFinite(v) {
					b.Fatal("not finite")
				}
				var packed []byte
				if tc.onGrid {
					packed, _, err = PackExact(tc.f, bfp.Tile32x32, q, shape, OrientRow)
				} else {
					packed, err = PackBFP(tc.f, bfp.Tile32x32, v, shape, OrientRow)
				}
				if err != nil {
					b.Fatal(err)
				}
				sha256.Sum256(packed)
			}
			b.StopTimer()
			cpu := (shape35BCPU() - c0) / float64(b.N)
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(float64(len(raw))/sec/1e9, "GB/s")
			if cpu > 0 {
				b.ReportMetric(float64(len(raw))/cpu/1e9, "GB/cpu-s")
			}
			b.ReportMetric(float64(tc.rows*tc.cols)/sec/1e9, "Gparams/s")
			b.ReportMetric(benchenv.LoadAvg(), "load1")
		})
	}
}

// BenchmarkShape35BVerify times Verify's work per packed tensor once its
// bytes are read: the file hash and the tensor hash (two sha256 passes),
// decoding the BFP tiles and the finiteness check. Single goroutine;
// reading the file is not included. GB/s counts the packed bytes.
func BenchmarkShape35BVerify(b *testing.B) {
	for _, tc := range shape35BTensors {
		b.Run(tc.name, func(b *testing.B) {
			_, vals := bf16Source(tc.rows, tc.cols)
			shape := []int64{int64(tc.rows), int64(tc.cols)}
			packed, err := PackBFP(tc.f, bfp.Tile32x32, vals, shape, OrientRow)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(packed)))
			b.ResetTimer()
			c0 := shape35BCPU()
			for i := 0; i < b.N; i++ {
				file, tensor := sha256.New(), sha256.New()
				file.Write(packed)
				tensor.Write(packed)
				file.Sum(nil)
				tensor.Sum(nil)
				v, err := UnpackBFP(tc.f, bfp.Tile32x32, packed, shape, OrientRow)
				if err != nil {
					b.Fatal(err)
				}
				if !AllFinite(v) {
					b.Fatal("not finite")
				}
			}
			b.StopTimer()
			cpu := (shape35BCPU() - c0) / float64(b.N)
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(float64(len(packed))/sec/1e9, "GB/s")
			if cpu > 0 {
				b.ReportMetric(float64(len(packed))/cpu/1e9, "GB/cpu-s")
			}
			b.ReportMetric(float64(tc.rows*tc.cols)/sec/1e9, "Gparams/s")
			b.ReportMetric(benchenv.LoadAvg(), "load1")
		})
	}
}

// BenchmarkShape35BHash is the sha256 rate alone (the part of Verify that
// also covers tensors stored as BF16: embedding, norms, router).
func BenchmarkShape35BHash(b *testing.B) {
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	b.SetBytes(int64(len(buf)))
	t0, c0 := time.Now(), shape35BCPU()
	for i := 0; i < b.N; i++ {
		sha256.Sum256(buf)
	}
	b.ReportMetric(float64(len(buf))*float64(b.N)/time.Since(t0).Seconds()/1e9, "GB/s")
	if cpu := shape35BCPU() - c0; cpu > 0 {
		b.ReportMetric(float64(len(buf))*float64(b.N)/cpu/1e9, "GB/cpu-s")
	}
	b.ReportMetric(benchenv.LoadAvg(), "load1")
}

// TestShape35BTensors keeps the benchmarks' inputs honest: the source is
// on the BF16 grid and every timed tensor packs and decodes.
func TestShape35BTensors(t *testing.T) {
	raw, vals := bf16Source(64, 64)
	if len(raw) != 2*len(vals) {
		t.Fatal("size")
	}
	back, err := DecodeFloats("BF16", raw)
	if err != nil {
		t.Fatal(err)
	}
	for i := range vals {
		if back[i] != vals[i] {
			t.Fatalf("value %d: %v decodes to %v", i, vals[i], back[i])
		}
	}
	for _, tc := range shape35BTensors {
		if tc.rows%32 != 0 || tc.cols%32 != 0 {
			t.Fatalf("%s: shape %d×%d is not whole tiles", tc.name, tc.rows, tc.cols)
		}
	}
}
