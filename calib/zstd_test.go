package calib

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/ttquant/ttquant/safetensors"
)

// BenchmarkShardZstd measures whether zstd compression of activation shards
// pays for itself: the compression ratio of a BF16 (and F32) shard of
// synthetic activations of the real model width, and the compression and
// decompression throughput, to be weighed against the disk bandwidth saved.
//
//	go test ./calib -run '^$' -bench ShardZstd -benchtime 3x
func BenchmarkShardZstd(b *testing.B) {
	const rows, cols = 4096, 2048
	gen, err := NewSynth(SynthConfig{Hidden: cols, Seed: 11})
	if err != nil {
		b.Fatal(err)
	}
	x := make([]float32, rows*cols)
	gen.Rows(x, 0, rows)
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F32} {
		raw, err := safetensors.AppendFloat32s(nil, x, dt)
		if err != nil {
			b.Fatal(err)
		}
		// Byte-plane shuffle (all high bytes, then all low bytes) as a
		// preprocessing step, the usual trick for floating-point data.
		shuf := make([]byte, len(raw))
		esz := dt.Bits() / 8
		n := len(raw) / esz
		for i := 0; i < n; i++ {
			for k := 0; k < esz; k++ {
				shuf[k*n+i] = raw[i*esz+esz-1-k]
			}
		}
		for _, level := range []zstd.EncoderLevel{zstd.SpeedFastest, zstd.SpeedDefault, zstd.SpeedBetterCompression} {
			for _, shuffled := range []bool{false, true} {
				raw := raw
				if shuffled {
					raw = shuf
				}
				b.Run(fmt.Sprintf("%v/%v/shuffle=%v", dt, level, shuffled), func(b *testing.B) {
					enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(1))
					dec, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
					defer dec.Close()
					var comp []byte
					var tc, td time.Duration
					for i := 0; i < b.N; i++ {
						t0 := time.Now()
						comp = enc.EncodeAll(raw, comp[:0])
						tc += time.Since(t0)
						t0 = time.Now()
						out, err := dec.DecodeAll(comp, nil)
						td += time.Since(t0)
						if err != nil || len(out) != len(raw) {
							b.Fatalf("round trip: %v", err)
						}
					}
					mb := float64(len(raw)) * float64(b.N) / 1e6
					b.ReportMetric(float64(len(raw))/float64(len(comp)), "ratio")
					b.ReportMetric(mb/tc.Seconds(), "compress-MB/s")
					b.ReportMetric(mb/td.Seconds(), "decompress-MB/s")
				})
			}
		}
	}
}

// TestZstdRatioSanity keeps the measurement honest: BF16 activations must
// round-trip through zstd, and their high bytes (sign and exponent) must be
// far more compressible than their low bytes, which is where any gain comes
// from.
func TestZstdRatioSanity(t *testing.T) {
	const rows, cols = 256, 512
	x := synthX(t, rows, cols, 2)
	raw, _ := safetensors.AppendFloat32s(nil, x, safetensors.BF16)
	hi, lo := make([]byte, len(raw)/2), make([]byte, len(raw)/2)
	for i := 0; i < len(raw)/2; i++ {
		v := binary.LittleEndian.Uint16(raw[2*i:])
		hi[i], lo[i] = byte(v>>8), byte(v)
	}
	enc, _ := zstd.NewWriter(nil)
	rh := float64(len(hi)) / float64(len(enc.EncodeAll(hi, nil)))
	rl := float64(len(lo)) / float64(len(enc.EncodeAll(lo, nil)))
	t.Logf("zstd ratio: high bytes %.2f, low bytes %.2f", rh, rl)
	if rh < 1.5 || rl > 1.2 {
		t.Errorf("unexpected byte-plane ratios: high %.2f low %.2f", rh, rl)
	}
}
