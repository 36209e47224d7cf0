package calib

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/internal/shard"
	"github.com/ttquant/ttquant/internal/text/dataset"
	"github.com/ttquant/ttquant/safetensors"
)

// Store file names and format identifiers (see docs/calibration.md).
const (
	StoreIndexName     = "calibration.json"
	StoreSequencesName = "sequences.safetensors"
	StoreFormat        = "ttquant-calibration"
	StoreFormatVersion = 2 // the newest version read and written
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

// Alignment says how the rows of a site line up with the store's token
// rows. The zero value is invalid.
type Alignment uint8

const (
	// AlignToken: one row per calibration token, in token order. Every
	// site of a version-1 store is aligned so.
	AlignToken Alignment = iota + 1
	// AlignNextToken: one row per token that has a successor in its
	// sequence. A sequence of T tokens contributes T−1 rows, its row t
	// belonging to token t and combining it with token t+1 (the inputs of
	// a multi-token-prediction layer); sequence i's rows start at row
	// offset_i − i, offset_i being its first token row.
	AlignNextToken
)

var alignmentNames = [...]string{AlignToken: "token", AlignNextToken: "next_token"}

// Valid reports whether a is one of the defined alignments.
func (a Alignment) Valid() bool { return a == AlignToken || a == AlignNextToken }

func (a Alignment) String() string {
	if a.Valid() {
		return alignmentNames[a]
	}
	return fmt.Sprintf("Alignment(%d)", uint8(a))
}

// ParseAlignment returns the alignment named s ("token" or "next_token").
func ParseAlignment(s string) (Alignment, error) {
	for a, n := range alignmentNames {
		if n != "" && n == s {
			return Alignment(a), nil
		}
	}
	return 0, fmt.Errorf("calib: alignment %q: want token or next_token", s)
}

// MarshalText implements encoding.TextMarshaler.
func (a Alignment) MarshalText() ([]byte, error) {
	if !a.Valid() {
		return nil, fmt.Errorf("calib: invalid alignment %d", uint8(a))
	}
	return []byte(a.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Alignment) UnmarshalText(b []byte) error {
	v, err := ParseAlignment(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// SequenceRows is the number of rows a sequence of n tokens contributes to
// a site with this alignment.
func (a Alignment) SequenceRows(n int) int {
	if a == AlignNextToken {
		return max(0, n-1)
	}
	return n
}

// rowOffsets returns, for sequence lengths lens, the first row of each
// sequence in a site with alignment a, followed by the site's row count.
func (a Alignment) rowOffsets(lens []int) []int64 {
	offs := make([]int64, len(lens)+1)
	for i, n := range lens {
		offs[i+1] = offs[i] + int64(a.SequenceRows(n))
	}
	return offs
}

// formatVersion is the store format version that introduced a.
func (a Alignment) formatVersion() int {
	if a == AlignNextToken {
		return 2
	}
	return 1
}

// SiteInfo describes the activations stored for one site of one layer.
type SiteInfo struct {
	Layer int    `json:"layer"`
	Site  string `json:"site"`
	Cols  int    `json:"cols"`
	// Tokens is the number of rows of the site: the store's token count
	// for AlignToken, fewer for AlignNextToken.
	Tokens    int64       `json:"tokens"`
	DType     string      `json:"dtype"`
	Alignment Alignment   `json:"alignment"`
	Shards    []ShardInfo `json:"shards"`
}

// ShardInfo is one file of a site: rows FirstToken … FirstToken+Tokens−1.
type ShardInfo struct {
	File       string `json:"file"`
	FirstToken int64  `json:"first_token"`
	Tokens     int64  `json:"tokens"`
	// SHA256 is given for the part files of a split build's worker (see
	// StoreOptions.Shard), never in a store's index.
	SHA256 string `json:"sha256,omitempty"`
}

// siteJSON is a site as the index lists it: the alignment is omitted for
// AlignToken, so that a store of token-aligned sites reads as version 1.
type siteJSON struct {
	Layer     int         `json:"layer"`
	Site      string      `json:"site"`
	Cols      int         `json:"cols"`
	Tokens    int64       `json:"tokens"`
	DType     string      `json:"dtype"`
	Alignment string      `json:"alignment,omitempty"`
	Shards    []ShardInfo `json:"shards"`
}

type storeIndex struct {
	Format          string     `json:"format"`
	FormatVersion   int        `json:"format_version"`
	Provenance      Provenance `json:"provenance"`
	SequenceLengths []int      `json:"sequence_lengths"`
	Sites           []siteJSON `json:"sites"`
}

// StoreOptions configures a StoreWriter.
type StoreOptions struct {
	// DType of the stored activations: safetensors.BF16 (default) or F32.
	DType safetensors.DType
	// ShardBytes bounds the activation bytes of one shard file; 0 selects
	// 256 MiB. Rows go to the file as they are written: the writer's
	// memory does not grow with the shard size.
	ShardBytes int64
	// Faults, when set, wraps the writer of every file the store writes
	// (activation bytes of a shard, the index), by the file's path. It
	// exists for fault injection: tests make it fail as a full disk
	// would. Nil in normal use.
	Faults atomicfile.Faults
	// Shard, when it names one of several workers (Count > 1), makes the
	// writer that worker of a split build (see AssembleStore): its sites
	// receive the rows of the worker's sequences only (Sequences), written
	// as parts, and Close writes the worker's record instead of the index.
	// The zero Spec and 0/1 are the whole store.
	Shard shard.Spec
	// Tool and Build, for a split build, identify the program and the
	// build (the builder's description of its inputs and options) in the
	// worker's record: every worker's must be the same.
	Tool  string
	Build json.RawMessage
}

// StoreWriter writes a calibration store directory. Sites are written with
// BeginSite / SiteWriter.Write / SiteWriter.Close, several at a time if
// need be; Close writes the index last, so a directory without
// calibration.json is an incomplete store.
type StoreWriter struct {
	dir     string
	opt     StoreOptions
	prov    Provenance
	lens    []int
	sites   []SiteInfo
	open    map[string]*SiteWriter
	closed  bool
	seen    map[string]bool
	aborted bool
	part    *storePart // a split build's worker
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
	if opt.Shard != (shard.Spec{}) && !opt.Shard.Valid() {
		return nil, fmt.Errorf("calib: store: worker %s names no worker", opt.Shard)
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
	w := &StoreWriter{dir: dir, opt: opt, prov: prov, lens: append([]int(nil), seqLens...),
		open: map[string]*SiteWriter{}, seen: map[string]bool{}}
	if w.opt.Shard.Count > 1 {
		if err := w.startPart(tokenIDs); err != nil {
			return nil, err
		}
		return w, nil
	}
	if err := writeSequencesFile(dir, prov, seqLens, tokenIDs); err != nil {
		return nil, err
	}
	return w, nil
}

// writeSequencesFile writes the store's sequences file: the boundaries,
// and the token ids when known.
func writeSequencesFile(dir string, prov Provenance, seqLens []int, tokenIDs [][]int32) error {
	total := prov.Tokens
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
	if err := safetensors.WriteFile(filepath.Join(dir, StoreSequencesName), tensors, storeMetadata(prov, -1, "", AlignToken, 0, 0)); err != nil {
		return fmt.Errorf("calib: writing %s: %w", StoreSequencesName, err)
	}
	return nil
}

// storeMetadata returns the __metadata__ of a store file: the sequences
// file (layer < 0) or a shard.
func storeMetadata(p Provenance, layer int, site string, align Alignment, first, rows int64) map[string]string {
	md := map[string]string{
		"format":                         StoreFormat,
		"ttquant.calib.version":          strconv.Itoa(align.formatVersion()),
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
		if align != AlignToken {
			md["ttquant.calib.alignment"] = align.String()
		}
	}
	return md
}

var siteNameRE = regexp.MustCompile(`^[a-z0-9_]+(\.[a-z0-9_]+)*$`)

// ShardName is the file name of shard k of a site.
func ShardName(layer int, site string, k int) string {
	return fmt.Sprintf("layer%03d.%s.%05d.safetensors", layer, site, k)
}

// SiteWriter receives the activations of one site, row by row, in row
// order. Rows are converted and handed to the shard file being written as
// they arrive; the writer holds at most about one MiB of them.
type SiteWriter struct {
	w        *StoreWriter
	info     SiteInfo
	want     int64 // rows the site must receive
	perShard int64
	written  int64
	cur      *shardStream
	// A split build's worker writes parts instead of shards: plans are
	// its units' parts of the site, pk the one being written (pcur).
	plans []partPlan
	pk    int
	pcur  *atomicfile.File
	pgot  int64
	buf   []byte
	done  bool
	err   error // sticky: the first failure
}

// shardStream is one shard file being written: its safetensors writer runs
// in its own goroutine and reads the activation bytes from a pipe.
type shardStream struct {
	name             string
	first, rows, got int64
	pw               *io.PipeWriter
	done             chan error
}

// errAborted ends a shard whose site was abandoned.
var errAborted = errors.New("calib: store: site abandoned")

// BeginSite starts the activations of site at layer, cols features per
// token, one row per calibration token (AlignToken).
func (w *StoreWriter) BeginSite(layer int, site string, cols int) (*SiteWriter, error) {
	return w.BeginAlignedSite(layer, site, cols, AlignToken)
}

// BeginAlignedSite starts a site whose rows align with the tokens as align
// says. Several sites may be open at once; each must be closed before
// the store is.
func (w *StoreWriter) BeginAlignedSite(layer int, site string, cols int, align Alignment) (*SiteWriter, error) {
	if w.closed || w.aborted {
		return nil, errors.New("calib: store writer is closed")
	}
	if err := w.checkNewSite(layer, site, cols, align); err != nil {
		return nil, err
	}
	key := fmt.Sprintf("%d/%s", layer, site)
	w.seen[key] = true
	s := &SiteWriter{w: w, info: SiteInfo{Layer: layer, Site: site, Cols: cols, DType: w.opt.DType.String(), Alignment: align},
		want: align.rowOffsets(w.lens)[len(w.lens)]}
	s.perShard = max(1, w.opt.ShardBytes/s.rowBytes())
	if w.part != nil {
		s.plans = w.part.plans(align.rowOffsets(w.lens))
		s.want = 0
		for _, p := range s.plans {
			s.want += p.rows
		}
	}
	w.open[key] = s
	return s, nil
}

func (w *StoreWriter) checkNewSite(layer int, site string, cols int, align Alignment) error {
	if layer < 0 || layer > 99999 {
		return fmt.Errorf("calib: store: layer %d out of range", layer)
	}
	if !siteNameRE.MatchString(site) {
		return fmt.Errorf("calib: store: site name %q must be dot-separated [a-z0-9_] words", site)
	}
	if cols <= 0 {
		return fmt.Errorf("calib: store: site %d/%s: %d columns", layer, site, cols)
	}
	if !align.Valid() {
		return fmt.Errorf("calib: store: site %d/%s: invalid alignment %d", layer, site, uint8(align))
	}
	if key := fmt.Sprintf("%d/%s", layer, site); w.seen[key] {
		return fmt.Errorf("calib: store: site %s written twice", key)
	}
	return nil
}

// AddWrittenSite lists a site whose shards are already in the store
// directory (written by an earlier, interrupted run of the same build).
// Every shard is checked against si and the store's provenance first.
func (w *StoreWriter) AddWrittenSite(si SiteInfo) error {
	if w.closed || w.aborted {
		return errors.New("calib: store writer is closed")
	}
	if err := w.checkNewSite(si.Layer, si.Site, si.Cols, si.Alignment); err != nil {
		return err
	}
	key := fmt.Sprintf("%d/%s", si.Layer, si.Site)
	if si.DType != w.opt.DType.String() {
		return fmt.Errorf("calib: store: site %s has dtype %s, the store %s", key, si.DType, w.opt.DType)
	}
	if want := si.Alignment.rowOffsets(w.lens)[len(w.lens)]; si.Tokens != want {
		return fmt.Errorf("calib: store: site %s has %d rows, want %d", key, si.Tokens, want)
	}
	if w.part != nil {
		if err := w.checkWrittenParts(si); err != nil {
			return err
		}
	} else {
		if err := checkShardList(w.dir, si); err != nil {
			return err
		}
		for _, sh := range si.Shards {
			if err := checkShardFile(w.dir, w.prov, si, sh); err != nil {
				return err
			}
		}
	}
	w.seen[key] = true
	si.Shards = append([]ShardInfo(nil), si.Shards...)
	w.sites = append(w.sites, si)
	return nil
}

func (s *SiteWriter) rowBytes() int64 { return rowBytes(s.info.Cols, s.w.opt.DType) }

// rowBytes is the size of one stored row of cols values in dt.
func rowBytes(cols int, dt safetensors.DType) int64 { return int64(cols) * int64(dt.Bits()/8) }

// storeDType is the dtype a site's record names, one of the two a store
// holds (BF16, F32); ok is false for any other.
func storeDType(name string) (dt safetensors.DType, ok bool) {
	dt, err := safetensors.ParseDType(name)
	return dt, err == nil && (dt == safetensors.BF16 || dt == safetensors.F32)
}

// Write appends rows (a multiple of the site's columns, row-major).
func (s *SiteWriter) Write(rows []float32) error {
	if s.done {
		return errors.New("calib: store: write to a closed site")
	}
	if s.err != nil {
		return s.err
	}
	c := s.info.Cols
	if len(rows)%c != 0 {
		return fmt.Errorf("calib: store: site %d/%s: %d values is not a whole number of %d-column rows", s.info.Layer, s.info.Site, len(rows), c)
	}
	n := int64(len(rows) / c)
	if s.written+n > s.want {
		return fmt.Errorf("calib: store: site %d/%s: %d rows exceed the site's %d", s.info.Layer, s.info.Site, s.written+n, s.want)
	}
	chunk := max(1, (1<<20)/s.rowBytes())
	if s.w.part != nil {
		return s.writeParts(rows, chunk)
	}
	for len(rows) > 0 {
		if s.cur == nil {
			if err := s.startShard(); err != nil {
				return s.fail(err)
			}
		}
		take := min(int64(len(rows)/c), s.cur.rows-s.cur.got, chunk)
		var err error
		if s.buf, err = safetensors.AppendFloat32s(s.buf[:0], rows[:take*int64(c)], s.w.opt.DType); err != nil {
			return s.fail(fmt.Errorf("calib: store: site %d/%s: %w", s.info.Layer, s.info.Site, err))
		}
		if _, err := s.cur.pw.Write(s.buf); err != nil {
			return s.fail(s.shardError(err))
		}
		s.cur.got += take
		s.written += take
		rows = rows[take*int64(c):]
		if s.cur.got == s.cur.rows {
			if err := s.finishShard(); err != nil {
				return s.fail(err)
			}
		}
	}
	return nil
}

// startShard opens the next shard file: the rows it will hold are known,
// so its header is written first and the rows stream after it.
func (s *SiteWriter) startShard() error {
	first := s.written
	rows := min(s.perShard, s.want-first)
	name := ShardName(s.info.Layer, s.info.Site, len(s.info.Shards))
	pr, pw := io.Pipe()
	size := rows * s.rowBytes()
	fw, err := createShardFile(s.w.dir, name, s.w.prov, s.info, s.w.opt, first, rows, func(dst io.Writer) error {
		_, err := io.CopyN(dst, pr, size)
		return err
	})
	if err != nil {
		return err
	}
	sh := &shardStream{name: name, first: first, rows: rows, pw: pw, done: make(chan error, 1)}
	go func() {
		err := fw.Close()
		if err != nil {
			pr.CloseWithError(err)
		} else {
			pr.Close()
		}
		sh.done <- err
	}()
	s.cur = sh
	return nil
}

// createShardFile starts shard file name of site si holding rows first …
// first+rows−1: its header is set, and fill writes the rows' bytes (in the
// store's dtype) when the returned writer is closed. The streaming site
// writer and the assembly of a split build both write shards through it.
func createShardFile(dir, name string, prov Provenance, si SiteInfo, opt StoreOptions, first, rows int64, fill func(io.Writer) error) (*safetensors.Writer, error) {
	path := filepath.Join(dir, name)
	fw, err := safetensors.Create(path)
	if err != nil {
		return nil, fmt.Errorf("calib: store: %w", err)
	}
	fw.SetMetadata(storeMetadata(prov, si.Layer, si.Site, si.Alignment, first, rows))
	size := rows * rowBytes(si.Cols, opt.DType)
	err = fw.AddFunc("activations", opt.DType, []int64{rows, int64(si.Cols)}, size, func(dst io.Writer) error {
		return fill(opt.Faults.Wrap(path, dst))
	})
	if err != nil {
		fw.Abort()
		return nil, fmt.Errorf("calib: store: %w", err)
	}
	return fw, nil
}

// shardError is the error of the shard being written after a failed pipe
// write: the file writer's own error when it has one.
func (s *SiteWriter) shardError(werr error) error {
	sh := s.cur
	sh.pw.CloseWithError(werr)
	err := <-sh.done
	s.cur = nil
	if err == nil {
		err = werr
	}
	return fmt.Errorf("calib: store: writing %s: %w", sh.name, err)
}

func (s *SiteWriter) finishShard() error {
	sh := s.cur
	s.cur = nil
	sh.pw.Close()
	if err := <-sh.done; err != nil {
		return fmt.Errorf("calib: store: writing %s: %w", sh.name, err)
	}
	s.info.Shards = append(s.info.Shards, ShardInfo{File: sh.name, FirstToken: sh.first, Tokens: sh.rows})
	return nil
}

// writeParts is Write for a split build's worker: the rows go to the part
// of the unit they belong to, each part a file of the worker's directory
// written through internal/atomicfile, so that it is complete or absent.
func (s *SiteWriter) writeParts(rows []float32, chunk int64) error {
	c := s.info.Cols
	for len(rows) > 0 {
		p := s.plans[s.pk]
		if s.pcur == nil {
			name := partFile(s.w.part.spec, s.info.Layer, s.info.Site, p.unit)
			af, err := s.w.opt.Faults.Create(filepath.Join(s.w.dir, filepath.FromSlash(name)))
			if err != nil {
				return s.fail(fmt.Errorf("calib: store: %w", err))
			}
			s.pcur, s.pgot = af, 0
		}
		take := min(int64(len(rows)/c), p.rows-s.pgot, chunk)
		var err error
		if s.buf, err = safetensors.AppendFloat32s(s.buf[:0], rows[:take*int64(c)], s.w.opt.DType); err != nil {
			return s.fail(fmt.Errorf("calib: store: site %d/%s: %w", s.info.Layer, s.info.Site, err))
		}
		if _, err := s.pcur.Write(s.buf); err != nil {
			return s.fail(fmt.Errorf("calib: store: writing the part of unit %d of site %d/%s: %w", p.unit, s.info.Layer, s.info.Site, err))
		}
		s.pgot += take
		s.written += take
		rows = rows[take*int64(c):]
		if s.pgot == p.rows {
			_, sum, err := s.pcur.Commit()
			s.pcur = nil
			if err != nil {
				return s.fail(fmt.Errorf("calib: store: %w", err))
			}
			s.info.Shards = append(s.info.Shards, ShardInfo{File: partFile(s.w.part.spec, s.info.Layer, s.info.Site, p.unit),
				FirstToken: p.first, Tokens: p.rows, SHA256: sum})
			s.pk++
		}
	}
	return nil
}

// fail records err, abandons the shard in progress (its temporary file is
// removed) and returns err.
func (s *SiteWriter) fail(err error) error {
	if s.pcur != nil {
		s.pcur.Abort()
		s.pcur = nil
	}
	if s.cur != nil {
		s.cur.pw.CloseWithError(errAborted)
		<-s.cur.done
		s.cur = nil
	}
	if s.err == nil {
		s.err = err
	}
	return s.err
}

// Abort abandons the site: the shard in progress is not written (shards
// already finished stay in the directory) and the site is not listed.
func (s *SiteWriter) Abort() {
	if s.done {
		return
	}
	s.fail(errAborted)
	s.done = true
	delete(s.w.open, fmt.Sprintf("%d/%s", s.info.Layer, s.info.Site))
}

// Close finishes the site; it must have received exactly its rows (one
// per calibration token for AlignToken).
func (s *SiteWriter) Close() error {
	if s.done {
		return s.err
	}
	if s.err != nil {
		s.Abort()
		return s.err
	}
	if s.written != s.want {
		s.Abort()
		s.err = fmt.Errorf("calib: store: site %d/%s received %d rows, want %d (%s-aligned, store of %d tokens)", s.info.Layer, s.info.Site, s.written, s.want, s.info.Alignment, s.w.prov.Tokens)
		return s.err
	}
	s.done = true
	delete(s.w.open, fmt.Sprintf("%d/%s", s.info.Layer, s.info.Site))
	s.info.Tokens = s.info.Alignment.rowOffsets(s.w.lens)[len(s.w.lens)] // a worker's too: the whole site's
	s.w.sites = append(s.w.sites, s.info)
	return nil
}

// Info returns the site's description: complete after Close.
func (s *SiteWriter) Info() SiteInfo {
	si := s.info
	si.Shards = append([]ShardInfo(nil), si.Shards...)
	return si
}

// Abort abandons every open site (see SiteWriter.Abort); the index is not
// written. Files already written stay in the directory.
func (w *StoreWriter) Abort() {
	keys := make([]string, 0, len(w.open))
	for k := range w.open {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		w.open[k].Abort()
	}
	w.aborted = true
}

// Close writes the index. Sites are listed by layer, then site name. The
// format version is the lowest that describes every site: 1 when all are
// token-aligned, else 2.
func (w *StoreWriter) Close() error {
	if w.closed {
		return nil
	}
	if w.aborted {
		return errors.New("calib: store writer was aborted")
	}
	if len(w.open) > 0 {
		keys := make([]string, 0, len(w.open))
		for k := range w.open {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return fmt.Errorf("calib: store: site %s was not closed", keys[0])
	}
	w.closed = true
	sortSites(w.sites)
	if w.part != nil {
		return w.closePart()
	}
	return writeStoreIndex(w.dir, w.prov, w.lens, w.sites, w.opt.Faults)
}

// sortSites orders sites by layer, then site name, as the index lists them.
func sortSites(sites []SiteInfo) {
	sort.Slice(sites, func(i, j int) bool {
		a, b := sites[i], sites[j]
		if a.Layer != b.Layer {
			return a.Layer < b.Layer
		}
		return a.Site < b.Site
	})
}

// writeStoreIndex writes the index of a store whose shards are all in dir:
// sites (sorted) as they are listed. It is the last file of a store.
func writeStoreIndex(dir string, prov Provenance, lens []int, sites []SiteInfo, faults atomicfile.Faults) error {
	idx := storeIndex{Format: StoreFormat, FormatVersion: 1, Provenance: prov,
		SequenceLengths: lens, Sites: make([]siteJSON, len(sites))}
	for i, si := range sites {
		sj := siteJSON{Layer: si.Layer, Site: si.Site, Cols: si.Cols, Tokens: si.Tokens, DType: si.DType, Shards: si.Shards}
		if si.Alignment != AlignToken {
			sj.Alignment = si.Alignment.String()
		}
		idx.FormatVersion = max(idx.FormatVersion, si.Alignment.formatVersion())
		idx.Sites[i] = sj
	}
	raw, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	raw = append(raw, '\n')
	if _, err := faults.WriteFile(filepath.Join(dir, StoreIndexName), raw); err != nil {
		return fmt.Errorf("calib: store: %w", err)
	}
	return nil
}

// Store is an open calibration store.
type Store struct {
	dir   string
	idx   storeIndex
	sites []SiteInfo
	offs  []int64
}

// OpenStore opens the store in dir and checks its index: format, version,
// sequence lengths against the provenance, and the shard list of every site
// (contiguous, covering every row its alignment gives). Shard files are
// opened when read. Versions 1 and 2 are read.
func OpenStore(dir string) (*Store, error) {
	path := filepath.Join(dir, StoreIndexName)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, storeErr(ErrStoreIndex, path, err, "")
	}
	var idx storeIndex
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&idx); err != nil {
		return nil, storeErr(ErrStoreIndex, path, err, "")
	}
	if idx.Format != StoreFormat {
		return nil, storeErr(ErrStoreIndex, path, nil, "format %q, want %q", idx.Format, StoreFormat)
	}
	if idx.FormatVersion < 1 || idx.FormatVersion > StoreFormatVersion {
		return nil, storeErr(ErrStoreIndex, path, nil, "format version %d not supported (want 1 … %d)", idx.FormatVersion, StoreFormatVersion)
	}
	p := idx.Provenance
	if len(idx.SequenceLengths) != p.Sequences {
		return nil, storeErr(ErrStoreIndex, path, nil, "%d sequence lengths for %d sequences", len(idx.SequenceLengths), p.Sequences)
	}
	s := &Store{dir: dir, idx: idx, offs: make([]int64, len(idx.SequenceLengths)+1)}
	for i, n := range idx.SequenceLengths {
		if n <= 0 {
			return nil, storeErr(ErrStoreIndex, path, nil, "sequence %d has length %d", i, n)
		}
		s.offs[i+1] = s.offs[i] + int64(n)
	}
	if s.offs[len(s.offs)-1] != p.Tokens {
		return nil, storeErr(ErrStoreIndex, path, nil, "sequence lengths sum to %d, provenance says %d tokens", s.offs[len(s.offs)-1], p.Tokens)
	}
	seen := map[string]bool{}
	for _, sj := range idx.Sites {
		key := fmt.Sprintf("%d/%s", sj.Layer, sj.Site)
		if seen[key] {
			return nil, siteErr(ErrStoreIndex, path, sj.Layer, sj.Site, nil, "listed twice")
		}
		seen[key] = true
		si := SiteInfo{Layer: sj.Layer, Site: sj.Site, Cols: sj.Cols, Tokens: sj.Tokens, DType: sj.DType, Alignment: AlignToken, Shards: sj.Shards}
		if sj.Alignment != "" {
			if idx.FormatVersion < 2 {
				return nil, siteErr(ErrStoreIndex, path, sj.Layer, sj.Site, nil, "an alignment, which format version %d does not have (2 does)", idx.FormatVersion)
			}
			if si.Alignment, err = ParseAlignment(sj.Alignment); err != nil {
				return nil, siteErr(ErrStoreIndex, path, sj.Layer, sj.Site, err, "")
			}
		}
		want := si.Alignment.rowOffsets(idx.SequenceLengths)[p.Sequences]
		if si.Cols <= 0 || si.Tokens != want {
			return nil, siteErr(ErrStoreIndex, path, sj.Layer, sj.Site, nil, "%d columns and %d rows (%s-aligned, the store's %d tokens in %d sequences give %d)", si.Cols, si.Tokens, si.Alignment, p.Tokens, p.Sequences, want)
		}
		if _, ok := storeDType(si.DType); !ok {
			return nil, siteErr(ErrStoreIndex, path, sj.Layer, sj.Site, nil, "dtype %q (want BF16 or F32)", si.DType)
		}
		if err := checkShardList(path, si); err != nil {
			return nil, err
		}
		s.sites = append(s.sites, si)
	}
	return s, nil
}

// checkShardList checks that a site's shards are plain file names covering
// its rows in order.
func checkShardList(path string, si SiteInfo) error {
	var next int64
	for _, sh := range si.Shards {
		if !validShardName(sh.File) {
			return siteErr(ErrStoreIndex, path, si.Layer, si.Site, nil, "shard name %q is not a plain file name in the store directory (no directories, no \"..\")", sh.File)
		}
		if sh.FirstToken != next || sh.Tokens <= 0 {
			return siteErr(ErrStoreIndex, path, si.Layer, si.Site, nil, "shard %q covers [%d, +%d), expected to start at %d", sh.File, sh.FirstToken, sh.Tokens, next)
		}
		next += sh.Tokens
	}
	if next != si.Tokens {
		return siteErr(ErrStoreIndex, path, si.Layer, si.Site, nil, "shards cover %d of %d rows", next, si.Tokens)
	}
	return nil
}

// Dir returns the store directory.
func (s *Store) Dir() string { return s.dir }

// FormatVersion returns the version of the store's index.
func (s *Store) FormatVersion() int { return s.idx.FormatVersion }

// Provenance returns the store's provenance record.
func (s *Store) Provenance() Provenance { return s.idx.Provenance }

// SequenceOffsets returns the token index where each sequence starts,
// followed by the total token count.
func (s *Store) SequenceOffsets() []int64 { return append([]int64(nil), s.offs...) }

// RowOffsets returns the row of site si where each sequence starts,
// followed by the site's row count: SequenceOffsets for a token-aligned
// site; for AlignNextToken sequence i starts at row offset_i − i.
func (s *Store) RowOffsets(si SiteInfo) []int64 {
	return si.Alignment.rowOffsets(s.idx.SequenceLengths)
}

// RowsBefore returns how many rows of site si belong to the store's first
// tokens token rows (for a token-aligned site, tokens itself; a count
// outside 0 … the store's tokens maps outside the site). Readers that
// take "the first n tokens" of a site (a calibration split ending at a
// sequence boundary) use it for every alignment.
func (s *Store) RowsBefore(si SiteInfo, tokens int64) int64 {
	total := s.offs[len(s.offs)-1]
	switch {
	case si.Alignment == AlignToken || tokens < 0:
		return tokens
	case tokens > total: // outside the site too, so that readers refuse it
		return si.Tokens + tokens - total
	}
	ro := s.RowOffsets(si)
	// i: the sequence holding token row tokens (or the count when past the end).
	i := sort.Search(len(s.offs)-1, func(i int) bool { return s.offs[i+1] > tokens })
	if i >= len(s.offs)-1 {
		return si.Tokens
	}
	n := int64(si.Alignment.SequenceRows(s.idx.SequenceLengths[i]))
	return ro[i] + min(tokens-s.offs[i], n)
}

// Sites lists the stored sites by layer, then name.
func (s *Store) Sites() []SiteInfo { return append([]SiteInfo(nil), s.sites...) }

// Site returns the description of one site.
func (s *Store) Site(layer int, site string) (SiteInfo, bool) {
	for _, si := range s.sites {
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
		return nil, storeErr(ErrStoreTokens, path, err, "")
	}
	defer f.Close()
	ti, ok := f.Lookup("token_ids")
	if !ok {
		return nil, nil
	}
	if ti.DType != safetensors.I32 || len(ti.Shape) != 1 || ti.Shape[0] != s.idx.Provenance.Tokens {
		return nil, storeErr(ErrStoreTokens, path, nil, "token_ids is %v %v, want I32 [%d]", ti.DType, ti.Shape, s.idx.Provenance.Tokens)
	}
	raw, err := f.ReadTensor("token_ids")
	if err != nil {
		return nil, storeErr(ErrStoreTokens, path, err, "")
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
		return nil, storeErr(ErrStoreTokens, path, nil, "token ids hash to %s, provenance says %s", h, s.idx.Provenance.TokenIDsSHA256)
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
		return siteErr(ErrNoSite, s.dir, layer, site, nil, "the store has no such site")
	}
	if first < 0 || n < 0 || first+n > si.Tokens {
		return siteErr(ErrNoSite, s.dir, layer, site, nil, "rows [%d, %d) outside the site's %d tokens", first, first+n, si.Tokens)
	}
	if chunkRows <= 0 {
		chunkRows = 4096
	}
	dt, _ := storeDType(si.DType) // checked when the index was read
	rowBytes := rowBytes(si.Cols, dt)
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
	dt, _ := storeDType(si.DType) // checked when the index was read
	path := filepath.Join(s.dir, sh.File)
	f, err := safetensors.Open(path)
	if err != nil {
		return siteErr(ErrStoreShard, path, si.Layer, si.Site, err, "")
	}
	defer f.Close()
	if err := s.checkShard(f, si, sh); err != nil {
		return err
	}
	sr, err := f.SectionReader("activations")
	if err != nil {
		return siteErr(ErrStoreShard, path, si.Layer, si.Site, err, "")
	}
	for r := a; r < b; {
		k := min(int64(chunkRows), b-r)
		nb := k * rowBytes
		if _, err := sr.ReadAt(buf[:nb], (r-sh.FirstToken)*rowBytes); err != nil {
			return siteErr(ErrStoreShard, path, si.Layer, si.Site, err, "reading rows %d..%d", r, r+k)
		}
		v := vals[:k*int64(si.Cols)]
		if err := safetensors.DecodeFloat32s(v, buf[:nb], dt); err != nil {
			return siteErr(ErrStoreShard, path, si.Layer, si.Site, err, "")
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
	return checkShardHeader(f, s.idx.Provenance, si, sh)
}

// checkShardHeader verifies a shard's metadata and tensor against the
// store's provenance and the site.
func checkShardHeader(f *safetensors.File, p Provenance, si SiteInfo, sh ShardInfo) error {
	path := f.Path()
	md := f.Metadata()
	want := map[string]string{
		"ttquant.calib.model":            p.Model,
		"ttquant.calib.token_ids_sha256": p.TokenIDsSHA256,
		"ttquant.calib.layer":            strconv.Itoa(si.Layer),
		"ttquant.calib.site":             si.Site,
		"ttquant.calib.first_token":      strconv.FormatInt(sh.FirstToken, 10),
		"ttquant.calib.rows":             strconv.FormatInt(sh.Tokens, 10),
		"ttquant.calib.alignment":        "",
	}
	if si.Alignment != AlignToken {
		want["ttquant.calib.alignment"] = si.Alignment.String()
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if md[k] != want[k] {
			return siteErr(ErrStoreShard, path, si.Layer, si.Site, nil, "metadata %s = %q, index says %q", k, md[k], want[k])
		}
	}
	ti, ok := f.Lookup("activations")
	if !ok {
		return siteErr(ErrStoreShard, path, si.Layer, si.Site, nil, "no tensor \"activations\"")
	}
	if ti.DType.String() != si.DType || len(ti.Shape) != 2 || ti.Shape[0] != sh.Tokens || ti.Shape[1] != int64(si.Cols) {
		return siteErr(ErrStoreShard, path, si.Layer, si.Site, nil, "tensor activations is %v %v, want %s [%d, %d]", ti.DType, ti.Shape, si.DType, sh.Tokens, si.Cols)
	}
	return nil
}

// ReadRows returns rows first … first+n−1 of a site as one float32 matrix.
func (s *Store) ReadRows(layer int, site string, first, n int64) ([]float32, error) {
	si, ok := s.Site(layer, site)
	if !ok {
		return nil, siteErr(ErrNoSite, s.dir, layer, site, nil, "the store has no such site")
	}
	if n < 0 || n > math.MaxInt32*8 {
		return nil, siteErr(ErrNoSite, s.dir, layer, site, nil, "%d rows requested", n)
	}
	out := make([]float32, 0, n*int64(si.Cols))
	err := s.Stream(layer, site, first, n, 0, func(_ int64, rows []float32) error {
		out = append(out, rows...)
		return nil
	})
	return out, err
}
