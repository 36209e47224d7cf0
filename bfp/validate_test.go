package bfp

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// packsBack reports whether Pack(Unpack(p)) == p.
func packsBack(f Format, t Tile, p []byte, rows, cols int) bool {
	u, err := Unpack(f, t, p, rows, cols)
	if err != nil {
		panic(err)
	}
	q, err := Pack(f, t, u, rows, cols)
	if err != nil {
		panic(err)
	}
	return bytes.Equal(p, q)
}

// TestValidateMatchesRoundTrip checks Validate against its definition,
// Pack(Unpack(p)) == p, on packer output and on single-byte corruptions
// of it.
func TestValidateMatchesRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	checked, rejected := 0, 0
	for _, f := range Formats() {
		for _, tl := range []Tile{Tile32x32, Tile16x32, Tile8x16, Tile1x16, Tile4x32} {
			rows, cols := tl.H+3, tl.W+7
			src := make([]float32, rows*cols)
			for i := range src {
				switch rng.IntN(8) {
				case 0:
					src[i] = 0
				case 1:
					src[i] = math.Float32frombits(rng.Uint32())
				default:
					// Small exponents exercise the E-dependent rules.
					src[i] = math.Float32frombits(rng.Uint32()&0x807FFFFF | uint32(rng.IntN(12))<<23)
				}
			}
			p, err := Pack(f, tl, src, rows, cols)
			if err != nil {
				t.Fatal(err)
			}
			if err := Validate(f, tl, p, rows, cols); err != nil {
				t.Fatalf("%v %v: packer output rejected: %v", f, tl, err)
			}
			for range 400 {
				q := bytes.Clone(p)
				i := rng.IntN(len(q))
				q[i] ^= uint8(1 + rng.IntN(255))
				err := Validate(f, tl, q, rows, cols)
				if want := packsBack(f, tl, q, rows, cols); (err == nil) != want {
					t.Fatalf("%v %v: byte %d changed: Validate = %v, Pack(Unpack) == input is %v", f, tl, i, err, want)
				}
				if err != nil {
					var ce *CanonicalError
					if !errors.Is(err, ErrNotCanonical) || !errors.As(err, &ce) {
						t.Fatalf("error kind: %v", err)
					}
					rejected++
				}
				checked++
			}
		}
	}
	if rejected == 0 || rejected == checked {
		t.Errorf("%d of %d corruptions rejected: the test did not exercise both outcomes", rejected, checked)
	}
	t.Logf("%d corruptions checked, %d rejected", checked, rejected)
}

func TestValidateErrors(t *testing.T) {
	p := make([]byte, TileBytes(BFP8, Tile32x32))
	if err := Validate(BFP8, Tile32x32, p, 32, 32); err != nil {
		t.Errorf("all-zero tile: %v", err)
	}
	if err := Validate(BFP8, Tile32x32, p[:10], 32, 32); !errors.Is(err, ErrBufferSize) {
		t.Errorf("short: %v", err)
	}
	q := bytes.Clone(p)
	q[64+5] = 0x80 // sign-only code, group 0 element 5
	var ce *CanonicalError
	if err := Validate(BFP8, Tile32x32, q, 32, 32); !errors.As(err, &ce) || ce.Group != 0 || ce.Element != 5 || ce.Row != 0 || ce.Col != 5 {
		t.Errorf("sign-only code: %v", err)
	}
	q = bytes.Clone(p)
	q[17] = 130 // group 17 (face 1 row 1) has an exponent but no elements
	if err := Validate(BFP8, Tile32x32, q, 32, 32); !errors.As(err, &ce) || ce.Group != 17 || ce.Row != 1 || ce.Col != 16 {
		t.Errorf("empty group with exponent: %v", err)
	}
	// Padding element with a code: 1x16 tile, matrix 1x10.
	r := make([]byte, TileBytes(BFP4, Tile1x16))
	r[0] = 127
	r[16] = 0x04   // element 0: magnitude 4 (top bit)
	r[16+5] = 0x10 // element 11: magnitude 1, beyond col 10
	if err := Validate(BFP4, Tile1x16, r, 1, 10); !errors.As(err, &ce) || ce.Element != 11 || ce.Col != 11 {
		t.Errorf("padding code: %v", err)
	}
	r[16+5] = 0
	if err := Validate(BFP4, Tile1x16, r, 1, 10); err != nil {
		t.Errorf("valid 1x10: %v", err)
	}
	r[1] = 1 // exponent section padding
	if err := Validate(BFP4, Tile1x16, r, 1, 10); !errors.As(err, &ce) {
		t.Errorf("exponent padding: %v", err)
	}
}
