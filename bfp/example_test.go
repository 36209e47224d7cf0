package bfp_test

import (
	"fmt"

	"github.com/ttquant/ttquant/bfp"
)

// Pack a 1x3 matrix into one BFP8_b 32x32 tile and decode it again. The
// values are tt-metal's own unit-test cases: 64.75 rounds up to 65, the
// ties 64.5 and 65.5 go to the even neighbours 64 and 66.
func Example() {
	m := []float32{64.75, 64.5, 65.5}
	packed, err := bfp.Pack(bfp.BFP8, bfp.Tile32x32, m, 1, 3)
	if err != nil {
		panic(err)
	}
	back, err := bfp.Unpack(bfp.BFP8, bfp.Tile32x32, packed, 1, 3)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(packed), back)
	// Output: 1088 [65 64 66]
}

// The block primitives give the same values as Pack then Unpack.
func ExampleFormat_Nearest() {
	group := []float32{64.75, 7.9999}
	e := bfp.SharedExponent(group) // 133: the exponent field of 64.75
	fmt.Println(e, bfp.BFP8.Nearest(7.9999, e), bfp.BFP8.Encode(7.9999, e))
	// Output: 133 8 8
}
