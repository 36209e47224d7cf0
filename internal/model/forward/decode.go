package forward

// Decoder continues one sequence a few tokens at a time with a Cache: the
// convolution tails and delta-rule states of the Gated DeltaNet layers and
// the keys and values of the attention layers. Its logits agree with a
// forward pass over the whole sequence: a segment of several tokens runs
// the chunked delta rule from the cached state, a single token the
// recurrent step (the two differ by float32 rounding only); attention is
// bit-identical.
type Decoder struct {
	m     *Model
	cache *Cache
	pos   int
}

// NewDecoder starts an empty sequence. The model's layers become resident.
func (m *Model) NewDecoder() *Decoder {
	m.Resident = true
	return &Decoder{m: m, cache: NewCache(m.Config)}
}

// Pos is the number of tokens fed so far.
func (d *Decoder) Pos() int { return d.pos }

// Feed appends ids to the sequence and hands the logits of their positions
// to f (row r predicts the token after ids[r]).
func (d *Decoder) Feed(ids []int32, f LogitsFunc) error {
	if len(ids) == 0 {
		return nil
	}
	x, err := d.m.Embed(ids)
	if err != nil {
		return err
	}
	b := &Batch{Lens: []int{len(ids)}, X: x, Caches: []*Cache{d.cache}}
	if err := d.m.Trunk(b, nil, nil); err != nil {
		return err
	}
	d.pos += len(ids)
	hf, err := d.m.FinalNorm(b.X)
	if err != nil {
		return err
	}
	return d.m.Logits(hf, f)
}
