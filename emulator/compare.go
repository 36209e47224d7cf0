package emulator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/safetensors"
)

// LogitsSource is a [tokens, vocab] matrix of logits read in row chunks.
type LogitsSource interface {
	// Shape returns the number of tokens (rows) and the vocabulary size.
	Shape() (tokens, vocab int)
	// ReadRows fills dst[:n*vocab] with rows [start, start+n).
	ReadRows(dst []float32, start, n int) error
	// Name identifies the source in error messages (a file and tensor).
	Name() string
}

// SafetensorsLogits reads a logits tensor of a safetensors file (BF16, F16
// or F32, shape [tokens, vocab] or [1, tokens, vocab]) through a section
// reader, a chunk of rows at a time, so that memory stays bounded by the
// chunk whatever the file size.
type SafetensorsLogits struct {
	file          *safetensors.File
	info          safetensors.TensorInfo
	sr            *io.SectionReader
	tokens, vocab int
	raw           []byte
}

// LogitsTensorName is the tensor name looked up by OpenLogits when none is
// given and the file holds more than one tensor.
const LogitsTensorName = "logits"

// OpenLogits prepares the logits tensor name of f for reading (name "" picks
// the tensor called "logits", or the file's only tensor).
func OpenLogits(f *safetensors.File, name string) (*SafetensorsLogits, error) {
	if name == "" {
		if _, ok := f.Lookup(LogitsTensorName); ok {
			name = LogitsTensorName
		} else if ts := f.Tensors(); len(ts) == 1 {
			name = ts[0].Name
		} else {
			return nil, fmt.Errorf("%s: no tensor named %q and %d tensors to choose from", f.Path(), LogitsTensorName, len(ts))
		}
	}
	info, ok := f.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", f.Path(), name)
	}
	switch info.DType {
	case safetensors.BF16, safetensors.F16, safetensors.F32:
	default:
		return nil, fmt.Errorf("%s: tensor %q is %v; logits must be BF16, F16 or F32", f.Path(), name, info.DType)
	}
	shape := info.Shape
	if len(shape) == 3 && shape[0] == 1 {
		shape = shape[1:]
	}
	if len(shape) != 2 || shape[0] <= 0 || shape[1] <= 0 {
		return nil, fmt.Errorf("%s: tensor %q has shape %v; logits must be [tokens, vocab] (or [1, tokens, vocab]) and non-empty", f.Path(), name, info.Shape)
	}
	const maxInt32 = 1<<31 - 1
	if shape[0] > maxInt32 || shape[1] > maxInt32 {
		return nil, fmt.Errorf("%s: tensor %q has shape %v, too large", f.Path(), name, info.Shape)
	}
	sr, err := f.SectionReader(name)
	if err != nil {
		return nil, err
	}
	return &SafetensorsLogits{file: f, info: info, sr: sr, tokens: int(shape[0]), vocab: int(shape[1])}, nil
}

// Shape implements LogitsSource.
func (l *SafetensorsLogits) Shape() (int, int) { return l.tokens, l.vocab }

// Name implements LogitsSource: the file path and tensor name.
func (l *SafetensorsLogits) Name() string { return l.file.Path() + ": tensor " + l.info.Name }

// ReadRows implements LogitsSource.
func (l *SafetensorsLogits) ReadRows(dst []float32, start, n int) error {
	if start < 0 || n < 0 || start+n > l.tokens || len(dst) < n*l.vocab {
		return fmt.Errorf("emulator: %s: rows [%d,%d) outside %d tokens or buffer too small", l.Name(), start, start+n, l.tokens)
	}
	w := int64(l.info.DType.Bits() / 8)
	size := int64(n) * int64(l.vocab) * w
	if int64(cap(l.raw)) < size {
		l.raw = make([]byte, size)
	}
	raw := l.raw[:size]
	if _, err := l.sr.ReadAt(raw, int64(start)*int64(l.vocab)*w); err != nil {
		return fmt.Errorf("%s: reading rows [%d,%d): %w", l.Name(), start, start+n, err)
	}
	return safetensors.DecodeFloat32s(dst[:n*l.vocab], raw, l.info.DType)
}

// CompareOptions tune CompareLogits. The zero value is usable.
type CompareOptions struct {
	// ChunkTokens is the number of token rows read at a time from each
	// source (default 16). Memory is about 3 chunks of both runs in float32.
	ChunkTokens int
	// Workers is the number of goroutines computing per-token metrics
	// (default GOMAXPROCS). Results do not depend on it.
	Workers int
	// Progress, when set, is called after each chunk with the number of
	// tokens done and the total.
	Progress func(done, total int)
}

// Validate reports a negative chunk size or worker count (0 selects the
// default).
func (o CompareOptions) Validate() error {
	if o.ChunkTokens < 0 || o.Workers < 0 {
		return fmt.Errorf("emulator: compare options: chunk of %d tokens and %d workers: neither may be negative", o.ChunkTokens, o.Workers)
	}
	return nil
}

// CompareLogits computes the quality table of a candidate run against a
// reference run over the same tokens: per corpus label (labels[i] for token
// i; nil for none) and overall, the tokens scored, the perplexity of each
// run over the tokens with a target (targets[i] is the id of the token
// following position i, negative for none; nil for no perplexity), ΔPPL %,
// top-1 agreement and mean KL(ref‖cand). Logits are streamed in chunks; the
// result is deterministic.
//
// It is long by design: one streaming loop over chunks of both runs whose
// accumulators must advance together.
func CompareLogits(ctx context.Context, ref, cand LogitsSource, targets []int64, labels []string, opt CompareOptions) ([]QualityRow, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	tokens, vocab := ref.Shape()
	ct, cv := cand.Shape()
	if ct != tokens || cv != vocab {
		return nil, fmt.Errorf("emulator: %s is [%d, %d] but %s is [%d, %d]; the runs must cover the same tokens and vocabulary",
			ref.Name(), tokens, vocab, cand.Name(), ct, cv)
	}
	if targets != nil && len(targets) != tokens {
		return nil, fmt.Errorf("emulator: %d targets for %d tokens", len(targets), tokens)
	}
	if labels != nil && len(labels) != tokens {
		return nil, fmt.Errorf("emulator: %d corpus labels for %d tokens", len(labels), tokens)
	}
	for i, t := range targets {
		if t >= int64(vocab) {
			return nil, fmt.Errorf("emulator: target %d of token %d is outside the vocabulary of %d", t, i, vocab)
		}
	}
	chunk := opt.ChunkTokens
	if chunk <= 0 {
		chunk = 16
	}
	workers := opt.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}

	type batch struct {
		start, n  int
		ref, cand []float32
		err       error
	}
	// A reader goroutine fills batches from a pool of three while the
	// previous one is being scored.
	pool := make(chan *batch, 3)
	for range 3 {
		pool <- &batch{ref: make([]float32, chunk*vocab), cand: make([]float32, chunk*vocab)}
	}
	ready := make(chan *batch, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(ready)
		for start := 0; start < tokens; start += chunk {
			var b *batch
			select {
			case b = <-pool:
			case <-rctx.Done():
				return
			}
			b.start, b.n = start, min(chunk, tokens-start)
			b.err = ref.ReadRows(b.ref, b.start, b.n)
			if b.err == nil {
				b.err = cand.ReadRows(b.cand, b.start, b.n)
			}
			select {
			case ready <- b:
			case <-rctx.Done():
				return
			}
			if b.err != nil {
				return
			}
		}
	}()

	names := []string{cand.Name()}
	sc, err := eval.NewScorer(vocab, names, eval.ScorerOptions{Workers: workers, All: OverallLabel})
	if err != nil {
		return nil, err
	}
	tgt := make([]int32, chunk)
	done := 0
	for b := range ready {
		if b.err != nil {
			return nil, b.err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		batch := eval.Batch{Ref: b.ref[:b.n*vocab], Cands: [][]float32{b.cand[:b.n*vocab]}}
		if targets != nil {
			for i := 0; i < b.n; i++ {
				tgt[i] = int32(max(targets[b.start+i], -1))
			}
			batch.Targets = tgt[:b.n]
		}
		if labels != nil {
			batch.Corpus = labels[b.start : b.start+b.n]
		}
		if err := sc.Score(batch); err != nil {
			var pe *eval.PositionError
			if errors.As(err, &pe) {
				return nil, fmt.Errorf("emulator: token %d: %w (reference %s, candidate %s)", pe.Position, pe.Err, ref.Name(), cand.Name())
			}
			return nil, fmt.Errorf("emulator: %w", err)
		}
		done += b.n
		if opt.Progress != nil {
			opt.Progress(done, tokens)
		}
		pool <- b
	}
	if done != tokens {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("emulator: read %d of %d tokens", done, tokens)
	}
	return sc.Accumulator().Rows(0), nil
}
