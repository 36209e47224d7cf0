package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// bfpTestValues returns n float32 values that exercise every branch of the
// BFP element rule for exponents near e: zeros of both signs, subnormals,
// values whose exponent exceeds e (saturation), values far below it (shift
// of 24 or more), and mantissas on and next to every rounding boundary.
func bfpTestValues(r *rand.Rand, n int, e uint32) []float32 {
	x := make([]float32, n)
	for i := range x {
		sign := uint32(r.IntN(2)) << 31
		var b uint32
		switch r.IntN(8) {
		case 0:
			b = 0
		case 1:
			b = uint32(r.IntN(1 << 23)) // subnormal
		case 2:
			ex := min(e+uint32(r.IntN(3)), 254)
			b = ex<<23 | uint32(r.IntN(1<<23))
		case 3:
			// A mantissa ending exactly half-way between kept bits, or one
			// off, for every truncation shift.
			sh := uint32(r.IntN(24))
			m := uint32(r.IntN(1<<23)) &^ (1<<sh - 1)
			if sh > 0 {
				m |= 1 << (sh - 1)
			}
			m += uint32(r.IntN(3)) - 1
			ex := max(int(e)-r.IntN(26), 1)
			b = uint32(ex)<<23 | m&0x7fffff
		default:
			ex := max(int(e)-r.IntN(30), 1)
			b = uint32(ex)<<23 | uint32(r.IntN(1<<23))
		}
		x[i] = math.Float32frombits(b | sign)
	}
	return x
}

// TestBFPRoundTwins checks the vector BFP rounding against its pure-Go
// twin bit for bit, for every magnitude width, exponents across the whole
// range (the ones outside the vector rule must be reported), every length
// class of the vector loop and its tail.
func TestBFPRoundTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for w := uint(1); w <= BFPMaxMagBits; w++ {
		for _, n := range []int{1, 7, 8, 9, 16, 31, 64, 133} {
			for _, eBase := range []uint32{0, uint32(w) - 1, uint32(w), uint32(w) + 1, 100, 127, 200, 253, 254, 255} {
				x := bfpTestValues(r, n, eBase)
				exps := make([]uint8, n)
				fast := true
				for i := range exps {
					e := int(eBase) + r.IntN(3) - 1
					if eBase >= 200 && r.IntN(2) == 0 {
						e = int(eBase)
					}
					exps[i] = uint8(min(max(e, 0), 255))
					fast = fast && BFPFastExp(exps[i], w)
				}
				got := make([]float32, n)
				want := make([]float32, n)
				okG := BFPRound32(x, got, exps, w)
				okW := bfpRound32Go(x, want, exps, uint32(w))
				if okG != fast || okW != fast {
					t.Fatalf("w=%d n=%d: reported %v (Go twin %v), want %v", w, n, okG, okW, fast)
				}
				for i := range x {
					if !BFPFastExp(exps[i], w) {
						continue
					}
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("w=%d: x=%#08x e=%d: got %#08x, Go twin %#08x", w, math.Float32bits(x[i]), exps[i],
							math.Float32bits(got[i]), math.Float32bits(want[i]))
					}
				}
			}
		}
		for _, groups := range []int{1, 2, 5} {
			for _, eBase := range []uint32{1, uint32(w), uint32(w) + 3, 127, 254} {
				n := 16 * groups
				x := bfpTestValues(r, n, eBase)
				if r.IntN(3) == 0 {
					clear(x[:16]) // a group of zeros: exponent 0
				}
				fast := true
				for g := 0; g < n; g += 16 {
					var e uint32
					for _, v := range x[g : g+16] {
						e = max(e, math.Float32bits(v)>>23&0xff)
					}
					fast = fast && BFPFastExp(uint8(e), w)
				}
				got := make([]float32, n)
				want := make([]float32, n)
				okG := BFPRoundGroups32(x, got, w)
				okW := bfpRoundGroups32Go(x, want, uint32(w))
				if okG != fast || okW != fast {
					t.Fatalf("w=%d groups=%d: reported %v (Go twin %v), want %v", w, groups, okG, okW, fast)
				}
				if !fast {
					continue
				}
				for i := range x {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("w=%d group %d: x=%#08x: got %#08x, Go twin %#08x", w, i/16, math.Float32bits(x[i]),
							math.Float32bits(got[i]), math.Float32bits(want[i]))
					}
				}
			}
		}
	}
}

// TestAxpySubRowsTwins checks AxpySubRows32 against Axpy32 with the
// negated coefficient row by row and against its pure-Go twin, bit for
// bit, for every length class of the 32- and 8-wide loops and the tail.
func TestAxpySubRowsTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, m := range []int{1, 2, 5} {
		for n := 1; n < 80; n++ {
			ldy := n + r.IntN(9)
			a := to32(randMat64(r, m))
			x := to32(randMat64(r, n))
			for i := range x {
				x[i] *= float32(math.Ldexp(1, r.IntN(40)-20))
			}
			y := to32(randMat64(r, (m-1)*ldy+n))
			got := append([]float32(nil), y...)
			AxpySubRows32(a, x, got, ldy)
			want := append([]float32(nil), y...)
			for j, c := range a {
				Axpy32(-c, x, want[j*ldy:j*ldy+n])
			}
			twin := append([]float32(nil), y...)
			axpySubRows32Go(a, x, twin, ldy)
			for i := range got {
				if !bitsEqual32(got[i], want[i]) || !bitsEqual32(twin[i], want[i]) {
					t.Fatalf("m=%d n=%d ldy=%d: y[%d] = %g (Go twin %g), row-wise Axpy32 %g", m, n, ldy, i, got[i], twin[i], want[i])
				}
			}
		}
	}
}

// TestAllFinite32 puts a NaN or an infinity at every position class of the
// vector loop, its tail and the parallel chunks, and checks that it is
// found (FirstNonFinite32 at its index, also with a second one after it),
// and that finite extremes are not reported.
func TestAllFinite32(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 40, 1<<16 + 13, 3 << 16} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i%7) - 3
		}
		if n > 0 {
			x[n/2] = math.MaxFloat32
			x[n-1] = -math.MaxFloat32
		}
		if !AllFinite32(x) || !allFinite32Go(x) || FirstNonFinite32(x) != -1 {
			t.Fatalf("n=%d: finite values reported as not finite", n)
		}
		for _, pos := range []int{0, n / 3, n - 1} {
			if pos < 0 || pos >= n {
				continue
			}
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
				old := x[pos]
				x[pos] = bad
				if AllFinite32(x) || allFinite32Go(x) {
					t.Fatalf("n=%d: %v at %d not found", n, bad, pos)
				}
				if got := FirstNonFinite32(x); got != pos {
					t.Fatalf("n=%d: %v at %d reported at %d", n, bad, pos, got)
				}
				if pos+1 < n { // a later one does not hide the first
					x[n-1] = bad
					if got := FirstNonFinite32(x); got != pos {
						t.Fatalf("n=%d: %v at %d and %d reported at %d", n, bad, pos, n-1, got)
					}
					x[n-1] = -math.MaxFloat32
				}
				x[pos] = old
			}
		}
	}
}

// TestMaxExponentsAndQuantErrTwins checks MaxExponents32,
// GroupMaxExponents32 and QuantErr32 against their pure-Go twins bit for
// bit, on every length class of the
// vector loops and their tails, with zeros, subnormals, infinities and
// values whose squares underflow or overflow.
func TestMaxExponentsAndQuantErrTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -1e-45, float32(math.Inf(1)), 3e38, -2e-20}
	for n := 0; n < 100; n++ {
		x := make([]float32, n)
		q := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(60)-30))
			q[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(60)-30))
			if r.IntN(6) == 0 {
				x[i] = special[r.IntN(len(special))]
			}
		}
		exp := make([]uint8, n)
		for i := range exp {
			exp[i] = uint8(r.IntN(256))
		}
		got := append([]uint8(nil), exp...)
		MaxExponents32(x, got)
		want := append([]uint8(nil), exp...)
		maxExponents32Go(x, want)
		for i := range got {
			if w := max(exp[i], uint8(math.Float32bits(x[i])>>23&0xff)); got[i] != w || want[i] != w {
				t.Fatalf("n=%d: exponent[%d] = %d (Go twin %d), want %d", n, i, got[i], want[i], w)
			}
		}
		ng := (n + 15) / 16
		gG, gW := make([]uint8, ng), make([]uint8, ng)
		GroupMaxExponents32(x, gG)
		groupMaxExponents32Go(x, gW)
		for g := range gG {
			var w uint8
			for _, v := range x[g*16 : min(g*16+16, n)] {
				w = max(w, uint8(math.Float32bits(v)>>23&0xff))
			}
			if gG[g] != w || gW[g] != w {
				t.Fatalf("n=%d: group %d exponent %d (Go twin %d), want %d", n, g, gG[g], gW[g], w)
			}
		}
		d := float32(r.Float64()*2 + 0.01)
		for _, dd := range []float32{d, 1e-20, 3e19} {
			acc := make([]float64, n)
			for i := range acc {
				acc[i] = r.Float64()
			}
			eG, eW := make([]float32, n), make([]float32, n)
			aG, aW := append([]float64(nil), acc...), append([]float64(nil), acc...)
			QuantErr32(x, q, eG, aG, dd, dd*dd)
			quantErr32Go(x, q, eW, aW, dd, dd*dd)
			for i := range x {
				diff := x[i] - q[i]
				we := diff / dd
				wa := acc[i] + float64(diff*diff/(dd*dd))/2
				if !bitsEqual32(eG[i], we) || !bitsEqual32(eW[i], we) || !bitsEqual64(aG[i], wa) || !bitsEqual64(aW[i], wa) {
					t.Fatalf("n=%d d=%g: [%d] e %g / %g, acc %g / %g; want %g, %g", n, dd, i, eG[i], eW[i], aG[i], aW[i], we, wa)
				}
			}
		}
	}
}

// TestGemmAccSide: SgemmAcc, DgemmAcc and SgemmPackedAcc (on a repacked
// B) give Sgemm's and Dgemm's bits (beta 1) and run the side job exactly
// once, on any number of workers, also when the product is small enough
// to run on one goroutine or empty.
func TestGemmAccSide(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	defer SetWorkers(SetWorkers(1))
	for _, w := range []int{1, 3} {
		SetWorkers(w)
		for _, sz := range [][3]int{{0, 5, 7}, {5, 7, 3}, {70, 130, 300}} {
			m, n, k := sz[0], sz[1], sz[2]
			a, b := randMat64(r, k*m), randMat64(r, k*n)
			c := randMat64(r, m*n)
			want := append([]float64(nil), c...)
			lda := max(m, 1)
			Dgemm(true, false, m, n, k, -1, a, lda, b, n, 1, want, n)
			got := append([]float64(nil), c...)
			calls := 0
			DgemmAcc(true, false, m, n, k, -1, a, lda, b, n, got, n, func() { calls++ })
			a32, b32, c32 := to32(a), to32(b), to32(c)
			want32 := append([]float32(nil), c32...)
			Sgemm(true, false, m, n, k, -1, a32, lda, b32, n, 1, want32, n)
			got32 := append([]float32(nil), c32...)
			SgemmAcc(true, false, m, n, k, -1, a32, lda, b32, n, got32, n, func() { calls++ })
			// The same through a packed B, repacked over an older one.
			pb := PackB32(false, k+3, n+5, to32(randMat64(r, (k+3)*(n+5))), n+5)
			pb.Repack(false, k, n, b32, n)
			gotP := append([]float32(nil), c32...)
			SgemmPackedAcc(true, m, -1, a32, lda, pb, gotP, n, func() { calls++ })
			if calls != 3 {
				t.Fatalf("%d workers %v: side ran %d times for three products", w, sz, calls)
			}
			for i := range got {
				if !bitsEqual64(got[i], want[i]) || !bitsEqual32(got32[i], want32[i]) || !bitsEqual32(gotP[i], want32[i]) {
					t.Fatalf("%d workers %v: [%d] = %g / %g / %g, want %g / %g", w, sz, i, got[i], got32[i], gotP[i], want[i], want32[i])
				}
			}
		}
	}
}

// TestBFPErrAccTwins checks BFPErrAcc32 against its pure-Go twin and
// against BFPRound32 followed by the float64 error, bit for bit: every
// magnitude width, one and three candidates, one value per group and 16
// (whole blocks of 64 groups, the transposed blocks of 8 and the groups
// after them, a last group cut short), exponents across the whole range
// and near 0 and 255, the weight 1 and others; sums of candidates outside
// the vector rule must stay as they were.
func TestBFPErrAccTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	for w := uint(1); w <= BFPMaxMagBits; w++ {
		for _, per := range []int{1, 16, 3} {
			for _, n := range []int{1, 7, 8, 9, 16, 31, 133, 16 * 8, 16*64 + 5, 16 * 72, 16*67 + 3} {
				eBase := []uint32{0, 1, uint32(w), uint32(w) + 1, 100, 127, 200, 254, 255}[r.IntN(9)]
				x := bfpTestValues(r, n, eBase)
				ng := (n + per - 1) / per
				exps := make([]uint8, ng)
				for g := range exps {
					exps[g] = uint8(min(max(int(eBase)+r.IntN(5)-2, 0), 255))
				}
				wt := 1.0
				if r.IntN(2) == 0 {
					wt = math.Ldexp(1+r.Float64(), r.IntN(40)-20)
				}
				cands := 1 + r.IntN(BFPMaxCands)
				acc := make([][]float64, cands)
				twin := make([][]float64, cands)
				want := make([][]float64, cands)
				for k := range acc {
					acc[k] = make([]float64, ng)
					for g := range acc[k] {
						acc[k][g] = r.Float64() * float64(r.IntN(2))
					}
					twin[k] = append([]float64(nil), acc[k]...)
					want[k] = append([]float64(nil), acc[k]...)
				}
				BFPErrAcc32(x, exps, per, w, wt, acc)
				bfpErrAcc32Go(x, exps, per, uint32(w), wt, twin)
				for k := range want {
					ev := make([]uint8, n)
					for i := range ev {
						ev[i] = exps[i/per] - uint8(k)
					}
					q := make([]float32, n)
					BFPRound32(x, q, ev, w)
					for i, v := range x {
						if exps[i/per] < uint8(k) || !BFPFastExp(ev[i], w) {
							continue
						}
						d := float64(v) - float64(q[i])
						want[k][i/per] += float64(wt * d * d)
					}
				}
				for k := range want {
					for g := range want[k] {
						if !bitsEqual64(acc[k][g], want[k][g]) || !bitsEqual64(twin[k][g], want[k][g]) {
							t.Fatalf("w=%d per=%d n=%d cands=%d wt=%g: candidate %d group %d (exponent %d): %v (Go twin %v), want %v",
								w, per, n, cands, wt, k, g, exps[g], acc[k][g], twin[k][g], want[k][g])
						}
					}
				}
			}
		}
	}
}
