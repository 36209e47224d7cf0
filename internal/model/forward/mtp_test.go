package forward

import "testing"

// mtpNLL returns the MTP head's NLL sum and count over one sequence: slot
// t (position t) predicts token t+2.
// hf is the trunk's final-normed hidden states of the sequence.
func mtpNLL(tb testing.TB, m *Model, ids []int32, hf []float32) (float64, int) {
	tb.Helper()
	z, err := m.MTPInput(ids, hf)
	if err != nil {
		tb.Fatal(err)
	}
	rows, err := m.MTPHead(&Batch{Lens: []int{len(ids) - 1}, X: z}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	V := m.Config.Vocab
	var nll float64
	n := 0
	err = m.Logits(rows, func(row0, k int, lg []float32) error {
		for i := 0; i < k; i++ {
			t := row0 + i
			if t+2 >= len(ids) {
				continue
			}
			lp, _ := LogSoftmaxAt(lg[i*V:(i+1)*V], int(ids[t+2]))
			nll -= lp
			n++
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return nll, n
}
