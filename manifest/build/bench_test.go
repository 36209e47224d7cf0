package build

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkConvertTiny measures a round-to-nearest build of the tiny model
// (about 15 MB of BF16 source) in source MB/s.
func BenchmarkConvertTiny(b *testing.B) {
	src, _ := tinyFixture(b)
	var srcBytes int64
	for i := 0; i < b.N; i++ {
		out := filepath.Join(b.TempDir(), "out")
		res, err := Convert(context.Background(), convertOpts(b, out, 2))
		if err != nil {
			b.Fatal(err)
		}
		srcBytes = res.Work.SourceBytes
		os.RemoveAll(out)
	}
	_ = src
	b.ReportMetric(float64(srcBytes)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
}

// BenchmarkVerifyTiny measures verify of the tiny RTN checkpoint, without
// and with the source, in checkpoint MB/s.
func BenchmarkVerifyTiny(b *testing.B) {
	src, _ := tinyFixture(b)
	ref := reference(b, "convert")
	for _, withSource := range []bool{false, true} {
		name := "alone"
		opt := VerifyOptions{Workers: 2}
		if withSource {
			name = "source"
			opt.Source = src
		}
		b.Run(name, func(b *testing.B) {
			var n int64
			for i := 0; i < b.N; i++ {
				rep := mustVerify(b, ref, opt)
				if !rep.OK {
					b.Fatal(rep.Failures)
				}
				n = rep.Bytes
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
		})
	}
}
