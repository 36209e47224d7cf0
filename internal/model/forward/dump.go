package forward

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"

	"github.com/ttquant/ttquant/safetensors"
)

// Prediction is one candidate next token.
type Prediction struct {
	ID    int32   `json:"id"`
	Logit float32 `json:"logit"`
	Prob  float64 `json:"prob"`
}

// TopK returns the k most probable entries of one logit row, best first
// (ties: lower id first), with softmax probabilities over the whole row.
func TopK(row []float32, k int) []Prediction {
	mx := math.Inf(-1)
	for _, v := range row {
		mx = max(mx, float64(v))
	}
	var s float64
	for _, v := range row {
		s += math.Exp(float64(v) - mx)
	}
	idx := make([]int, len(row))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return row[idx[a]] > row[idx[b]] })
	k = min(k, len(row))
	out := make([]Prediction, k)
	for i := range out {
		v := row[idx[i]]
		out[i] = Prediction{ID: int32(idx[i]), Logit: v, Prob: math.Exp(float64(v)-mx) / s}
	}
	return out
}

// Generate feeds prompt to a fresh decoder and continues it greedily for n
// tokens. It returns the top-k predictions after the prompt and the
// continuation.
func (m *Model) Generate(prompt []int32, k, n int) ([]Prediction, []int32, error) {
	if len(prompt) == 0 {
		return nil, nil, fmt.Errorf("forward: empty prompt")
	}
	d := m.NewDecoder()
	V := m.Config.Vocab
	var last []float32
	keep := func(row0, rows int, lg []float32) error {
		last = append(last[:0], lg[(rows-1)*V:rows*V]...)
		return nil
	}
	if err := d.Feed(prompt, keep); err != nil {
		return nil, nil, err
	}
	top := TopK(last, k)
	var cont []int32
	for i := 0; i < n; i++ {
		_, am := LogSoftmaxAt(last, 0)
		cont = append(cont, int32(am))
		if i == n-1 {
			break
		}
		if err := d.Feed([]int32{int32(am)}, keep); err != nil {
			return nil, nil, err
		}
	}
	return top, cont, nil
}

// DumpOptions says what WriteDumps writes.
type DumpOptions struct {
	LogitsPath string // tensor "logits" F32 [T, V]; "" for none
	MTP        bool   // also "mtp_logits" F32 [T-1, V] in LogitsPath
	LayersPath string // tensors "embed" and "layer.N" F32 [T, H]; "" for none
}

// Validate reports options that ask for nothing, or for MTP logits without
// a file to hold them.
func (o DumpOptions) Validate() error {
	switch {
	case o.MTP && o.LogitsPath == "":
		return fmt.Errorf("forward: MTP logits go beside the logits: they need a logits file")
	case o.LogitsPath == "" && o.LayersPath == "":
		return fmt.Errorf("forward: no dump asked for (neither logits nor layers)")
	}
	return nil
}

// WriteDumps runs the full forward over one sequence from empty state and
// writes the requested safetensors files. Logits are computed and written
// LogitChunk rows at a time.
func (m *Model) WriteDumps(ids []int32, opt DumpOptions) error {
	c := m.Config
	T, H, V := len(ids), c.Hidden, c.Vocab
	if T == 0 {
		return fmt.Errorf("forward: no tokens")
	}
	if err := opt.Validate(); err != nil {
		return err
	}
	if opt.MTP && c.MTPLayers == 0 {
		return fmt.Errorf("forward: --mtp: the model has no MTP layer")
	}
	x, err := m.Embed(ids)
	if err != nil {
		return err
	}
	var layers [][]float32
	if opt.LayersPath != "" {
		layers = append(layers, append([]float32(nil), x...))
	}
	b := &Batch{Lens: []int{T}, X: x}
	err = m.Trunk(b, nil, func(_ int, x []float32) error {
		if opt.LayersPath != "" {
			layers = append(layers, append([]float32(nil), x...))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if opt.LayersPath != "" {
		var ts []safetensors.Tensor
		for i, v := range layers {
			name := "embed"
			if i > 0 {
				name = "layer." + strconv.Itoa(i-1)
			}
			ts = append(ts, safetensors.Tensor{Name: name, DType: safetensors.F32, Shape: []int64{int64(T), int64(H)}, Data: f32Bytes(v)})
		}
		if err := safetensors.WriteFile(opt.LayersPath, ts, map[string]string{"format": "pt"}); err != nil {
			return err
		}
	}
	if opt.LogitsPath == "" {
		return nil
	}
	hf, err := m.FinalNorm(b.X)
	if err != nil {
		return err
	}
	var mtpRows []float32
	if opt.MTP && T > 1 {
		z, err := m.MTPInput(ids, hf)
		if err != nil {
			return err
		}
		if mtpRows, err = m.MTPHead(&Batch{Lens: []int{T - 1}, X: z}, nil); err != nil {
			return err
		}
	}
	w, err := safetensors.Create(opt.LogitsPath)
	if err != nil {
		return err
	}
	stream := func(rows []float32) func(io.Writer) error {
		return func(dst io.Writer) error {
			return m.Logits(rows, func(_, _ int, lg []float32) error {
				_, err := dst.Write(f32Bytes(lg))
				return err
			})
		}
	}
	w.SetMetadata(map[string]string{"format": "pt"})
	if err := w.AddFunc("logits", safetensors.F32, []int64{int64(T), int64(V)}, int64(T)*int64(V)*4, stream(hf)); err != nil {
		w.Abort()
		return err
	}
	if opt.MTP {
		if err := w.AddFunc("mtp_logits", safetensors.F32, []int64{int64(T - 1), int64(V)}, int64(T-1)*int64(V)*4, stream(mtpRows)); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Close()
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
