package dataset

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"

	"github.com/ttquant/ttquant/internal/text/tokenizer"
)

// Mode is how a set's sequences are cut from records. The zero value is
// ModePack.
type Mode string

const (
	// ModePack concatenates records (each followed by the separator token)
	// and cuts the stream into sequences of exactly SeqLen tokens; the
	// tail is dropped.
	ModePack Mode = "pack"
	// ModeRecord makes one sequence of each record, truncated to SeqLen;
	// shorter records are handled as Short says.
	ModeRecord Mode = "record"
)

// Short is what ModeRecord does with a record shorter than SeqLen. The zero
// value is ShortKeep.
type Short string

const (
	ShortKeep Short = "keep" // a shorter sequence
	ShortPad  Short = "pad"  // padded with the tokenizer's PAD id, mask false
	ShortSkip Short = "skip" // the record is not used
)

// SetOptions shape one set of sequences.
type SetOptions struct {
	Sequences int   `json:"sequences"` // N; 0: the set is not built (unless AllRecords)
	SeqLen    int   `json:"seq_len"`   // L
	Mode      Mode  `json:"mode,omitempty"`
	Short     Short `json:"short,omitempty"`
	// AllRecords makes one sequence of every record of the set's share,
	// whole (ModeRecord without truncation): Sequences and SeqLen are
	// then 0. It scores a file kept for evaluation as it is.
	AllRecords bool `json:"all_records,omitempty"`
}

// Requested reports whether the set is to be built.
func (so SetOptions) Requested() bool { return so.Sequences > 0 || so.AllRecords }

// Options of Build. The zero value builds nothing.
type Options struct {
	Calibration SetOptions `json:"calibration"`
	Evaluation  SetOptions `json:"evaluation"`
	// EvalFraction is the share of records held out for evaluation,
	// chosen by a seeded hash of each record's content. Zero means
	// DefaultEvalFraction; it applies even when no evaluation set is
	// built, so that a later evaluation run with the same spec, seed and
	// fraction never sees a calibration record. 1 (every record is an
	// evaluation record) is allowed when no calibration set is built: text
	// held out for evaluation only.
	EvalFraction float64 `json:"eval_fraction"`
	Seed         uint64  `json:"seed"`
	// Separator is the token placed after every record in ModePack, by
	// content (e.g. "<|endoftext|>"); empty means the tokenizer's EOS.
	Separator string `json:"separator,omitempty"`
	// Workers encoding records (0: GOMAXPROCS). Results do not depend on it.
	Workers int `json:"-"`
	// Progress, when set, receives one line per source read and per set
	// built (for standard error).
	Progress func(msg string) `json:"-"`
}

func (o *Options) progress(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(fmt.Sprintf(format, args...))
	}
}

// DefaultEvalFraction is the share of records held out for evaluation.
const DefaultEvalFraction = 0.1

// MaxSeqLen bounds SeqLen.
const MaxSeqLen = 1 << 20

func (o *Options) normalize() error {
	if o.EvalFraction == 0 {
		o.EvalFraction = DefaultEvalFraction
	}
	if !(o.EvalFraction > 0 && o.EvalFraction <= 1) {
		return fmt.Errorf("dataset: eval fraction %v: want 0 < f < 1 (or 1 when no calibration set is built)", o.EvalFraction)
	}
	if o.EvalFraction == 1 && o.Calibration.Requested() {
		return fmt.Errorf("dataset: eval fraction 1 leaves no calibration records, but %d calibration sequences are requested", o.Calibration.Sequences)
	}
	if !o.Calibration.Requested() && !o.Evaluation.Requested() {
		return fmt.Errorf("dataset: no sequences requested for calibration or evaluation")
	}
	for _, s := range []struct {
		name string
		o    *SetOptions
	}{{"calibration", &o.Calibration}, {"evaluation", &o.Evaluation}} {
		if s.o.Sequences < 0 || s.o.Sequences > 1<<24 {
			return fmt.Errorf("dataset: %s sequences %d: want 0..%d", s.name, s.o.Sequences, 1<<24)
		}
		if s.o.AllRecords {
			switch {
			case s.o.Sequences != 0 || s.o.SeqLen != 0:
				return fmt.Errorf("dataset: %s: every record (all records) with %d sequences of %d tokens: give one or the other", s.name, s.o.Sequences, s.o.SeqLen)
			case s.o.Mode != "" && s.o.Mode != ModeRecord:
				return fmt.Errorf("dataset: %s: every record (all records) is mode record, not %q", s.name, s.o.Mode)
			case s.o.Short != "" && s.o.Short != ShortKeep:
				return fmt.Errorf("dataset: %s: every record (all records) keeps every record; short %q does not apply", s.name, s.o.Short)
			}
			s.o.Mode, s.o.Short = ModeRecord, ShortKeep
			continue
		}
		if s.o.Sequences == 0 {
			continue
		}
		if s.o.SeqLen < 1 || s.o.SeqLen > MaxSeqLen {
			return fmt.Errorf("dataset: %s sequence length %d: want 1..%d", s.name, s.o.SeqLen, MaxSeqLen)
		}
		switch s.o.Mode {
		case "":
			s.o.Mode = ModePack
		case ModePack, ModeRecord:
		default:
			return fmt.Errorf("dataset: %s mode %q: want pack or record", s.name, s.o.Mode)
		}
		switch s.o.Short {
		case "":
			s.o.Short = ShortKeep
		case ShortKeep, ShortPad, ShortSkip:
		default:
			return fmt.Errorf("dataset: %s short %q: want keep, pad or skip", s.name, s.o.Short)
		}
		if s.o.Mode == ModePack && s.o.Short != ShortKeep {
			return fmt.Errorf("dataset: %s: short %q applies to mode record only", s.name, s.o.Short)
		}
	}
	if o.Workers < 0 {
		return fmt.Errorf("dataset: workers %d: want ≥ 0", o.Workers)
	}
	if o.Workers == 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	return nil
}

// RecordRef names a record that contributed to a sequence, and where its
// tokens start in the sequence (negative when the sequence starts inside
// the record).
type RecordRef struct {
	Source int    `json:"source"` // index into the spec's sources
	Where  string `json:"where"`  // file[:line]
	Start  int    `json:"start"`
}

// Sequence is one sequence of a set.
type Sequence struct {
	IDs []int32
	// Mask marks the tokens to score or calibrate on: all tokens of text
	// records and their separators, the assistant tokens of chats, the
	// completion tokens of prompt/completion records; never padding.
	Mask    []bool
	Label   string // corpus label
	Records []RecordRef
}

// Set is the calibration or the evaluation set.
type Set struct {
	Name      string
	Options   SetOptions
	Sequences []Sequence
}

// IDs returns the token ids of every sequence.
func (s *Set) IDs() [][]int32 {
	out := make([][]int32, len(s.Sequences))
	for i := range s.Sequences {
		out[i] = s.Sequences[i].IDs
	}
	return out
}

// Result is what Build returns. A set not requested is nil.
type Result struct {
	Calibration *Set
	Evaluation  *Set
	Provenance  Provenance
}

// ProvenanceSchemaVersion is the version of the Provenance JSON.
const ProvenanceSchemaVersion = 1

// Provenance says exactly what text a set came from.
type Provenance struct {
	SchemaVersion int `json:"schema_version"`
	// Spec is the spec as typed (inline string or file path); empty in a
	// content-only provenance (Content).
	Spec        string        `json:"spec,omitempty"`
	Options     Options       `json:"options"`
	Tokenizer   TokenizerInfo `json:"tokenizer"`
	Sources     []SourceInfo  `json:"sources"`
	Calibration *SetInfo      `json:"calibration,omitempty"`
	Evaluation  *SetInfo      `json:"evaluation,omitempty"`
}

// Content returns the provenance without what depends only on how the
// data was named: the spec as typed, every source's path and the path of
// every file of a jsonl or txt source. A dir source's files keep their
// paths relative to the source's root, which order its records. What is
// left (kinds, labels, weights, options, the tokenizer, every file's
// sha256, size and record count, the sets) is the same for the same text
// whatever directory it was read from or how its path was typed; it is
// what a checkpoint's manifest records (docs/checkpoint.md).
func (p Provenance) Content() Provenance {
	p.Spec = ""
	srcs := make([]SourceInfo, len(p.Sources))
	for i, s := range p.Sources {
		s.Path = ""
		s.Files = append([]FileInfo(nil), s.Files...)
		if s.Kind != KindDir {
			for k := range s.Files {
				s.Files[k].Path = ""
			}
		}
		srcs[i] = s
	}
	p.Sources = srcs
	return p
}

// TokenizerInfo identifies the tokenizer.
type TokenizerInfo struct {
	SHA256      string `json:"tokenizer_json_sha256"`
	Pattern     string `json:"pattern"`
	SeparatorID int    `json:"separator_id"`
	PadID       int    `json:"pad_id"`
}

// SourceInfo is a source with its files' hashes and record counts.
type SourceInfo struct {
	Source
	Files              []FileInfo `json:"files"`
	Skipped            []string   `json:"skipped,omitempty"`
	Records            int        `json:"records"`
	CalibrationRecords int        `json:"calibration_records"`
	EvaluationRecords  int        `json:"evaluation_records"`
}

// SetInfo summarises a set.
type SetInfo struct {
	Sequences      int            `json:"sequences"`
	Tokens         int64          `json:"tokens"`
	MaskedTokens   int64          `json:"masked_tokens"`
	TokenIDsSHA256 string         `json:"token_ids_sha256"`
	ByLabel        map[string]int `json:"sequences_by_label"`
	Records        int            `json:"records_used"`
	// Fingerprint samples the calibration set's text (not made for an
	// evaluation set): what an evaluation checks its text against.
	Fingerprint *Fingerprint `json:"fingerprint,omitempty"`
}

// HashTokenIDs is the calibration store's identity of a token-id set: the
// hex SHA-256 of, for every sequence in order, its length as a
// little-endian uint32 followed by its ids as little-endian uint32s.
func HashTokenIDs(seqs [][]int32) string {
	h := sha256.New()
	var b [4]byte
	for _, s := range seqs {
		binary.LittleEndian.PutUint32(b[:], uint32(len(s)))
		h.Write(b[:])
		buf := make([]byte, 4*len(s))
		for i, id := range s {
			binary.LittleEndian.PutUint32(buf[4*i:], uint32(id))
		}
		h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// stream is the records of one source with one label, in one split.
type stream struct {
	source int
	label  string
	weight float64
	cal    []*Record
	eval   []*Record
}

// Build reads the spec's sources, splits their records between calibration
// and evaluation, and cuts the requested sets. The result depends only on
// the files' contents, the spec, the options (not Workers) and the
// tokenizer.
func Build(spec *Spec, tok *tokenizer.Tokenizer, opt Options) (*Result, error) {
	if err := opt.normalize(); err != nil {
		return nil, err
	}
	sep := tok.EOS()
	if opt.Separator != "" {
		id, ok := tok.ID(opt.Separator)
		if !ok {
			return nil, fmt.Errorf("dataset: separator %q is not a token of the tokenizer", opt.Separator)
		}
		sep = id
	}
	packs := opt.Calibration.Requested() && opt.Calibration.Mode == ModePack || opt.Evaluation.Requested() && opt.Evaluation.Mode == ModePack
	if packs && sep < 0 {
		return nil, fmt.Errorf("dataset: mode pack needs a separator: the tokenizer has no EOS token; name one with the separator option")
	}
	pads := opt.Calibration.Requested() && opt.Calibration.Short == ShortPad || opt.Evaluation.Requested() && opt.Evaluation.Short == ShortPad
	if pads && tok.PAD() < 0 {
		return nil, fmt.Errorf("dataset: short pad needs the tokenizer's PAD token, and it has none")
	}
	res := &Result{Provenance: Provenance{
		SchemaVersion: ProvenanceSchemaVersion, Spec: spec.Text, Options: opt,
		Tokenizer: TokenizerInfo{SHA256: tok.SHA256(), Pattern: tok.Pattern().String(), SeparatorID: sep, PadID: tok.PAD()},
	}}

	var streams []*stream
	for si, src := range spec.Sources {
		l, err := readSource(src)
		if err != nil {
			return nil, err
		}
		info := SourceInfo{Source: src, Files: l.files, Skipped: l.skipped, Records: len(l.records)}
		opt.progress("source %d/%d %s (%s): %d files, %d records", si+1, len(spec.Sources), src.Path, src.Kind, len(l.files), len(l.records))
		byLabel := map[string]*stream{}
		var labels []string
		for i := range l.records {
			r := &l.records[i]
			st := byLabel[r.Label]
			if st == nil {
				st = &stream{source: si, label: r.Label}
				byLabel[r.Label] = st
				labels = append(labels, r.Label)
			}
			if isEval(r, opt.Seed, opt.EvalFraction) {
				st.eval = append(st.eval, r)
				info.EvaluationRecords++
			} else {
				st.cal = append(st.cal, r)
				info.CalibrationRecords++
			}
		}
		sort.Strings(labels)
		for _, lab := range labels {
			st := byLabel[lab]
			st.weight = src.weight() * float64(len(st.cal)+len(st.eval)) / float64(len(l.records))
			streams = append(streams, st)
		}
		res.Provenance.Sources = append(res.Provenance.Sources, info)
	}

	b := builder{spec: spec, tok: tok, opt: opt, sep: sep}
	var err error
	if opt.Calibration.Requested() {
		if res.Calibration, res.Provenance.Calibration, err = b.buildSet("calibration", opt.Calibration, streams); err != nil {
			return nil, err
		}
	}
	if opt.Evaluation.Requested() {
		if res.Evaluation, res.Provenance.Evaluation, err = b.buildSet("evaluation", opt.Evaluation, streams); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// contentKey is what the split hashes: equal contents always land in the
// same set.
func contentKey(r *Record) []byte {
	var k []byte
	k = append(k, byte(r.Kind))
	switch r.Kind {
	case RecordText:
		k = append(k, r.Text...)
	case RecordChat:
		for _, m := range r.Messages {
			k = append(k, m.Role...)
			k = append(k, 0)
			k = append(k, m.Content...)
			k = append(k, 0)
		}
	case RecordInstruct:
		k = append(k, r.Prompt...)
		k = append(k, 0)
		k = append(k, r.Completion...)
	}
	return k
}

func isEval(r *Record, seed uint64, fraction float64) bool {
	h := sha256.New()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	h.Write(contentKey(r))
	sum := h.Sum(nil)
	u := float64(binary.LittleEndian.Uint64(sum[:8])>>11) / (1 << 53)
	return u < fraction
}

// apportion splits n among weights by the largest-remainder method (ties
// to the earlier index).
func apportion(n int, weights []float64) []int {
	total := 0.0
	for _, w := range weights {
		total += w
	}
	out := make([]int, len(weights))
	type rem struct {
		i int
		r float64
	}
	rems := make([]rem, len(weights))
	given := 0
	for i, w := range weights {
		q := float64(n) * w / total
		out[i] = int(math.Floor(q))
		given += out[i]
		rems[i] = rem{i, q - math.Floor(q)}
	}
	sort.SliceStable(rems, func(a, b int) bool { return rems[a].r > rems[b].r })
	for k := 0; given < n; k++ {
		out[rems[k%len(rems)].i]++
		given++
	}
	return out
}

type builder struct {
	spec *Spec
	tok  *tokenizer.Tokenizer
	opt  Options
	sep  int
}

// encoded is a tokenized record.
type encoded struct {
	ids  []int32
	mask []bool
}

func (b *builder) encode(r *Record) (encoded, error) {
	var ids []int
	var mask []bool
	switch r.Kind {
	case RecordText:
		ids = b.tok.Encode(r.Text)
		mask = make([]bool, len(ids))
		for i := range mask {
			mask[i] = true
		}
	case RecordChat, RecordInstruct:
		msgs := r.Messages
		if r.Kind == RecordInstruct {
			msgs = []tokenizer.Message{{Role: tokenizer.RoleUser, Content: r.Prompt}, {Role: tokenizer.RoleAssistant, Content: r.Completion}}
		}
		var err error
		if ids, mask, err = b.tok.EncodeChat(msgs); err != nil {
			return encoded{}, err
		}
	}
	e := encoded{ids: make([]int32, len(ids)), mask: mask}
	for i, id := range ids {
		e.ids[i] = int32(id)
	}
	return e, nil
}

// encodeAll tokenizes records with the configured workers.
func (b *builder) encodeAll(spec *Spec, src int, recs []*Record) ([]encoded, error) {
	out := make([]encoded, len(recs))
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	ch := make(chan int)
	for w := 0; w < b.opt.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				out[i], errs[i] = b.encode(recs[i])
			}
		}()
	}
	for i := range recs {
		ch <- i
	}
	close(ch)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("dataset: %s: %w", recs[i].where(&spec.Sources[src]), err)
		}
	}
	return out, nil
}

// batch is how many records are encoded at a time while filling a stream.
const batch = 64

func (b *builder) buildSet(name string, so SetOptions, streams []*stream) (*Set, *SetInfo, error) {
	weights := make([]float64, len(streams))
	for i, st := range streams {
		weights[i] = st.weight
	}
	counts := apportion(so.Sequences, weights)
	if so.AllRecords {
		for i, st := range streams {
			counts[i] = len(st.cal)
			if name == "evaluation" {
				counts[i] = len(st.eval)
			}
		}
	}
	set := &Set{Name: name, Options: so}
	used := 0
	for i, st := range streams {
		if counts[i] == 0 {
			continue
		}
		recs := st.cal
		if name == "evaluation" {
			recs = st.eval
		}
		src := &b.spec.Sources[st.source]
		if len(recs) == 0 {
			return nil, nil, fmt.Errorf("dataset: %s set: source %s (label %s) has no %s records (eval fraction %v); it needs %d sequences: %w",
				name, src.Path, st.label, name, b.opt.EvalFraction, counts[i], ErrEmpty)
		}
		order := make([]*Record, len(recs))
		rng := rand.New(rand.NewPCG(b.opt.Seed, streamKey(name, st)))
		for k, p := range rng.Perm(len(recs)) {
			order[k] = recs[p]
		}
		seqs, n, err := b.fill(so, st, order, counts[i])
		if err != nil {
			return nil, nil, fmt.Errorf("dataset: %s set: source %s (label %s): %w", name, src.Path, st.label, err)
		}
		used += n
		set.Sequences = append(set.Sequences, seqs...)
	}
	if so.AllRecords && len(set.Sequences) == 0 {
		return nil, nil, fmt.Errorf("dataset: %s set: every record asked for, but the sources have no %s records (eval fraction %v): %w", name, name, b.opt.EvalFraction, ErrEmpty)
	}
	// Interleave the streams' sequences in a seeded order.
	rng := rand.New(rand.NewPCG(b.opt.Seed, streamKey(name+"/order", nil)))
	rng.Shuffle(len(set.Sequences), func(i, j int) { set.Sequences[i], set.Sequences[j] = set.Sequences[j], set.Sequences[i] })

	info := &SetInfo{Sequences: len(set.Sequences), ByLabel: map[string]int{}, Records: used}
	for _, s := range set.Sequences {
		info.Tokens += int64(len(s.IDs))
		for _, m := range s.Mask {
			if m {
				info.MaskedTokens++
			}
		}
		info.ByLabel[s.Label]++
	}
	info.TokenIDsSHA256 = HashTokenIDs(set.IDs())
	if name == "calibration" {
		var err error
		if info.Fingerprint, err = NewFingerprint(set, 0); err != nil {
			return nil, nil, err
		}
	}
	b.opt.progress("%s set: %d sequences, %d tokens from %d records", name, info.Sequences, info.Tokens, info.Records)
	return set, info, nil
}

func streamKey(name string, st *stream) uint64 {
	h := sha256.New()
	h.Write([]byte(name))
	if st != nil {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(st.source))
		h.Write(b[:])
		h.Write([]byte(st.label))
	}
	return binary.LittleEndian.Uint64(h.Sum(nil)[:8])
}

// fill cuts want sequences from records in order; it returns them and the
// number of records used.
func (b *builder) fill(so SetOptions, st *stream, order []*Record, want int) ([]Sequence, int, error) {
	src := &b.spec.Sources[st.source]
	var seqs []Sequence
	var cur Sequence
	tokens, next, usedRecs := 0, 0, 0
	for len(seqs) < want {
		if next >= len(order) {
			if so.AllRecords {
				break // every record, the empty ones making none
			}
			if so.Mode == ModePack {
				return nil, 0, fmt.Errorf("%d records give %d tokens with separators, %d sequences of %d tokens need %d: %w",
					len(order), tokens, want, so.SeqLen, want*so.SeqLen, ErrNotEnoughText)
			}
			return nil, 0, fmt.Errorf("%d records give %d sequences (short %s), %d needed: %w", len(order), len(seqs), so.Short, want, ErrNotEnoughText)
		}
		end := min(next+batch, len(order))
		enc, err := b.encodeAll(b.spec, st.source, order[next:end])
		if err != nil {
			return nil, 0, err
		}
		for k, e := range enc {
			r := order[next+k]
			ref := RecordRef{Source: st.source, Where: r.where(src)}
			if so.Mode == ModeRecord {
				if len(seqs) == want {
					break
				}
				ids, mask := e.ids, e.mask
				if len(ids) > so.SeqLen && !so.AllRecords {
					ids, mask = ids[:so.SeqLen], mask[:so.SeqLen]
				}
				if len(ids) < so.SeqLen && !so.AllRecords {
					switch so.Short {
					case ShortSkip:
						continue
					case ShortPad:
						n := so.SeqLen - len(ids)
						ids = append(ids[:len(ids):len(ids)], make([]int32, n)...)
						mask = append(mask[:len(mask):len(mask)], make([]bool, n)...)
						for p := so.SeqLen - n; p < so.SeqLen; p++ {
							ids[p] = int32(b.tok.PAD())
						}
					}
				}
				if len(ids) == 0 {
					continue
				}
				usedRecs++
				seqs = append(seqs, Sequence{IDs: ids, Mask: mask, Label: st.label, Records: []RecordRef{ref}})
				continue
			}
			// Pack: the record, then the separator.
			ids := append(e.ids, int32(b.sep))
			mask := append(e.mask, r.Kind == RecordText)
			tokens += len(ids)
			if len(seqs) < want {
				usedRecs++
			}
			off := 0
			for off < len(ids) && len(seqs) < want {
				if cur.IDs == nil {
					cur = Sequence{IDs: make([]int32, 0, so.SeqLen), Mask: make([]bool, 0, so.SeqLen), Label: st.label}
				}
				ref.Start = len(cur.IDs) - off
				cur.Records = append(cur.Records, ref)
				n := min(so.SeqLen-len(cur.IDs), len(ids)-off)
				cur.IDs = append(cur.IDs, ids[off:off+n]...)
				cur.Mask = append(cur.Mask, mask[off:off+n]...)
				off += n
				if len(cur.IDs) == so.SeqLen {
					seqs = append(seqs, cur)
					cur = Sequence{}
				}
			}
		}
		next = end
	}
	return seqs, usedRecs, nil
}

// ErrNotEnoughText is wrapped when a source has too little text for its
// share of a set's sequences.
var ErrNotEnoughText = errors.New("not enough text")
