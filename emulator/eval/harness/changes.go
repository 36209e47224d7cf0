package harness

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/forward"
	"github.com/ttquant/ttquant/internal/text/dataset"
)

// Change is one candidate of a single-change evaluation: the reference
// model with some tensors of the layers Layers (ascending) replaced: Src
// offers them under their Hugging Face names; everything Src does not
// offer comes from the reference. Src may offer part of a routed expert
// (its gate and up rows but not its down projection): the rest is read
// from the reference's fused expert tensors.
type Change struct {
	Label  string
	Layers []int
	Src    forward.WeightSource
}

// ChangeOptions tune EvaluateChanges; the zero value is usable.
type ChangeOptions struct {
	// Chunk is the number of positions scored at a time (0: 16).
	Chunk int
	// BatchTokens is Options.BatchTokens; the reference's streams entering
	// the changes' first layers are kept for a whole batch.
	BatchTokens int
	// Workers are the scorer's goroutines (0: GOMAXPROCS); results do
	// not depend on it.
	Workers int
	// Progress receives eval.Evaluate's progress after every window.
	Progress func(eval.Progress)
}

// Validate reports an option out of range: a negative chunk or worker
// count is an error, not the default.
func (o ChangeOptions) Validate() error {
	if o.Chunk < 0 || o.Workers < 0 || o.BatchTokens < 0 {
		return fmt.Errorf("harness: chunk %d, workers %d, batch tokens %d: want ≥ 0", o.Chunk, o.Workers, o.BatchTokens)
	}
	return nil
}

// EvaluateChanges scores every change against the reference on windows
// and returns, per change in order, its row over every scored position
// (corpus eval.AllCorpus).
//
// A change whose first layer is l leaves layers 0 … l−1 as they are, so
// its run starts from the reference's residual stream entering layer l
// (kept from the reference's run of the same window) and runs its own
// weights for the layers it changes and the reference's for the others: a
// change of the last layer costs one layer and the head, not a whole
// forward pass, and only the changed layers' weights are held per change.
// The result is the one a full run of the changed model gives, bit for
// bit.
func EvaluateChanges(ctx context.Context, ref *forward.Model, changes []Change, windows []eval.Window, labels []string, opt ChangeOptions) ([]eval.Row, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if len(changes) == 0 {
		return nil, fmt.Errorf("harness: no change to evaluate")
	}
	cfg := ref.Config
	keep := map[int]bool{}
	names := make([]string, len(changes))
	cands := make([]eval.Model, len(changes))
	rr := &prefixRunner{runner: runner{m: ref}, keep: keep}
	for i, c := range changes {
		cr := &changeRunner{runner: runner{m: ref}, ref: rr, own: map[int]*forward.Layer{}}
		for k, li := range c.Layers {
			if li < 0 || li >= cfg.Layers || (k > 0 && li <= c.Layers[k-1]) {
				return nil, fmt.Errorf("harness: change %q of layers %v: want ascending layers of 0 … %d", c.Label, c.Layers, cfg.Layers-1)
			}
			l, err := forward.LoadLayer(forward.Overlay{c.Src, perExpert{ref.Src}, ref.Src}, cfg, li)
			if err != nil {
				return nil, fmt.Errorf("harness: change %q: %w", c.Label, err)
			}
			cr.own[li] = l
		}
		if len(c.Layers) == 0 {
			return nil, fmt.Errorf("harness: change %q changes no layer", c.Label)
		}
		cr.first = c.Layers[0]
		keep[cr.first] = true
		names[i] = c.Label
		cands[i] = cr
	}
	workers := opt.Workers
	if workers == 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	scorer, err := newScorer(cfg.Vocab, names, labels, workers)
	if err != nil {
		return nil, err
	}
	if err := evaluate(ctx, scorer, rr, cands, windows, eval.EvalOptions{Chunk: opt.Chunk, BatchTokens: batchTokens(opt.BatchTokens), Progress: opt.Progress}); err != nil {
		return nil, err
	}
	rows := make([]eval.Row, len(changes))
	for i := range changes {
		all := scorer.Accumulator().Rows(i)
		rows[i] = all[len(all)-1]
	}
	return rows, nil
}

// prefixRunner is the reference of a single-change evaluation: a runner
// that also keeps the residual stream entering each layer in keep.
type prefixRunner struct {
	runner
	keep map[int]bool
	at   map[int][]float32 // the current window's kept streams
}

func (r *prefixRunner) Forward(ctx context.Context, tokens []int32) (eval.WindowLogits, error) {
	return one(r.ForwardBatch(ctx, [][]int32{tokens}))
}

func (r *prefixRunner) ForwardBatch(ctx context.Context, windows [][]int32) ([]eval.WindowLogits, error) {
	at := map[int][]float32{}
	views := r.start(windows, func() ([]float32, error) { return r.run(ctx, windows, at) })
	r.at = at
	return views, nil
}

func (r *prefixRunner) run(ctx context.Context, windows [][]int32, at map[int][]float32) ([]float32, error) {
	b, err := r.embed(windows)
	if err != nil {
		return nil, err
	}
	if r.keep[0] {
		at[0] = append([]float32(nil), b.X...)
	}
	if err := r.m.Trunk(b, nil, func(i int, x []float32) error {
		if r.keep[i+1] {
			at[i+1] = append([]float32(nil), x...)
		}
		return ctx.Err()
	}); err != nil {
		return nil, err
	}
	return r.m.FinalNorm(b.X)
}

// changeRunner runs a change from the reference's stream entering its
// first layer: its own weights where it has them, else the reference's.
type changeRunner struct {
	runner
	ref   *prefixRunner
	first int
	own   map[int]*forward.Layer
}

func (c *changeRunner) Forward(ctx context.Context, tokens []int32) (eval.WindowLogits, error) {
	return one(c.ForwardBatch(ctx, [][]int32{tokens}))
}

// ForwardBatch runs the change over the windows the reference runs (the
// reference's pass must have been started on the same windows).
func (c *changeRunner) ForwardBatch(ctx context.Context, windows [][]int32) ([]eval.WindowLogits, error) {
	ref := c.ref
	at, refDone := ref.at, ref.done
	return c.start(windows, func() ([]float32, error) {
		<-refDone
		if ref.err != nil {
			return nil, ref.err
		}
		return c.run(ctx, at[c.first])
	}), nil
}

func (c *changeRunner) run(ctx context.Context, x0 []float32) ([]float32, error) {
	m := c.m
	b := &forward.Batch{Lens: c.lens, X: append([]float32(nil), x0...)}
	for i := c.first; i < m.Config.Layers; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		l, err := c.own[i], error(nil)
		if l == nil {
			l, err = m.Layer(i)
		}
		if err != nil {
			return nil, err
		}
		if err := l.Forward(b, nil); err != nil {
			return nil, err
		}
	}
	return m.FinalNorm(b.X)
}

// one is the single window of a batch of one.
func one(wl []eval.WindowLogits, err error) (eval.WindowLogits, error) {
	if err != nil {
		return nil, err
	}
	return wl[0], nil
}

// Windows cuts every sequence of set into windows of at most window
// tokens (eval.MaskedWindows), each labelled with its corpus and
// numbered by its sequence, and returns them with the corpus labels in
// order of first appearance. A token id outside the vocabulary is an
// error.
func Windows(set *dataset.Set, window int, cfg *model.Config) ([]eval.Window, []string, eval.MaskStats, error) {
	var (
		windows []eval.Window
		labels  []string
		stats   eval.MaskStats
	)
	seen := map[string]bool{}
	for i, s := range set.Sequences {
		if s.Label == eval.AllCorpus {
			return nil, nil, stats, fmt.Errorf("harness: corpus label %q is reserved for the row covering every corpus", s.Label)
		}
		if !seen[s.Label] {
			seen[s.Label] = true
			labels = append(labels, s.Label)
		}
		ws, st, err := eval.MaskedWindows(s.Label, []eval.Record{{Tokens: s.IDs, Mask: s.Mask}}, window)
		if err != nil {
			return nil, nil, stats, err
		}
		for k := range ws {
			ws[k].Record = i
		}
		stats.Split += st.Split
		stats.Unscorable += st.Unscorable
		windows = append(windows, ws...)
	}
	for i := range windows {
		if err := cfg.CheckTokens(windows[i].Tokens); err != nil {
			return nil, nil, stats, fmt.Errorf("harness: %s sequence %d %w", windows[i].Corpus, windows[i].Record, err)
		}
	}
	return windows, labels, stats, nil
}

// perExpert offers the routed experts of a source with fused expert
// tensors ("…experts.gate_up_proj" [E, 2I, H], "…experts.down_proj"
// [E, H, I]) under the per-expert names the forward pass substitutes
// ("…experts.E.gate_proj.weight", up_proj, down_proj), so that an overlay
// can replace one part of an expert and take the others from the source.
type perExpert struct{ src forward.WeightSource }

// locate maps a per-expert name to the fused tensor, the first element
// within it and the part's shape.
func (p perExpert) locate(name string) (fused string, off int64, shape []int64, ok bool) {
	i := strings.LastIndex(name, "experts.")
	if i < 0 {
		return "", 0, nil, false
	}
	num, part, _ := strings.Cut(name[i+len("experts."):], ".")
	e, err := strconv.Atoi(num)
	if err != nil || e < 0 {
		return "", 0, nil, false
	}
	kind := "gate_up_proj"
	if part == "down_proj.weight" {
		kind = "down_proj"
	} else if part != "gate_proj.weight" && part != "up_proj.weight" {
		return "", 0, nil, false
	}
	fused = name[:i] + "experts." + kind
	sh, ok := p.src.Shape(fused)
	if !ok || len(sh) != 3 || int64(e) >= sh[0] {
		return "", 0, nil, false
	}
	off = int64(e) * sh[1] * sh[2]
	shape = []int64{sh[1], sh[2]}
	if kind == "gate_up_proj" {
		if sh[1]%2 != 0 {
			return "", 0, nil, false
		}
		shape[0] /= 2
		if part == "up_proj.weight" {
			off += shape[0] * shape[1]
		}
	}
	return fused, off, shape, true
}

// Shape implements forward.WeightSource.
func (p perExpert) Shape(name string) ([]int64, bool) {
	_, _, sh, ok := p.locate(name)
	return sh, ok
}

// Read implements forward.WeightSource.
func (p perExpert) Read(name string, dst []float32, start int64) error {
	fused, off, sh, ok := p.locate(name)
	if !ok {
		return &forward.WeightError{Tensor: name, Problem: "missing"}
	}
	if start < 0 || start+int64(len(dst)) > sh[0]*sh[1] {
		return &forward.WeightError{Tensor: name, Problem: fmt.Sprintf("read of elements [%d, %d) outside its %d", start, start+int64(len(dst)), sh[0]*sh[1])}
	}
	return p.src.Read(fused, dst, off+start)
}
