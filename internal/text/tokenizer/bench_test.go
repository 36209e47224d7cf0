package tokenizer

import (
	"path/filepath"
	"sort"
	"testing"

	"github.com/ttquant/ttquant/internal/benchenv"
)

// goSource returns about n bytes of Go standard-library source as one
// slice of files, in a fixed order.
func goSource(b testing.TB, n int) []string {
	files := corpus(b, filepath.Join(goroot(b), "net", "http"), n, ".go")
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = files[k]
	}
	return out
}

func benchEncode(b *testing.B, tok *Tokenizer) {
	texts := goSource(b, 2<<20)
	size, tokens := 0, 0
	for _, s := range texts {
		size += len(s)
		tokens += len(tok.Encode(s)) // warms the cache
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	cpu0 := benchenv.CPU()
	for i := 0; i < b.N; i++ {
		for _, s := range texts {
			tok.Encode(s)
		}
	}
	cpu := (benchenv.CPU() - cpu0).Seconds()
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(size)*float64(b.N)/sec/1e6, "MB/s")
	b.ReportMetric(float64(tokens)*float64(b.N)/sec, "tokens/s")
	if cpu > 0 {
		// Throughput per CPU-second: what one core delivers when the
		// machine is shared and the wall clock is not ours alone.
		b.ReportMetric(float64(size)*float64(b.N)/cpu/1e6, "MB/cpu-s")
		b.ReportMetric(float64(tokens)*float64(b.N)/cpu, "tokens/cpu-s")
	}
}

// BenchmarkEncodeGoSource: Qwen3 tokenizer (151k vocabulary) on 2 MB of Go
// source, one goroutine, warm pre-token cache.
func BenchmarkEncodeGoSource(b *testing.B) { benchEncode(b, load(b, "tokenizer", "qwen3")) }

// BenchmarkEncodeGoSourceNoCache is the same with the cache off: every
// pre-token goes through BPE.
func BenchmarkEncodeGoSourceNoCache(b *testing.B) {
	t := *load(b, "tokenizer", "qwen3")
	t.cache = nil
	benchEncode(b, &t)
}

// BenchmarkEncodeGoSourceQwen36 uses the Qwen3.6-pattern tokenizer of the
// trained tiny model (4k vocabulary).
func BenchmarkEncodeGoSourceQwen36(b *testing.B) {
	benchEncode(b, load(b, "models", "tiny-qwen36-trained"))
}

func BenchmarkLoadQwen3(b *testing.B) {
	dir := filepath.Join("..", "..", "..", "testdata", "tokenizer", "qwen3")
	cpu0 := benchenv.CPU()
	for i := 0; i < b.N; i++ {
		if _, err := Load(dir); err != nil {
			b.Fatal(err)
		}
	}
	if cpu := benchenv.CPU() - cpu0; cpu > 0 {
		b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
	}
}
