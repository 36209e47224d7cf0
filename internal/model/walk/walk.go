// Package walk steps the residual stream of a set of calibration
// sequences through a model's layers, one layer at a time: the token ids
// checked against the vocabulary, the stream embedded, each layer's rows
// (one fewer per sequence for the MTP layer, whose input forward.MTPInputs
// builds), the layer run over the stream in batches of whole sequences,
// and the rows of one site collected.
//
// Dir keeps what an interrupted walk needs to resume at its first
// unfinished layer: the walk's inputs (Inputs, and Inputs.Diff naming what
// changed since), one record per finished layer with the caller's data
// and the residual streams leaving it, all written through
// internal/atomicfile. Calibration from text (calib/textcalib) and the
// sequential GPTQ build (manifest/build) both walk with it.
//
// The package links neither the calibration, nor the quantizer, nor the
// checkpoint format.
package walk

import (
	"context"
	"errors"
	"fmt"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/forward"
)

// Walk is a set of calibration sequences walked through a model.
type Walk struct {
	Config *model.Config
	IDs    [][]int32
	// Tokens is the total length of the sequences.
	Tokens int64
	// MaxRows bounds the rows of one forward batch (whole sequences, at
	// least one per batch); 0 runs every sequence in one batch.
	MaxRows int
}

// New checks every token id against the model's vocabulary and returns
// the walk of ids.
func New(cfg *model.Config, ids [][]int32, maxRows int) (*Walk, error) {
	w := &Walk{Config: cfg, IDs: ids, MaxRows: maxRows}
	for i, s := range ids {
		if err := cfg.CheckTokens(s); err != nil {
			return nil, fmt.Errorf("sequence %d %w", i, err)
		}
		w.Tokens += int64(len(s))
	}
	return w, nil
}

// Select returns the walk of the sequences seqs of w (indices into
// w.IDs, in the order given), with w's batch bound: a worker of a split
// build walks its own sequences only.
func (w *Walk) Select(seqs []int) *Walk {
	out := &Walk{Config: w.Config, IDs: make([][]int32, len(seqs)), MaxRows: w.MaxRows}
	for i, s := range seqs {
		out.IDs[i] = w.IDs[s]
		out.Tokens += int64(len(w.IDs[s]))
	}
	return out
}

// Layers is the number of layers a walk runs: the trunk, then the first
// MTP layer when the model has one (the forward pass runs no other).
func (w *Walk) Layers() int {
	if w.Config.MTPLayers > 0 {
		return w.Config.Layers + 1
	}
	return w.Config.Layers
}

// IsMTP reports whether layer l is the MTP layer.
func (w *Walk) IsMTP(l int) bool { return l >= w.Config.Layers }

// Lens returns the rows of every sequence entering layer l: its tokens for
// a trunk layer, one fewer for the MTP layer (the last token has no next
// token to predict).
func (w *Walk) Lens(l int) []int {
	out := make([]int, len(w.IDs))
	for i, q := range w.IDs {
		out[i] = len(q)
		if w.IsMTP(l) {
			out[i] = max(len(q)-1, 0)
		}
	}
	return out
}

// Rows is the sum of lens.
func Rows(lens []int) int {
	n := 0
	for _, x := range lens {
		n += x
	}
	return n
}

// Embed returns the embedding rows of every sequence of ids, in order.
func Embed(m *forward.Model, ids [][]int32) ([]float32, error) {
	n := 0
	for _, q := range ids {
		n += len(q)
	}
	x := make([]float32, 0, n*m.Config.Hidden)
	for _, q := range ids {
		e, err := m.Embed(q)
		if err != nil {
			return nil, err
		}
		x = append(x, e...)
	}
	return x, nil
}

// Enter returns the rows entering layer l from the stream x leaving the
// layer before it, for the sequences ids: x itself for a trunk layer; for
// the MTP layer the final hidden state at t joined with the embedding of
// token t+1 (forward.Model.MTPInputs).
func (w *Walk) Enter(m *forward.Model, l int, ids [][]int32, x []float32) ([]float32, error) {
	if !w.IsMTP(l) {
		return x, nil
	}
	return m.MTPInputs(ids, x)
}

// Batches splits sequences of the given row counts into consecutive
// groups [first, end) of at most maxRows rows (at least one sequence
// each); maxRows ≤ 0 gives one group.
func Batches(lens []int, maxRows int) [][2]int {
	if maxRows <= 0 {
		if len(lens) == 0 {
			return nil
		}
		return [][2]int{{0, len(lens)}}
	}
	var out [][2]int
	for i := 0; i < len(lens); {
		j, rows := i, 0
		for j < len(lens) && (j == i || rows+lens[j] <= maxRows) {
			rows += lens[j]
			j++
		}
		out = append(out, [2]int{i, j})
		i = j
	}
	return out
}

// Each runs f over the rows x of sequences of lengths lens in place, batch
// by batch; row0 is the first row of the batch in x.
func (w *Walk) Each(ctx context.Context, x []float32, lens []int, f func(b *forward.Batch, row0 int) error) error {
	H := w.Config.Hidden
	row := 0
	for _, c := range Batches(lens, w.MaxRows) {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := Rows(lens[c[0]:c[1]])
		if err := f(&forward.Batch{Lens: lens[c[0]:c[1]], X: x[row*H : (row+n)*H]}, row); err != nil {
			return err
		}
		row += n
	}
	return nil
}

// errCollected ends a forward pass once the wanted rows are in.
var errCollected = errors.New("walk: rows collected")

// Collect runs layer fl over a copy of x (sequences of lengths lens) up to
// its MLP input and returns the rows of site for every sequence, and
// their width.
func (w *Walk) Collect(ctx context.Context, fl *forward.Layer, x []float32, lens []int, site forward.Site) ([]float32, int, error) {
	var out []float32
	cols := 0
	err := w.Each(ctx, x, lens, func(b *forward.Batch, base int) error {
		b.X = append([]float32(nil), b.X...)
		err := fl.Forward(b, func(a *forward.Activations) error {
			if a.Site == site {
				if cols == 0 {
					cols = a.Cols
					out = make([]float32, Rows(lens)*cols)
				}
				if a.Cols != cols {
					return fmt.Errorf("site %s has %d columns, then %d", site, cols, a.Cols)
				}
				copy(out[(base+a.Row0)*cols:], a.X[:a.Rows*cols])
			}
			if a.Site == forward.SiteMLPIn {
				return errCollected
			}
			return nil
		})
		if errors.Is(err, errCollected) {
			return nil
		}
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	if cols == 0 {
		return nil, 0, fmt.Errorf("the layer produced no %s activations", site)
	}
	return out, cols, nil
}

// MLPInput returns the MLP block's input rows of every sequence: the
// post-attention norm of the stream x, which fl's mixer has already
// advanced (forward.Layer.ForwardMixer).
func (w *Walk) MLPInput(ctx context.Context, fl *forward.Layer, x []float32, lens []int) ([]float32, error) {
	H := w.Config.Hidden
	out := make([]float32, 0, len(x))
	err := w.Each(ctx, x, lens, func(b *forward.Batch, _ int) error {
		err := fl.ForwardMLP(b, func(a *forward.Activations) error {
			if a.Site == forward.SiteMLPIn {
				out = append(out, a.X[:a.Rows*H]...)
				return errCollected
			}
			return nil
		})
		if errors.Is(err, errCollected) {
			return nil
		}
		if err == nil {
			return errors.New("the layer produced no MLP input")
		}
		return err
	})
	return out, err
}
