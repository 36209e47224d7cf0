package eval

import (
	"math/rand/v2"
	"testing"
)

func randTokens(r *rand.Rand, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(r.IntN(1000))
	}
	return t
}

func TestOverlapIndex(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	calib := [][]int32{randTokens(r, 500), randTokens(r, 300)}
	x, err := NewOverlapIndex(calib, 16)
	if err != nil {
		t.Fatal(err)
	}
	clean := randTokens(r, 1000)
	if at := x.First(clean); at != -1 {
		t.Fatalf("unrelated text overlaps at %d", at)
	}
	// Copy 16 calibration tokens into the text: found exactly there.
	dirty := append([]int32(nil), clean...)
	copy(dirty[700:], calib[1][100:116])
	if at := x.First(dirty); at != 700 {
		t.Errorf("overlap found at %d, want 700", at)
	}
	// 15 shared tokens are not a run.
	near := append([]int32(nil), clean...)
	copy(near[700:], calib[1][100:115])
	if at := x.First(near); at != -1 {
		t.Errorf("a 15-token run found at %d", at)
	}
	// Runs do not cross sequences: the end of one and the start of the next.
	joint := append(append([]int32(nil), calib[0][492:]...), calib[1][:8]...)
	if at := x.First(joint); at != -1 {
		t.Errorf("a run across two sequences found at %d", at)
	}
	ws, _ := StreamWindows("code", append(clean, dirty...), 256)
	found, total := x.CheckOverlap(ws, 1)
	if total != 1 || len(found) != 1 || found[0].Window != 6 || found[0].At != 1000+700 || found[0].String() != "code record 0, token 1700" {
		t.Errorf("found %+v of %d", found, total)
	}
	if _, err := NewOverlapIndex(nil, 1); err == nil {
		t.Error("run of 1 accepted")
	}
	if d, _ := NewOverlapIndex(nil, 0); d.Run() != DefaultOverlapRun {
		t.Errorf("default run %d", d.Run())
	}
}
