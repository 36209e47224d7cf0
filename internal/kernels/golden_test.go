package kernels

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden_digest.txt")

// splitmix is a tiny fixed generator so that the golden inputs never
// depend on a library's random streams.
type splitmix uint64

func (s *splitmix) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform returns a value in [-1, 1) with 53 random bits.
func (s *splitmix) uniform() float64 { return float64(s.next()>>11)/(1<<52) - 1 }

func (s *splitmix) f32(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(s.uniform())
	}
	return x
}

func (s *splitmix) f64(n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = s.uniform()
	}
	return x
}

// goldenDigest runs every public kernel on fixed inputs and hashes the
// output bits.
func goldenDigest(t *testing.T) string {
	g := splitmix(42)
	h := sha256.New()
	put32 := func(x []float32) {
		for _, v := range x {
			binary.Write(h, binary.LittleEndian, math.Float32bits(v))
		}
	}
	put64 := func(x []float64) {
		for _, v := range x {
			binary.Write(h, binary.LittleEndian, math.Float64bits(v))
		}
	}
	for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
		m, n, k := 37, 29, 300
		a, b, c := g.f32(m*k), g.f32(k*n), g.f32(m*n)
		lda, ldb := k, n
		if tr[0] {
			lda = m
		}
		if tr[1] {
			ldb = k
		}
		Sgemm(tr[0], tr[1], m, n, k, -1, a, lda, b, ldb, 0.5, c, n)
		put32(c)
		a64, b64, c64 := g.f64(m*k), g.f64(k*n), g.f64(m*n)
		Dgemm(tr[0], tr[1], m, n, k, 0.75, a64, lda, b64, ldb, 1, c64, n)
		put64(c64)
	}
	{
		n, k := 45, 530
		x := g.f32(k * n)
		c64 := g.f64(n * n)
		SyrkLower64(n, k, x, n, c64, n)
		put64(c64)
		c32 := g.f32(n * n)
		SyrkLower32(n, k, x, n, c32, n)
		put32(c32)
	}
	{
		n := 211
		x := g.f64((n + 5) * n)
		hm := make([]float64, n*n)
		Dgemm(true, false, n, n, n+5, 1, x, n, x, n, 0, hm, n)
		for i := 0; i < n; i++ {
			hm[i*n+i] += 0.01
		}
		u := make([]float64, n*n)
		if err := CholInvUpper(n, hm, n, u, n); err != nil {
			t.Fatal(err)
		}
		put64(u)
		l := append([]float64(nil), hm...)
		if err := Dpotrf(n, l, n); err != nil {
			t.Fatal(err)
		}
		if err := Dpotri(n, l, n); err != nil {
			t.Fatal(err)
		}
		put64(l)
		h32 := make([]float32, len(hm))
		for i, v := range hm {
			h32[i] = float32(v)
		}
		u32 := make([]float32, n*n)
		if err := CholInvUpper32(n, h32, n, u32, n); err != nil {
			t.Fatal(err)
		}
		put32(u32)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestGoldenDigest pins the exact output bits of every kernel. The digest
// in testdata/golden_digest.txt was produced by this test with -update on
// amd64 with the AVX2/FMA kernels; the purego build (and any other
// architecture) must reproduce it, which is what makes the two builds
// provably bit-identical in CI. Regenerate it only when the documented
// rounding changes on purpose.
func TestGoldenDigest(t *testing.T) {
	got := goldenDigest(t)
	path := filepath.Join("testdata", "golden_digest.txt")
	if *update {
		content := "# SHA-256 of the outputs of goldenDigest (golden_test.go); made with\n# go test -run TestGoldenDigest -update ./internal/kernels (amd64, AVX2/FMA kernels)\n" + got + "\n"
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want string
	for _, line := range strings.Split(string(data), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			want = strings.TrimSpace(line)
		}
	}
	if got != want {
		t.Fatalf("kernel outputs changed (implementation %s): digest %s, golden %s", Impl(), got, want)
	}
}
