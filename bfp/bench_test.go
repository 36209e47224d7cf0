package bfp

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

const benchN = 4096

func benchMatrix() []float32 {
	rng := rand.New(rand.NewPCG(7, 8))
	m := make([]float32, benchN*benchN)
	for i := range m {
		m[i] = float32(rng.NormFloat64() * 0.02)
	}
	return m
}

// reportGBs reports throughput in GB/s of float32 data (b.SetBytes gives the
// same figure as MB/s) and, to keep the figure meaningful on other machines,
// its ratio to this machine's single-goroutine memory copy bandwidth over a
// buffer of the same size (reads plus writes of the float32 data).
func reportGBs(b *testing.B, bytes int64) {
	gbs := float64(bytes) * float64(b.N) / b.Elapsed().Seconds() / 1e9
	b.ReportMetric(gbs, "GB/s")
	b.ReportMetric(gbs/copyGBs(), "x-memcopy")
}

var copyOnce = sync.OnceValue(func() float64 {
	src := make([]float32, benchN*benchN)
	dst := make([]float32, benchN*benchN)
	for i := range src { // real pages, not the shared zero page
		src[i] = float32(i)
	}
	copy(dst, src) // fault the destination pages in
	best := time.Duration(1 << 62)
	for range 5 {
		t0 := time.Now()
		copy(dst, src)
		best = min(best, time.Since(t0))
	}
	return float64(4*len(src)) / best.Seconds() / 1e9
})

func copyGBs() float64 { return copyOnce() }

func benchPack(b *testing.B, workers int) {
	src := benchMatrix()
	for _, f := range Formats() {
		b.Run(f.String(), func(b *testing.B) {
			n, _ := PackedSize(f, Tile32x32, benchN, benchN)
			dst := make([]byte, n)
			b.SetBytes(4 * benchN * benchN)
			for b.Loop() {
				if err := ParallelPackInto(dst, f, Tile32x32, src, benchN, benchN, workers); err != nil {
					b.Fatal(err)
				}
			}
			reportGBs(b, 4*benchN*benchN)
		})
	}
}

func benchUnpack(b *testing.B, workers int) {
	src := benchMatrix()
	for _, f := range Formats() {
		b.Run(f.String(), func(b *testing.B) {
			p, _ := Pack(f, Tile32x32, src, benchN, benchN)
			dst := make([]float32, benchN*benchN)
			b.SetBytes(4 * benchN * benchN)
			for b.Loop() {
				if err := ParallelUnpackInto(dst, f, Tile32x32, p, benchN, benchN, workers); err != nil {
					b.Fatal(err)
				}
			}
			reportGBs(b, 4*benchN*benchN)
		})
	}
}

// BenchmarkPack packs a 4096x4096 float32 matrix into 32x32 tiles on one
// goroutine (the per-core figure).
func BenchmarkPack(b *testing.B) { benchPack(b, 1) }

// BenchmarkUnpack unpacks a 4096x4096 matrix on one goroutine.
func BenchmarkUnpack(b *testing.B) { benchUnpack(b, 1) }

// BenchmarkPackParallel and BenchmarkUnpackParallel use GOMAXPROCS goroutines.
func BenchmarkPackParallel(b *testing.B)   { benchPack(b, 0) }
func BenchmarkUnpackParallel(b *testing.B) { benchUnpack(b, 0) }

// BenchmarkPackGo and BenchmarkUnpackGo time the pure-Go kernels on one
// goroutine, whatever the build, for comparison with the SIMD ones.
func BenchmarkPackGo(b *testing.B) {
	src := benchMatrix()
	for _, f := range Formats() {
		b.Run(f.String(), func(b *testing.B) {
			n, _ := PackedSize(f, Tile32x32, benchN, benchN)
			dst := make([]byte, n)
			b.SetBytes(4 * benchN * benchN)
			for b.Loop() {
				packRange(packRowGo, dst, f, Tile32x32, src, benchN, benchN, 0, benchN/32)
			}
			reportGBs(b, 4*benchN*benchN)
		})
	}
}

func BenchmarkUnpackGo(b *testing.B) {
	src := benchMatrix()
	for _, f := range Formats() {
		b.Run(f.String(), func(b *testing.B) {
			p, _ := Pack(f, Tile32x32, src, benchN, benchN)
			dst := make([]float32, benchN*benchN)
			b.SetBytes(4 * benchN * benchN)
			for b.Loop() {
				unpackRange(unpackRowGo, dst, f, Tile32x32, p, benchN, benchN, 0, benchN/32)
			}
			reportGBs(b, 4*benchN*benchN)
		})
	}
}

// BenchmarkNearest times the element primitive as a quantiser calls it.
func BenchmarkNearest(b *testing.B) {
	src := benchMatrix()[:1<<16]
	for _, f := range Formats() {
		b.Run(f.String(), func(b *testing.B) {
			var sink float32
			for b.Loop() {
				for i := 0; i < len(src); i += 16 {
					e := SharedExponent(src[i : i+16])
					for _, x := range src[i : i+16] {
						sink += f.Nearest(x, e)
					}
				}
			}
			b.ReportMetric(float64(len(src))*float64(b.N)/b.Elapsed().Seconds()/1e6, "Melem/s")
			_ = sink
		})
	}
}
