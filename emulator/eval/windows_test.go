package eval

import (
	"strings"
	"testing"
)

func seq(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(100 + i)
	}
	return t
}

func TestStreamWindows(t *testing.T) {
	toks := seq(2*DefaultWindow + 777)
	ws, err := StreamWindows("code", toks, DefaultWindow)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 {
		t.Fatalf("%d windows, want 2 (tail dropped)", len(ws))
	}
	for j, w := range ws {
		if w.Corpus != "code" || w.Start != j*DefaultWindow || len(w.Tokens) != DefaultWindow || w.Tokens[0] != toks[j*DefaultWindow] {
			t.Fatalf("window %d: corpus %q start %d len %d", j, w.Corpus, w.Start, len(w.Tokens))
		}
		if w.Scored() != DefaultWindow-1 || w.Score[DefaultWindow-1] || w.Targets[DefaultWindow-1] != -1 {
			t.Errorf("window %d: %d scored, last %v/%d", j, w.Scored(), w.Score[DefaultWindow-1], w.Targets[DefaultWindow-1])
		}
		for i := 0; i < DefaultWindow-1; i++ {
			if w.Targets[i] != w.Tokens[i+1] {
				t.Fatalf("window %d position %d: target %d, next token %d", j, i, w.Targets[i], w.Tokens[i+1])
			}
		}
	}
	if ws, _ := StreamWindows("code", toks[:DefaultWindow-1], DefaultWindow); len(ws) != 0 {
		t.Errorf("a short stream gave %d windows", len(ws))
	}
	if _, err := StreamWindows("code", toks, 1); err == nil {
		t.Error("window of 1 accepted")
	}
	b := ws[1].Batch(10, 20, make([]float32, 10*3), [][]float32{make([]float32, 10*3)})
	if len(b.Targets) != 10 || b.Targets[0] != ws[1].Tokens[11] || len(b.Mask) != 10 || b.Corpus[0] != "code" {
		t.Errorf("batch %+v", b)
	}
}

func TestMaskedWindows(t *testing.T) {
	// Record 0: user turn (tokens 0..3), assistant reply (4..6), user (7), assistant (8..9).
	m0 := []bool{false, false, false, false, true, true, true, false, true, true}
	// Record 1: nothing to score. Record 2: longer than the window, all assistant.
	recs := []Record{{seq(10), m0}, {seq(4), make([]bool, 4)}, {seq(9), []bool{true, true, true, true, true, true, true, true, true}}}
	ws, st, err := MaskedWindows("chat", recs, 4)
	if err != nil {
		t.Fatal(err)
	}
	// Record 0 in windows [0,4) [4,8) [8,10); record 2 in [0,4) [4,8) [8,9).
	// Window [0,4) of record 0 scores nothing (token 4 starts the next
	// window) and is dropped, as is the one-token window [8,9) of record 2.
	type want struct {
		rec, start int
		score      string
	}
	exp := []want{{0, 4, "1100"}, {0, 8, "10"}, {2, 0, "1110"}, {2, 4, "1110"}}
	if len(ws) != len(exp) {
		t.Fatalf("%d windows, want %d", len(ws), len(exp))
	}
	scored := 0
	for i, w := range ws {
		var s strings.Builder
		for _, b := range w.Score {
			if b {
				s.WriteByte('1')
			} else {
				s.WriteByte('0')
			}
		}
		if w.Record != exp[i].rec || w.Start != exp[i].start || s.String() != exp[i].score || w.Corpus != "chat" {
			t.Errorf("window %d: record %d start %d score %s, want %+v", i, w.Record, w.Start, s.String(), exp[i])
		}
		for p, ok := range w.Score {
			if ok && w.Targets[p] != recs[w.Record].Tokens[w.Start+p+1] {
				t.Errorf("window %d position %d: target %d", i, p, w.Targets[p])
			}
			if ok && !recs[w.Record].Mask[w.Start+p+1] {
				t.Errorf("window %d position %d scores an unmasked token", i, p)
			}
		}
		scored += w.Scored()
	}
	// Masked tokens of record 0: 4 and 8 start windows, 5, 6 and 9 are
	// scored. Record 2: tokens 0, 4 and 8 start windows, the other 6 are
	// scored.
	if st.Scored != scored || st.Scored != 9 || st.Unscorable != 5 || st.Split != 2 {
		t.Errorf("stats %+v (windows score %d)", st, scored)
	}
	if _, _, err := MaskedWindows("chat", []Record{{seq(3), []bool{true}}}, 4); err == nil || !strings.Contains(err.Error(), "chat record 0: 1 mask entries for 3 tokens") {
		t.Errorf("bad mask: %v", err)
	}
}
