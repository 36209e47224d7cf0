package harness

import (
	"context"
	"fmt"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/internal/model/forward"
)

// runner adapts a forward.Model to eval.BatchModel: a window, or a group
// of windows run as one forward batch (every layer over all of them), from
// a fresh state; the final-normed hidden states are kept and logits
// computed on demand. Forward and ForwardBatch start the pass and return
// at once; the first Logits call waits for it. eval.Evaluate starts the
// reference and every candidate before it asks for logits, so the runs
// proceed concurrently (each also using the kernels' goroutines). A
// window's rows do not depend on the others in its batch, so its logits
// are those of the window run alone.
type runner struct {
	m *forward.Model
	// lens are the current pass's windows' lengths, off their first rows.
	lens, off []int
	hf        []float32
	err       error
	done      chan struct{}
	// lg holds the logits of positions [b0, b1) of window lw of the pass.
	// Every product reads the whole LM head, and eval.Evaluate asks for a
	// few positions at a time, so the runner computes forward.LogitChunk
	// positions at once and serves the next requests from them.
	lg         []float32
	lw, b0, b1 int
}

func newRunner(m *forward.Model) *runner { return &runner{m: m} }

// Forward implements eval.Model.
func (r *runner) Forward(ctx context.Context, tokens []int32) (eval.WindowLogits, error) {
	return one(r.ForwardBatch(ctx, [][]int32{tokens}))
}

// ForwardBatch implements eval.BatchModel.
func (r *runner) ForwardBatch(ctx context.Context, windows [][]int32) ([]eval.WindowLogits, error) {
	return r.start(windows, func() ([]float32, error) { return r.forward(ctx, windows) }), nil
}

// start runs pass, which returns the final-normed hidden states of the
// windows, in the background, and returns a view of each window.
func (r *runner) start(windows [][]int32, pass func() ([]float32, error)) []eval.WindowLogits {
	if r.done != nil {
		<-r.done // the previous pass (abandoned after an error)
	}
	r.lens, r.off = make([]int, len(windows)), make([]int, len(windows))
	views := make([]eval.WindowLogits, len(windows))
	n := 0
	for i, w := range windows {
		r.lens[i], r.off[i] = len(w), n
		n += len(w)
		views[i] = windowOf{r, i}
	}
	r.hf, r.err = nil, nil
	r.b0, r.b1 = 0, 0
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		r.hf, r.err = pass()
	}()
	return views
}

// embed returns the batch of the windows' embeddings.
func (r *runner) embed(windows [][]int32) (*forward.Batch, error) {
	var ids []int32
	if len(windows) == 1 {
		ids = windows[0]
	} else {
		for _, w := range windows {
			ids = append(ids, w...)
		}
	}
	x, err := r.m.Embed(ids)
	if err != nil {
		return nil, err
	}
	return &forward.Batch{Lens: r.lens, X: x}, nil
}

func (r *runner) forward(ctx context.Context, windows [][]int32) ([]float32, error) {
	b, err := r.embed(windows)
	if err != nil {
		return nil, err
	}
	if err := r.m.Trunk(b, nil, func(int, []float32) error { return ctx.Err() }); err != nil {
		return nil, err
	}
	return r.m.FinalNorm(b.X)
}

// wait waits for the pending pass; the runner is then idle.
func (r *runner) wait() {
	if r.done != nil {
		<-r.done
	}
}

// windowOf is window i of a runner's current pass.
type windowOf struct {
	r *runner
	i int
}

// Logits implements eval.WindowLogits.
func (w windowOf) Logits(dst []float32, lo, hi int) error {
	r := w.r
	r.wait()
	if r.err != nil {
		return r.err
	}
	H, V := r.m.Config.Hidden, r.m.Config.Vocab
	n := r.lens[w.i]
	if lo < 0 || hi > n || lo > hi || len(dst) != (hi-lo)*V {
		return fmt.Errorf("harness: logits of positions [%d,%d) of a %d-token window into %d values", lo, hi, n, len(dst))
	}
	hf := r.hf[r.off[w.i]*H : (r.off[w.i]+n)*H]
	if hi-lo >= forward.LogitChunk {
		return r.m.LogitRows(dst, hf[lo*H:hi*H])
	}
	for p := lo; p < hi; {
		if r.lw != w.i || p < r.b0 || p >= r.b1 {
			b1 := min(n, p+forward.LogitChunk)
			if cap(r.lg) < (b1-p)*V {
				r.lg = make([]float32, forward.LogitChunk*V)
			}
			r.b0, r.b1 = 0, 0
			if err := r.m.LogitRows(r.lg[:(b1-p)*V], hf[p*H:b1*H]); err != nil {
				return err
			}
			r.lw, r.b0, r.b1 = w.i, p, b1
		}
		q := min(hi, r.b1)
		copy(dst[(p-lo)*V:], r.lg[(p-r.b0)*V:(q-r.b0)*V])
		p = q
	}
	return nil
}

// batchTokens is the batch of an option (0: forward.BatchRows).
func batchTokens(n int) int {
	if n == 0 {
		return forward.BatchRows
	}
	return n
}
