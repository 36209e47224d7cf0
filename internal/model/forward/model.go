package forward

import (
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/ttquant/ttquant/internal/kernels"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/model/ffn"
	"github.com/ttquant/ttquant/safetensors"
)

// LogitChunk is the number of positions whose logits are computed and
// handed out together: the largest logit buffer is LogitChunk × Vocab.
const LogitChunk = 64

// Model is a Qwen3.5/3.6/Qwen3-Next text model over a WeightSource. Layers
// are read from the source when they run; with Resident set they are kept
// after their first use (for small models, decoding and repeated
// evaluation).
type Model struct {
	Config *model.Config
	Src    WeightSource
	// Resident keeps every layer's weights once loaded.
	Resident bool
	// Linears, when not nil, supplies the products of the weight matrices
	// (projections, MLPs, experts, LM head) instead of float32 matmuls,
	// and KV, when not nil, rounds the keys and values of full-attention
	// layers as their cache stores them. Set them before the first layer
	// runs: a layer keeps the ones it was loaded with.
	Linears Linears
	KV      KVStore

	closer io.Closer

	mu        sync.Mutex
	layers    map[int]*Layer
	finalNorm []float32
	lm        lmHead
	mtp       *mtpWeights
}

// lmHead is what a Model holds of its LM head: the float32 values, read on
// first use, and the packing for the kernels that the first float32
// Logits call makes. Without Linears the packing replaces the values in
// memory (state headPacked).
type lmHead struct {
	state  headState
	w      []float32          // held in headRead
	packed *kernels.PackedB32 // made by packedHead, then held in either state
}

// headState says which form of the LM head a Model holds.
type headState uint8

const (
	headUnread headState = iota // nothing read yet
	headRead                    // the float32 values (and, with Linears, the packing once made)
	headPacked                  // the packing alone: the values were dropped when it was made
)

type mtpWeights struct {
	fc               []float32 // [H, 2H]
	normEmb, normHid []float32
	norm             []float32
}

// Open reads dir/config.json and the checkpoint in dir, and checks that
// every tensor the forward pass needs is present with the right shape.
func Open(dir string) (*Model, error) {
	cfg, err := model.ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	sm, err := safetensors.OpenModel(dir)
	if err != nil {
		return nil, fmt.Errorf("forward: %w", err)
	}
	m, err := New(cfg, NewCheckpoint(sm))
	if err != nil {
		sm.Close()
		return nil, err
	}
	m.closer = sm
	return m, nil
}

// New returns a model over src and checks src's tensor names and shapes
// (no tensor data is read).
//
// The trunk prefix follows the checkpoint: a config without text_config
// may still come with "model.language_model." names (and a nested one with
// "model." names in a text-only export); whichever prefix the embedding is
// found under is used.
func New(cfg *model.Config, src WeightSource) (*Model, error) {
	for _, p := range []string{cfg.Prefix, "model.language_model.", "model."} {
		if _, ok := src.Shape(p + "embed_tokens.weight"); ok {
			if p != cfg.Prefix {
				c := *cfg
				c.Prefix = p
				cfg = &c
			}
			break
		}
	}
	m := &Model{Config: cfg, Src: src, layers: map[int]*Layer{}}
	if err := m.Check(); err != nil {
		return nil, err
	}
	return m, nil
}

// Close releases the checkpoint opened by Open.
func (m *Model) Close() error {
	if m.closer != nil {
		return m.closer.Close()
	}
	return nil
}

func (m *Model) embedName() string { return m.Config.Prefix + "embed_tokens.weight" }

func (m *Model) lmHeadName() string {
	if m.Config.TieEmbeddings {
		return m.embedName()
	}
	if _, ok := m.Src.Shape("lm_head.weight"); !ok {
		return m.embedName()
	}
	return "lm_head.weight"
}

// Check verifies the presence and shape of every tensor of the trunk, the
// head and (when the config has them) the MTP layers, from headers alone.
func (m *Model) Check() error {
	c := m.Config
	V, H := int64(c.Vocab), int64(c.Hidden)
	if err := checkShape(m.Src, m.embedName(), V, H); err != nil {
		return err
	}
	if err := checkShape(m.Src, m.lmHeadName(), V, H); err != nil {
		return err
	}
	if err := checkShape(m.Src, c.Prefix+"norm.weight", H); err != nil {
		return err
	}
	for i := 0; i < c.NumLayers(); i++ {
		if err := CheckLayer(m.Src, c, i); err != nil {
			return err
		}
	}
	if c.MTPLayers > 0 {
		if err := checkShape(m.Src, "mtp.fc.weight", H, 2*H); err != nil {
			return err
		}
		for _, n := range []string{"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"} {
			if err := checkShape(m.Src, n, H); err != nil {
				return err
			}
		}
	}
	return nil
}

// CheckFinite reads every weight once and reports the first NaN or
// infinity, naming the tensor. It costs one pass over the checkpoint.
func (m *Model) CheckFinite() error {
	c := m.Config
	for _, n := range []string{m.embedName(), m.lmHeadName()} {
		if _, err := readTensor(m.Src, n, int64(c.Vocab), int64(c.Hidden)); err != nil {
			return err
		}
	}
	for i := 0; i < c.NumLayers(); i++ {
		l, err := LoadLayer(m.Src, c, i)
		if err != nil {
			return err
		}
		if l.MoE != nil {
			for e := 0; e < c.Experts; e++ {
				if _, err := l.MoE.Experts.Expert(e); err != nil {
					return err
				}
			}
		}
	}
	if _, err := m.head(); err != nil {
		return err
	}
	if c.MTPLayers > 0 {
		if _, err := m.mtpWeights(); err != nil {
			return err
		}
	}
	return nil
}

// Layer returns layer i's weights, from the resident set or read now.
func (m *Model) Layer(i int) (*Layer, error) {
	m.mu.Lock()
	l := m.layers[i]
	m.mu.Unlock()
	if l != nil {
		return l, nil
	}
	l, err := LoadLayer(m.Src, m.Config, i)
	if err != nil {
		return nil, err
	}
	l.lin, l.kv = m.Linears, m.KV
	if m.Resident {
		m.mu.Lock()
		m.layers[i] = l
		m.mu.Unlock()
	}
	return l, nil
}

// Embed returns the embedding rows of ids, [len(ids), Hidden], reading
// only those rows.
func (m *Model) Embed(ids []int32) ([]float32, error) {
	H, V := m.Config.Hidden, m.Config.Vocab
	x := make([]float32, len(ids)*H)
	name := m.embedName()
	for t, id := range ids {
		if id < 0 || int(id) >= V {
			return nil, fmt.Errorf("forward: token %d at position %d outside the vocabulary 0..%d", id, t, V-1)
		}
		row := x[t*H : (t+1)*H]
		if err := m.Src.Read(name, row, int64(id)*int64(H)); err != nil {
			return nil, err
		}
		if err := checkFinite(name, row, int64(id)*int64(H)); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// head returns the LM head's float32 values, with the final norm: read on
// first use and kept, or read again (and not kept) when the packing has
// replaced them.
func (m *Model) head() ([]float32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.headLocked()
}

func (m *Model) headLocked() ([]float32, error) {
	if m.lm.state == headRead {
		return m.lm.w, nil
	}
	if err := m.normLocked(); err != nil {
		return nil, err
	}
	c := m.Config
	w, err := readTensor(m.Src, m.lmHeadName(), int64(c.Vocab), int64(c.Hidden))
	if err != nil {
		return nil, err
	}
	if m.lm.state == headUnread {
		m.lm.state, m.lm.w = headRead, w
	}
	return w, nil
}

// normLocked reads the final norm on first use; m.mu is held.
func (m *Model) normLocked() error {
	if m.finalNorm != nil {
		return nil
	}
	fn, err := readTensor(m.Src, m.Config.Prefix+"norm.weight", int64(m.Config.Hidden))
	if err != nil {
		return err
	}
	m.finalNorm = fn
	return nil
}

// packedHead returns the float32 LM head packed for kernels.SgemmPacked,
// packed on first use from the head's values, which are then dropped
// (headPacked) unless Linears may ask for them at every call: the packing
// replaces them in memory (both are held while it is made). Every float32
// Logits call reads the packing instead of repacking the head inside its
// products, which for the few rows of a decoding step or an evaluation
// chunk cost several times the arithmetic.
func (m *Model) packedHead() (*kernels.PackedB32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lm.packed != nil {
		return m.lm.packed, nil
	}
	w, err := m.headLocked()
	if err != nil {
		return nil, err
	}
	H, V := m.Config.Hidden, m.Config.Vocab
	m.lm.packed = kernels.PackB32(true, H, V, w, H)
	if m.Linears == nil {
		m.lm.state, m.lm.w = headPacked, nil
	}
	return m.lm.packed, nil
}

// BatchRows is the rows of one forward batch of a long job (whole
// sequences or windows, at least one per batch) — the calibration walks
// and the evaluation: it bounds the activations a layer holds at once, and
// each layer's weights are read once per batch. The forward pass gives
// every row the same bits whatever batch it is in
// (TestBatchRowsSameBytes in calib/textcalib, TestBatchedEvaluationSameTable
// in emulator/eval/harness), so it does not change what is computed.
const BatchRows = 8192

// Trunk runs the decoder layers 0..Layers-1 over the batch, one layer's
// weights at a time; b.X enters as the embeddings and leaves as the last
// layer's residual stream (before the final norm). hook sees every
// calibration site; after, when not nil, is called after each layer with
// the residual stream leaving it.
func (m *Model) Trunk(b *Batch, hook Hook, after func(layer int, x []float32) error) error {
	for i := 0; i < m.Config.Layers; i++ {
		l, err := m.Layer(i)
		if err != nil {
			return err
		}
		if err := l.Forward(b, hook); err != nil {
			return err
		}
		if after != nil {
			if err := after(i, b.X); err != nil {
				return err
			}
		}
	}
	return nil
}

// FinalNorm returns the final RMSNorm of rows of x: the vectors the LM head
// and the MTP head read.
func (m *Model) FinalNorm(x []float32) ([]float32, error) {
	m.mu.Lock()
	err := m.normLocked()
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(x))
	rmsNormZC(out, x, m.Config.Hidden, m.finalNorm, m.Config.Eps)
	return out, nil
}

// LogitsFunc receives the logits of rows row0..row0+rows-1, [rows, Vocab];
// the slice is reused after the call returns.
type LogitsFunc func(row0, rows int, logits []float32) error

// Logits computes hf · lm_headᵀ for the rows of hf (already final-normed),
// LogitChunk rows at a time, never holding more than one chunk of logits.
// In float32 it uses the head packed once for the Model (packedHead).
func (m *Model) Logits(hf []float32, f LogitsFunc) error {
	H, V := m.Config.Hidden, m.Config.Vocab
	n := len(hf) / H
	hp, err := m.headProduct()
	if err != nil {
		return err
	}
	buf := make([]float32, min(n, LogitChunk)*V)
	for r0 := 0; r0 < n; r0 += LogitChunk {
		rows := min(LogitChunk, n-r0)
		lg := buf[:rows*V]
		if err := hp.mul(lg, hf[r0*H:(r0+rows)*H], rows, H, V); err != nil {
			return err
		}
		if err := f(r0, rows, lg); err != nil {
			return err
		}
	}
	return nil
}

// LogitRows sets dst, [rows, Vocab], to the logits of the rows of hf
// (already final-normed) in one product. The float32 product reads the
// whole packed head once per call, so a caller that fetches logits a few
// positions at a time does better to ask for more rows at once, its
// memory bounded by the rows it asks for.
func (m *Model) LogitRows(dst, hf []float32) error {
	H, V := m.Config.Hidden, m.Config.Vocab
	rows := len(hf) / H
	if len(hf) != rows*H || len(dst) != rows*V {
		return fmt.Errorf("forward: logits of %d hidden values into %d: want whole rows of %d and %d", len(hf), len(dst), H, V)
	}
	hp, err := m.headProduct()
	if err != nil {
		return err
	}
	return hp.mul(dst, hf, rows, H, V)
}

// headProduct is the LM head's product: the Linears' (p), or the float32
// head packed once for the Model.
type headProduct struct {
	p      Linear
	packed *kernels.PackedB32
}

// headProduct asks the Linears for the LM head's product, or packs the
// float32 head on first use.
func (m *Model) headProduct() (headProduct, error) {
	var hp headProduct
	if m.Linears != nil {
		lm, err := m.head()
		if err != nil {
			return hp, err
		}
		H, V := m.Config.Hidden, m.Config.Vocab
		lw := &LinearWeight{Layer: -1, Role: RoleLMHead, Expert: -1, Out: V, In: H, Rows: linearRows(m.lmHeadName(), V), W: lm}
		if hp.p, err = m.Linears.Linear(lw); err != nil {
			return hp, fmt.Errorf("forward: %s: %w", lw.Name(), err)
		}
	}
	if hp.p == nil {
		var err error
		hp.packed, err = m.packedHead()
		return hp, err
	}
	return hp, nil
}

// mul sets dst (rows × V) to the logits of the rows × H hidden states hf.
func (hp headProduct) mul(dst, hf []float32, rows, H, V int) error {
	if hp.packed != nil {
		kernels.SgemmPacked(false, rows, 1, hf, H, hp.packed, 0, dst, V)
		return nil
	}
	return hp.p.MatMulT(dst, V, hf, rows)
}

// mtpWeights returns the MTP head's own tensors, read on first use.
func (m *Model) mtpWeights() (*mtpWeights, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mtp != nil {
		return m.mtp, nil
	}
	c := m.Config
	if c.MTPLayers == 0 {
		return nil, fmt.Errorf("forward: the model has no MTP layers (mtp_num_hidden_layers is 0)")
	}
	H := int64(c.Hidden)
	w := &mtpWeights{}
	var err error
	if w.fc, err = readTensor(m.Src, "mtp.fc.weight", H, 2*H); err != nil {
		return nil, err
	}
	if w.normEmb, err = readTensor(m.Src, "mtp.pre_fc_norm_embedding.weight", H); err != nil {
		return nil, err
	}
	if w.normHid, err = readTensor(m.Src, "mtp.pre_fc_norm_hidden.weight", H); err != nil {
		return nil, err
	}
	if w.norm, err = readTensor(m.Src, "mtp.norm.weight", H); err != nil {
		return nil, err
	}
	m.mtp = w
	return w, nil
}

// MTPInput builds the MTP layer's input rows for one sequence: for slot t
// (0..T-2), fc(concat(RMSNorm(E[ids[t+1]]), RMSNorm(hf[t]))), with hf the
// trunk's final-normed hidden states [T, Hidden].
func (m *Model) MTPInput(ids []int32, hf []float32) ([]float32, error) {
	w, err := m.mtpWeights()
	if err != nil {
		return nil, err
	}
	H := m.Config.Hidden
	n := len(ids) - 1
	if n <= 0 {
		return nil, nil
	}
	if len(hf) < n*H {
		return nil, fmt.Errorf("forward: MTP input: %d hidden values for %d slots", len(hf), n)
	}
	e, err := m.Embed(ids[1:])
	if err != nil {
		return nil, err
	}
	cat := make([]float32, n*2*H)
	tmp := make([]float32, H)
	for t := 0; t < n; t++ {
		rmsNormZC(cat[t*2*H:t*2*H+H], e[t*H:(t+1)*H], H, w.normEmb, m.Config.Eps)
		rmsNormZC(tmp, hf[t*H:(t+1)*H], H, w.normHid, m.Config.Eps)
		copy(cat[t*2*H+H:(t+1)*2*H], tmp)
	}
	z := make([]float32, n*H)
	ffn.MatMulT(z, H, cat, n, 2*H, w.fc, H)
	return z, nil
}

// MTPInputs is MTPInput over the trunk's output stream x of several
// sequences, one after another (sequence s has len(ids[s]) rows, not yet
// final-normed): the MTP layer's input rows, len(ids[s])−1 per sequence,
// in the same order.
func (m *Model) MTPInputs(ids [][]int32, x []float32) ([]float32, error) {
	H := m.Config.Hidden
	out := make([]float32, 0, max(0, len(x)-len(ids)*H)) // one row fewer a sequence
	row := 0
	for _, q := range ids {
		if (row+len(q))*H > len(x) {
			return nil, fmt.Errorf("forward: MTP inputs: the stream holds %d rows, the sequences %d or more", len(x)/H, row+len(q))
		}
		hf, err := m.FinalNorm(x[row*H : (row+len(q))*H])
		if err != nil {
			return nil, err
		}
		z, err := m.MTPInput(q, hf)
		if err != nil {
			return nil, err
		}
		out = append(out, z...)
		row += len(q)
	}
	return out, nil
}

// MTPHead runs MTP layer 0 over a batch of MTP input rows (see MTPInput;
// slot t at position t) and returns the rows after mtp.norm, ready for
// Logits.
func (m *Model) MTPHead(b *Batch, hook Hook) ([]float32, error) {
	w, err := m.mtpWeights()
	if err != nil {
		return nil, err
	}
	l, err := m.Layer(m.Config.Layers)
	if err != nil {
		return nil, err
	}
	if err := l.Forward(b, hook); err != nil {
		return nil, err
	}
	out := make([]float32, len(b.X))
	rmsNormZC(out, b.X, m.Config.Hidden, w.norm, m.Config.Eps)
	return out, nil
}

// LogSoftmaxAt returns log p(target) of one logit row, computed with a
// max-subtracted float64 log-sum-exp over the whole row, and the row's
// argmax (the lowest index among equal maxima).
func LogSoftmaxAt(row []float32, target int) (logp float64, argmax int) {
	mx := float32(math.Inf(-1))
	for i, v := range row {
		if v > mx {
			mx, argmax = v, i
		}
	}
	var s float64
	for _, v := range row {
		s += math.Exp(float64(v) - float64(mx))
	}
	return float64(row[target]) - float64(mx) - math.Log(s), argmax
}
