package calib

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"

	"github.com/ttquant/ttquant/safetensors"
)

// Store file names and format identifiers (see docs/calibration.md).
const (
	StoreIndexName     = "calibration.json"
	StoreSequencesName = "sequences.safetensors"
	StoreFormat        = "ttquant-calibration"
	StoreFormatVersion = 1
)

// Conventional site names. A site is the input of a module of one decoder
// layer, named by the module's path below "layers.N.".
const (
	// SiteMoE is the input of the sparse MoE block ("mlp"): the normalised
	// hidden state fed to the router, the routed experts and the shared
	// expert.
	SiteMoE = model.SiteMoE
	// SiteAttn is the normalised input of the attention block, fed to
	// q/k/v_proj (full attention) or in_proj_* (linear attention).
	SiteAttn = model.SiteAttn
	// SiteOProj is the input of self_attn.o_proj (full-attention layers).
	SiteOProj = model.SiteOProj
	// SiteOutProj is the input of linear_attn.out_proj (linear-attention
	// layers).
	SiteOutProj = model.SiteOutProj
)

// Provenance records where calibration activations come from.
type Provenance struct {
	Model     string `json:"model"`    // e.g. a Hugging Face repository id
	Revision  string `json:"revision"` // commit or tag of the model
	Sequences int    `json:"sequences"`
	Tokens    int64  `json:"tokens"`
	// TokenIDsSHA256 is HashTokenIDs of the calibration token ids.
	TokenIDsSHA256 string `json:"token_ids_sha256"`
	// Synthetic is true for a store of generated activations (see
	// SynthesizeStore) rather than activations of the model on text.
	// GPTQ on synthetic activations can be worse than rounding, so
	// builders refuse such a store unless told otherwise.
	Synthetic bool `json:"synthetic,omitempty"`
	// Data, for a store built from text, is the provenance of the token
	// sequences (internal/text/dataset's Provenance: the sources with
	// their sha256s, the options, the tokenizer and the token-id hash).
	Data json.RawMessage `json:"data,omitempty"`
}

// HashTokenIDs returns the hex SHA-256 identifying a calibration set: for
// every sequence in order, its length as a little-endian uint32 followed by
// its token ids as little-endian uint32s. The convention is defined once, by
// the dataset package that builds token sequences from text.
func HashTokenIDs(seqs [][]int32) string { return dataset.HashTokenIDs(seqs) }

// SiteInfo describes the activations stored for one site of one layer.
type SiteInfo struct {
	Layer  int         `json:"layer"`
	Site   string      `json:"site"`
	Cols   int         `json:"cols"`
	Tokens int64       `json:"tokens"`
	DType  string      `json:"dtype"`
	Shards []ShardInfo `json:"shards"`
}

// ShardInfo is one file of a site: rows FirstToken … FirstToken+Tokens−1.
type ShardInfo struct {
	File       string `json:"file"`
	FirstToken int64  `json:"first_token"`
	Tokens     int64  `json:"tokens"`
}

type storeIndex struct {
	Format          string     `json:"format"`
	FormatVersion   int        `json:"format_version"`
	Provenance      Provenance `json:"provenance"`
	SequenceLengths []int      `json:"sequence_lengths"`
	Sites           []SiteInfo `json:"sites"`
}

// StoreOptions configures a StoreWriter.
type StoreOptions struct {
	// DType of the stored activations: safetensors.BF16 (default) or F32.
	DType safetensors.DType
	// ShardBytes bounds the activation bytes of one shard file (and the
	// writer's buffer); 0 selects 256 MiB.
	ShardBytes int64
}

// StoreWriter writes a calibration store directory. Sites are written one
// at a time with BeginSite / SiteWriter.Write / SiteWriter.Close; Close
// writes the index last, so a directory without calibration.json is an
// incomplete store.
type StoreWriter struct {
	dir    string
	opt    StoreOptions
	idx    storeIndex
	open   *SiteWriter
	closed bool
	seen   map[string]bool
}

// CreateStore starts a store in dir (created if needed; it must not already
// hold a store). seqLens gives the length of every calibration sequence;
// their sum must equal prov.Tokens and their count prov.Sequences. tokenIDs,
// when non-nil, are stored too (one slice per sequence) and must hash to
// prov.TokenIDsSHA256 (filled in when empty).
func CreateStore(dir string, prov Provenance, seqLens []int, tokenIDs [][]int32, opt StoreOptions) (*StoreWriter, error) {
	if opt.DType == 0 {
		opt.DType = safetensors.BF16
	}
	if opt.DType != safetensors.BF16 && opt.DType != safetensors.F32 {
		return nil, fmt.Errorf("calib: store dtype %v not supported (want BF16 or F32)", opt.DType)
	}
	if opt.ShardBytes == 0 {
		opt.ShardBytes = 256 << 20
	}
	if opt.ShardBytes < 0 {
		return nil, fmt.Errorf("calib: store shard size %d is negative", opt.ShardBytes)
	}
	if len(seqLens) != prov.Sequences {
		return nil, fmt.Errorf("calib: store: %d sequence lengths for %d sequences", len(seqLens), prov.Sequences)
	}
	var total int64
	for i, n := range seqLens {
		if n <= 0 {
			return nil, fmt.Errorf("calib: store: sequence %d has length %d", i, n)
		}
		total += int64(n)
	}
	if total != prov.Tokens {
		return nil, fmt.Errorf("calib: store: sequence lengths sum to %d, provenance says %d tokens", total, prov.Tokens)
	}
	if tokenIDs != nil {
		if len(tokenIDs) != len(seqLens) {
			return nil, fmt.Errorf("calib: store: %d token id sequences for %d sequences", len(tokenIDs), len(seqLens))
		}
		for i, s := range tokenIDs {
			if len(s) != seqLens[i] {
				return nil, fmt.Errorf("calib: store: sequence %d has %d token ids, length %d", i, len(s), seqLens[i])
			}
		}
		h := HashTokenIDs(tokenIDs)
		if prov.TokenIDsSHA256 == "" {
			prov.TokenIDsSHA256 = h
		} else if prov.TokenIDsSHA256 != h {
			return nil, fmt.Errorf("calib: store: token ids hash to %s, provenance says %s", h, prov.TokenIDsSHA256)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, StoreIndexName)); err == nil {
		return nil, fmt.Errorf("calib: %s already holds a calibration store", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("calib: creating store: %w", err)
	}
	w := &StoreWriter{dir: dir, opt: opt, seen: map[string]bool{}}
	w.idx = storeIndex{Format: StoreFormat, FormatVersion: StoreFormatVersion, Provenance: prov,
		SequenceLengths: append([]int(nil), seqLens...)}
	// The sequences file: boundaries, and the token ids when known.
	offs := make([]byte, 8*(len(seqLens)+1))
	var acc int64
	for i, n := range seqLens {
		acc += int64(n)
		binary.LittleEndian.PutUint64(offs[8*(i+1):], uint64(acc))
	}
	tensors := []safetensors.Tensor{{Name: "sequence_offsets", DType: safetensors.I64,
		Shape: []int64{int64(len(seqLens) + 1)}, Data: offs}}
	if tokenIDs != nil {
		ids := make([]byte, 0, 4*total)
		for _, s := range tokenIDs {
			for _, id := range s {
				ids = binary.LittleEndian.AppendUint32(ids, uint32(id))
			}
		}
		tensors = append(tensors, safetensors.Tensor{Name: "token_ids", DType: safetensors.I32,
			Shape: []int64{total}, Data: ids})
	}
	if err := safetensors.WriteFile(filepath.Join(dir, StoreSequencesName), tensors, w.metadata(-1, "", 0, 0)); err != nil {
		return nil, fmt.Errorf("calib: writing %s: %w", StoreSequencesName, err)
	}
	return w, nil
}

// metadata returns the __metadata__ of a store file.
func (w *StoreWriter) metadata(layer int, site string, first, rows int64) map[string]string {
	p := w.idx.Provenance
	md := map[string]string{
		"format":                         StoreFormat,
		"ttquant.calib.version":          strconv.Itoa(StoreFormatVersion),
		"ttquant.calib.model":            p.Model,
		"ttquant.calib.revision":         p.Revision,
		"ttquant.calib.sequences":        strconv.Itoa(p.Sequences),
		"ttquant.calib.tokens":           strconv.FormatInt(p.Tokens, 10),
		"ttquant.calib.token_ids_sha256": p.TokenIDsSHA256,
	}
	if layer >= 0 {
		md["ttquant.calib.layer"] = strconv.Itoa(layer)
		md["ttquant.calib.site"] = site
		md["ttquant.calib.first_token"] = strconv.FormatInt(first, 10)
		md["ttquant.calib.rows"] = strconv.FormatInt(rows, 10)
	}
	return md
}

var siteNameRE = regexp.MustCompile(`^[a-z0-9_]+(\.[a-z0-9_]+)*$`)

// SiteWriter receives the activations of one site, row by row, in token
// order.
type SiteWriter struct {
	w       *StoreWriter
	info    SiteInfo
	buf     []byte
	bufRows int64
	written int64
	done    bool
}

// BeginSite starts the activations of site at layer, cols features per
// token. Only one site may be open at a time.
func (w *StoreWriter) BeginSite(layer int, site string, cols int) (*SiteWriter, error) {
	if w.closed {
		return nil, errors.New("calib: store writer is closed")
	}
	if w.open != nil {
		return nil, fmt.Errorf("calib: store: site %d/%s is still open", w.open.info.Layer, w.open.info.Site)
	}
	if layer < 0 || layer > 99999 {
		return nil, fmt.Errorf("calib: store: layer %d out of range", layer)
	}
	if !siteNameRE.MatchString(site) {
		return nil, fmt.Errorf("calib: store: site name %q must be dot-separated [a-z0-9_] words", site)
	}
	if cols <= 0 {
		return nil, fmt.Errorf("calib: store: site %d/%s: %d columns", layer, site, cols)
	}
	key := fmt.Sprintf("%d/%s", layer, site)
	if w.seen[key] {
		return nil, fmt.Errorf("calib: store: site %s written twice", key)
	}
	w.seen[key] = true
	s := &SiteWriter{w: w, info: SiteInfo{Layer: layer, Site: site, Cols: cols, DType: w.opt.DType.String()}}
	w.open = s
	return s, nil
}

func (s *SiteWriter) rowBytes() int64 { return int64(s.info.Cols) * int64(s.w.opt.DType.Bits()/8) }

// Write appends rows (a multiple of the site's columns, row-major).
func (s *SiteWriter) Write(rows []float32) error {
	if s.done {
		return errors.New("calib: store: write to a closed site")
	}
	c := s.info.Cols
	if len(rows)%c != 0 {
		return fmt.Errorf("calib: store: site %d/%s: %d values is not a whole number of %d-column rows", s.info.Layer, s.info.Site, len(rows), c)
	}
	n := int64(len(rows) / c)
	if s.written+n > s.w.idx.Provenance.Tokens {
		return fmt.Errorf("calib: store: site %d/%s: %d rows exceed the store's %d tokens", s.info.Layer, s.info.Site, s.written+n, s.w.idx.Provenance.Tokens)
	}
	perShard := max(1, s.w.opt.ShardBytes/s.rowBytes())
	for len(rows) > 0 {
		take := min(int64(len(rows)/c), perShard-s.bufRows)
		chunk := rows[:take*int64(c)]
		var err error
		if s.buf, err = safetensors.AppendFloat32s(s.buf, chunk, s.w.opt.DType); err != nil {
			return fmt.Errorf("calib: store: site %d/%s: %w", s.info.Layer, s.info.Site, err)
		}
		s.bufRows += take
		s.written += take
		rows = rows[take*int64(c):]
		if s.bufRows == perShard {
			if err := s.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *SiteWriter) flush() error {
	if s.bufRows == 0 {
		return nil
	}
	first := s.written - s.bufRows
	name := fmt.Sprintf("layer%03d.%s.%05d.safetensors", s.info.Layer, s.info.Site, len(s.info.Shards))
	t := safetensors.Tensor{Name: "activations", DType: s.w.opt.DType,
		Shape: []int64{s.bufRows, int64(s.info.Cols)}, Data: s.buf}
	if err := safetensors.WriteFile(filepath.Join(s.w.dir, name), []safetensors.Tensor{t},
		s.w.metadata(s.info.Layer, s.info.Site, first, s.bufRows)); err != nil {
		return fmt.Errorf("calib: store: writing %s: %w", name, err)
	}
	s.info.Shards = append(s.info.Shards, ShardInfo{File: name, FirstToken: first, Tokens: s.bufRows})
	s.buf = s.buf[:0]
	s.bufRows = 0
	return nil
}

// Close finishes the site; it must have received exactly one row per
// calibration token.
func (s *SiteWriter) Close() error {
	if s.done {
		return nil
	}
	if err := s.flush(); err != nil {
		return err
	}
	s.done = true
	s.w.open = nil
	if s.written != s.w.idx.Provenance.Tokens {
		return fmt.Errorf("calib: store: site %d/%s received %d rows, the store has %d tokens", s.info.Layer, s.info.Site, s.written, s.w.idx.Provenance.Tokens)
	}
	s.info.Tokens = s.written
	s.w.idx.Sites = append(s.w.idx.Sites, s.info)
	return nil
}

// Close writes the index. Sites are listed by layer, then site name.
func (w *StoreWriter) Close() error {
	if w.closed {
		return nil
	}
	if w.open != nil {
		return fmt.Errorf("calib: store: site %d/%s was not closed", w.open.info.Layer, w.open.info.Site)
	}
	w.closed = true
	sort.Slice(w.idx.Sites, func(i, j int) bool {
		a, b := w.idx.Sites[i], w.idx.Sites[j]
		if a.Layer != b.Layer {
			return a.Layer < b.Layer
		}
		return a.Site < b.Site
	})
	raw, err := json.MarshalIndent(w.idx, "", "  ")
	if err != nil {
		return err
	}
	raw = append(raw, '\n')
	tmp := filepath.Join(w.dir, "."+StoreIndexName+".tmp")
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return fmt.Errorf("calib: store: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(w.dir, StoreIndexName)); err != nil {
		return fmt.Errorf("calib: store: %w", err)
	}
	return nil
}

// Store is an open calibration store.
type Store struct {
	dir  string
	idx  storeIndex
	offs []int64
}

// OpenStore opens the store in dir and checks its index: format, version,
// sequence lengths against the provenance, and the shard list of every site
// (contiguous, covering every token). Shard files are opened when read.
func OpenStore(dir string) (*Store, error) {
	path := filepath.Join(dir, StoreIndexName)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("calib: opening store: %w", err)
	}
	var idx storeIndex
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&idx); err != nil {
		return nil, fmt.Errorf("calib: %s: %w", path, err)
	}
	if idx.Format != StoreFormat {
		return nil, fmt.Errorf("calib: %s: format %q, want %q", path, idx.Format, StoreFormat)
	}
	if idx.FormatVersion != StoreFormatVersion {
		return nil, fmt.Errorf("calib: %s: format version %d not supported (want %d)", path, idx.FormatVersion, StoreFormatVersion)
	}
	p := idx.Provenance
	if len(idx.SequenceLengths) != p.Sequences {
		return nil, fmt.Errorf("calib: %s: %d sequence lengths for %d sequences", path, len(idx.SequenceLengths), p.Sequences)
	}
	s := &Store{dir: dir, idx: idx, offs: make([]int64, len(idx.SequenceLengths)+1)}
	for i, n := range idx.SequenceLengths {
		if n <= 0 {
			return nil, fmt.Errorf("calib: %s: sequence %d has length %d", path, i, n)
		}
		s.offs[i+1] = s.offs[i] + int64(n)
	}
	if s.offs[len(s.offs)-1] != p.Tokens {
		return nil, fmt.Errorf("calib: %s: sequence lengths sum to %d, provenance says %d tokens", path, s.offs[len(s.offs)-1], p.Tokens)
	}
	seen := map[string]bool{}
	for _, si := range idx.Sites {
		key := fmt.Sprintf("%d/%s", si.Layer, si.Site)
		if seen[key] {
			return nil, fmt.Errorf("calib: %s: site %s listed twice", path, key)
		}
		seen[key] = true
		if si.Cols <= 0 || si.Tokens != p.Tokens {
			return nil, fmt.Errorf("calib: %s: site %s has %d columns and %d tokens (store has %d)", path, key, si.Cols, si.Tokens, p.Tokens)
		}
		if si.DType != "BF16" && si.DType != "F32" {
			return nil, fmt.Errorf("calib: %s: site %s has dtype %q (want BF16 or F32)", path, key, si.DType)
		}
		var next int64
		for _, sh := range si.Shards {
			if !validShardName(sh.File) {
				return nil, fmt.Errorf("calib: %s: site %s: shard name %q is not a plain file name in the store directory (no directories, no \"..\")", path, key, sh.File)
			}
			if sh.FirstToken != next || sh.Tokens <= 0 {
				return nil, fmt.Errorf("calib: %s: site %s shard %q covers [%d, +%d), expected to start at %d", path, key, sh.File, sh.FirstToken, sh.Tokens, next)
			}
			next += sh.Tokens
		}
		if next != p.Tokens {
			return nil, fmt.Errorf("calib: %s: site %s shards cover %d of %d tokens", path, key, next, p.Tokens)
		}
	}
	return s, nil
}

// Dir returns the store directory.
func (s *Store) Dir() string { return s.dir }

// Provenance returns the store's provenance record.
func (s *Store) Provenance() Provenance { return s.idx.Provenance }

// SequenceOffsets returns the token index where each sequence starts,
// followed by the total token count.
func (s *Store) SequenceOffsets() []int64 { return append([]int64(nil), s.offs...) }

// Sites lists the stored sites by layer, then name.
func (s *Store) Sites() []SiteInfo { return append([]SiteInfo(nil), s.idx.Sites...) }

// Site returns the description of one site.
func (s *Store) Site(layer int, site string) (SiteInfo, bool) {
	for _, si := range s.idx.Sites {
		if si.Layer == layer && si.Site == site {
			return si, true
		}
	}
	return SiteInfo{}, false
}

// TokenIDs returns the stored token ids, one slice per sequence, or nil when
// the store does not hold them. The ids are checked against the
// provenance hash.
func (s *Store) TokenIDs() ([][]int32, error) {
	path := filepath.Join(s.dir, StoreSequencesName)
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("calib: %w", err)
	}
	defer f.Close()
	ti, ok := f.Lookup("token_ids")
	if !ok {
		return nil, nil
	}
	if ti.DType != safetensors.I32 || len(ti.Shape) != 1 || ti.Shape[0] != s.idx.Provenance.Tokens {
		return nil, fmt.Errorf("calib: %s: token_ids is %v %v, want I32 [%d]", path, ti.DType, ti.Shape, s.idx.Provenance.Tokens)
	}
	raw, err := f.ReadTensor("token_ids")
	if err != nil {
		return nil, fmt.Errorf("calib: %w", err)
	}
	out := make([][]int32, len(s.idx.SequenceLengths))
	for i := range out {
		a, b := s.offs[i], s.offs[i+1]
		out[i] = make([]int32, b-a)
		for j := range out[i] {
			out[i][j] = int32(binary.LittleEndian.Uint32(raw[4*(a+int64(j)):]))
		}
	}
	if h := HashTokenIDs(out); h != s.idx.Provenance.TokenIDsSHA256 {
		return nil, fmt.Errorf("calib: %s: token ids hash to %s, provenance says %s", path, h, s.idx.Provenance.TokenIDsSHA256)
	}
	return out, nil
}

// Stream reads rows first … first+n−1 of a site in chunks of at most
// chunkRows rows (0 selects 4096) and calls fn with each chunk's first token
// index and its values (rows×cols float32, valid only during the call).
// Memory use is one chunk, whatever the site's size.
func (s *Store) Stream(layer int, site string, first, n int64, chunkRows int, fn func(first int64, rows []float32) error) error {
	si, ok := s.Site(layer, site)
	if !ok {
		return fmt.Errorf("calib: store %s has no site %q for layer %d", s.dir, site, layer)
	}
	if first < 0 || n < 0 || first+n > si.Tokens {
		return fmt.Errorf("calib: store %s: rows [%d, %d) outside site %d/%s's %d tokens", s.dir, first, first+n, layer, site, si.Tokens)
	}
	if chunkRows <= 0 {
		chunkRows = 4096
	}
	esize := int64(2)
	if si.DType == "F32" {
		esize = 4
	}
	rowBytes := int64(si.Cols) * esize
	buf := make([]byte, int64(chunkRows)*rowBytes)
	vals := make([]float32, chunkRows*si.Cols)
	end := first + n
	for _, sh := range si.Shards {
		a, b := max(first, sh.FirstToken), min(end, sh.FirstToken+sh.Tokens)
		if a >= b {
			continue
		}
		if err := s.streamShard(si, sh, a, b, rowBytes, buf, vals, chunkRows, fn); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) streamShard(si SiteInfo, sh ShardInfo, a, b, rowBytes int64, buf []byte, vals []float32, chunkRows int, fn func(int64, []float32) error) error {
	path := filepath.Join(s.dir, sh.File)
	f, err := safetensors.Open(path)
	if err != nil {
		return fmt.Errorf("calib: %w", err)
	}
	defer f.Close()
	if err := s.checkShard(f, si, sh); err != nil {
		return err
	}
	sr, err := f.SectionReader("activations")
	if err != nil {
		return fmt.Errorf("calib: %s: %w", path, err)
	}
	for r := a; r < b; {
		k := min(int64(chunkRows), b-r)
		nb := k * rowBytes
		if _, err := sr.ReadAt(buf[:nb], (r-sh.FirstToken)*rowBytes); err != nil {
			return fmt.Errorf("calib: %s: reading rows %d..%d: %w", path, r, r+k, err)
		}
		v := vals[:k*int64(si.Cols)]
		dt := safetensors.BF16
		if si.DType == "F32" {
			dt = safetensors.F32
		}
		if err := safetensors.DecodeFloat32s(v, buf[:nb], dt); err != nil {
			return fmt.Errorf("calib: %s: %w", path, err)
		}
		if err := fn(r, v); err != nil {
			return err
		}
		r += k
	}
	return nil
}

// checkShard verifies that a shard file is the one the index describes.
func (s *Store) checkShard(f *safetensors.File, si SiteInfo, sh ShardInfo) error {
	path := f.Path()
	md := f.Metadata()
	p := s.idx.Provenance
	want := map[string]string{
		"ttquant.calib.model":            p.Model,
		"ttquant.calib.token_ids_sha256": p.TokenIDsSHA256,
		"ttquant.calib.layer":            strconv.Itoa(si.Layer),
		"ttquant.calib.site":             si.Site,
		"ttquant.calib.first_token":      strconv.FormatInt(sh.FirstToken, 10),
		"ttquant.calib.rows":             strconv.FormatInt(sh.Tokens, 10),
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if md[k] != want[k] {
			return fmt.Errorf("calib: %s: metadata %s = %q, index says %q", path, k, md[k], want[k])
		}
	}
	ti, ok := f.Lookup("activations")
	if !ok {
		return fmt.Errorf("calib: %s: no tensor \"activations\"", path)
	}
	if ti.DType.String() != si.DType || len(ti.Shape) != 2 || ti.Shape[0] != sh.Tokens || ti.Shape[1] != int64(si.Cols) {
		return fmt.Errorf("calib: %s: tensor activations is %v %v, want %s [%d, %d]", path, ti.DType, ti.Shape, si.DType, sh.Tokens, si.Cols)
	}
	return nil
}

// ReadRows returns rows first … first+n−1 of a site as one float32 matrix.
func (s *Store) ReadRows(layer int, site string, first, n int64) ([]float32, error) {
	si, ok := s.Site(layer, site)
	if !ok {
		return nil, fmt.Errorf("calib: store %s has no site %q for layer %d", s.dir, site, layer)
	}
	if n < 0 || n > math.MaxInt32*8 {
		return nil, fmt.Errorf("calib: store %s: %d rows requested", s.dir, n)
	}
	out := make([]float32, 0, n*int64(si.Cols))
	err := s.Stream(layer, site, first, n, 0, func(_ int64, rows []float32) error {
		out = append(out, rows...)
		return nil
	})
	return out, err
}
