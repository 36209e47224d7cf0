package walk

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
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
	"strings"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/jsonx"
)

// Dir is the directory where a walk keeps what a resumed walk needs:
//
//	walk.json        the walk's Inputs
//	layer-NNN.json   the Record of finished layer NNN
//	stream-NNN.f32   the residual stream leaving layer NNN (stream 0),
//	stream-NNN.K.f32 and stream K > 0 (exact float32, little-endian, row-major)
//
// Every file is written through internal/atomicfile with Faults, so it is
// complete or absent. The caller may keep its own files beside them (other
// names, or directories).
type Dir struct {
	Path   string
	Faults atomicfile.Faults
}

// InputsName is the name of the walk's Inputs in a Dir.
const InputsName = "walk.json"

// ErrDamaged is wrapped by the errors of records and streams that do not
// hold what they should.
var ErrDamaged = errors.New("walk: damaged resume state")

const (
	inputsFormat  = "ttquant-walk"
	inputsVersion = 1
)

// Inputs identifies a walk: a walk resumed from a Dir must have the same.
type Inputs struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// Model and ModelRevision name the model walked through (empty when
	// the caller's own record identifies it).
	Model          string `json:"model,omitempty"`
	ModelRevision  string `json:"model_revision,omitempty"`
	Sequences      int    `json:"sequences"`
	Tokens         int64  `json:"tokens"`
	TokenIDsSHA256 string `json:"token_ids_sha256"`
	// Settings are the caller's options that change what a layer leaves,
	// in the caller's order.
	Settings []Setting `json:"settings,omitempty"`
	// Steps is the number of layers walked.
	Steps int `json:"steps"`
	// Data is the provenance of the text (a JSON object).
	Data json.RawMessage `json:"data"`
}

// Setting is one caller option of Inputs.
type Setting struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Diff lists how in differs from old, the inputs of an interrupted walk:
// each field that differs with both values, and the keys of the data
// provenance that differ. Empty when the walk may resume.
func (in *Inputs) Diff(old *Inputs) []string {
	var d []string
	add := func(name string, was, now any) {
		if fmt.Sprint(was) != fmt.Sprint(now) {
			d = append(d, fmt.Sprintf("%s was %s, now %s", name, short(fmt.Sprint(was)), short(fmt.Sprint(now))))
		}
	}
	add("format", fmt.Sprintf("%s v%d", old.Format, old.Version), fmt.Sprintf("%s v%d", in.Format, in.Version))
	add("model name", old.Model, in.Model)
	add("model identity (config.json and weights)", old.ModelRevision, in.ModelRevision)
	add("sequences", old.Sequences, in.Sequences)
	add("tokens", old.Tokens, in.Tokens)
	add("token ids sha256", old.TokenIDsSHA256, in.TokenIDsSHA256)
	was := map[string]string{}
	for _, s := range old.Settings {
		was[s.Name] = s.Value
	}
	for _, s := range in.Settings {
		add(s.Name, was[s.Name], s.Value)
		delete(was, s.Name)
	}
	for _, s := range old.Settings {
		if v, ok := was[s.Name]; ok {
			add(s.Name, v, "")
		}
	}
	add("layers walked", old.Steps, in.Steps)
	if k := diffKeys(old.Data, in.Data); k != "" {
		d = append(d, "the data provenance differs in "+k+" (text sources and their sha256s, options, tokenizer)")
	}
	return d
}

// diffKeys names the top-level keys in which two JSON objects differ, or
// returns "" when they are equal but for white space.
func diffKeys(old, now json.RawMessage) string {
	if bytes.Equal(compact(old), compact(now)) {
		return ""
	}
	var o, n map[string]json.RawMessage
	json.Unmarshal(old, &o)
	json.Unmarshal(now, &n)
	keys := map[string]bool{}
	for k := range o {
		keys[k] = true
	}
	for k := range n {
		keys[k] = true
	}
	var ks []string
	for k := range keys {
		if !bytes.Equal(compact(o[k]), compact(n[k])) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	if len(ks) == 0 {
		return "(encoding)"
	}
	return strings.Join(ks, ", ")
}

// compact is raw without insignificant white space.
func compact(raw []byte) []byte {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}

func short(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// WriteInputs records the inputs of a walk (its format and version filled
// in).
func (d Dir) WriteInputs(in *Inputs) error {
	in.Format, in.Version = inputsFormat, inputsVersion
	return d.Faults.WriteJSON(filepath.Join(d.Path, InputsName), in)
}

// ReadInputs returns the recorded inputs, or nil when the directory holds
// none.
func (d Dir) ReadInputs() (*Inputs, error) {
	in := &Inputs{}
	if ok, err := readJSON(filepath.Join(d.Path, InputsName), in); !ok || err != nil {
		return nil, err
	}
	return in, nil
}

// readJSON decodes the file path into v, refusing unknown fields; false
// when there is no such file. A file that does not decode is an error
// wrapping ErrDamaged.
func readJSON(path string, v any) (bool, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := jsonx.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("%w: %s: %w", ErrDamaged, path, err)
	}
	return true, nil
}

// NewInputs returns the inputs of a walk of the given sequences and data
// provenance, of the current format.
func NewInputs(w *Walk, tokenIDsSHA256 string, data json.RawMessage) *Inputs {
	return &Inputs{Format: inputsFormat, Version: inputsVersion, Sequences: len(w.IDs), Tokens: w.Tokens,
		TokenIDsSHA256: tokenIDsSHA256, Data: data}
}

// Record is what a finished layer leaves: the caller's data and the
// residual streams leaving the layer (none after the last).
type Record struct {
	Layer   int             `json:"layer"`
	Streams []StreamFile    `json:"streams,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// StreamFile describes a stream file of a Record.
type StreamFile struct {
	File   string `json:"file"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// RecordName is the name of layer l's record.
func RecordName(l int) string { return fmt.Sprintf("layer-%03d.json", l) }

// StreamName is the name of stream k leaving layer l.
func StreamName(l, k int) string {
	if k == 0 {
		return fmt.Sprintf("stream-%03d.f32", l)
	}
	return fmt.Sprintf("stream-%03d.%d.f32", l, k)
}

var (
	recordRE = regexp.MustCompile(`^layer-([0-9]{3,})\.json(` + regexp.QuoteMeta(atomicfile.Suffix) + `)?$`)
	streamRE = regexp.MustCompile(`^stream-([0-9]{3,})(\.[0-9]+)?\.f32(` + regexp.QuoteMeta(atomicfile.Suffix) + `)?$`)
)

// Finish records layer l: the streams leaving it, then the record naming
// them with data (any JSON value), then the removal of the streams leaving
// layer l−1, which a resumed walk no longer needs.
func (d Dir) Finish(l int, data any, streams ...[]float32) error {
	rec := Record{Layer: l}
	if data != nil {
		raw, err := json.Marshal(data)
		if err != nil {
			return err
		}
		rec.Data = raw
	}
	for k, x := range streams {
		sf, err := d.writeStream(StreamName(l, k), x)
		if err != nil {
			return err
		}
		rec.Streams = append(rec.Streams, *sf)
	}
	if err := d.Faults.WriteJSON(filepath.Join(d.Path, RecordName(l)), &rec); err != nil {
		return err
	}
	if l == 0 {
		return nil
	}
	ents, err := os.ReadDir(d.Path)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if m := streamRE.FindStringSubmatch(e.Name()); m != nil && !e.IsDir() {
			if k, _ := strconv.Atoi(m[1]); k == l-1 {
				os.Remove(filepath.Join(d.Path, e.Name()))
			}
		}
	}
	return nil
}

// Record returns layer l's record, nil when there is none; one that does
// not decode or names another layer is an error wrapping ErrDamaged.
func (d Dir) Record(l int) (*Record, error) {
	path := filepath.Join(d.Path, RecordName(l))
	r := &Record{}
	if ok, err := readJSON(path, r); !ok || err != nil {
		return nil, err
	}
	if r.Layer != l {
		return nil, fmt.Errorf("%w: %s records layer %d", ErrDamaged, path, r.Layer)
	}
	return r, nil
}

// Records returns the records of the finished layers 0, 1, … up to the
// first missing one. At a damaged record it returns those before it and
// the error (wrapping ErrDamaged).
func (d Dir) Records() ([]*Record, error) {
	var out []*Record
	for l := 0; ; l++ {
		r, err := d.Record(l)
		if err != nil || r == nil {
			return out, err
		}
		out = append(out, r)
	}
}

// Streams reads the streams of r, of values[k] float32 values each, and
// checks their sizes and hashes (an error wrapping ErrDamaged when one
// does not match its record).
func (d Dir) Streams(r *Record, values ...int64) ([][]float32, error) {
	if len(r.Streams) != len(values) {
		return nil, fmt.Errorf("%w: %s records %d residual streams, the walk keeps %d", ErrDamaged, filepath.Join(d.Path, RecordName(r.Layer)), len(r.Streams), len(values))
	}
	out := make([][]float32, len(values))
	for k, n := range values {
		x, err := d.readStream(&r.Streams[k], n)
		if err != nil {
			return nil, err
		}
		out[k] = x
	}
	return out, nil
}

// Clean removes what an interrupted layer may have left before a walk
// resumes at layer start: the records from start on, every stream but
// those leaving layer start−1, and their temporary files. Other files are
// the caller's and are left alone.
func (d Dir) Clean(start int) error {
	ents, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		n := e.Name()
		if m := recordRE.FindStringSubmatch(n); m != nil {
			if k, _ := strconv.Atoi(m[1]); k < start && m[2] == "" {
				continue
			}
		} else if m := streamRE.FindStringSubmatch(n); m != nil {
			if k, _ := strconv.Atoi(m[1]); k == start-1 && m[3] == "" {
				continue
			}
		} else {
			continue
		}
		if err := os.Remove(filepath.Join(d.Path, n)); err != nil {
			return err
		}
	}
	return nil
}

// writeStream writes x's exact float32 bytes to the file name of d.
func (d Dir) writeStream(name string, x []float32) (*StreamFile, error) {
	path := filepath.Join(d.Path, name)
	af, err := d.Faults.Create(path)
	if err != nil {
		return nil, err
	}
	bw := bufio.NewWriterSize(af, 1<<20)
	buf := make([]byte, 0, 1<<16)
	for i := 0; i < len(x) && err == nil; i += 1 << 14 {
		buf = buf[:0]
		for _, v := range x[i:min(len(x), i+1<<14)] {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
		_, err = bw.Write(buf)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		af.Abort()
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	_, sum, err := af.Commit()
	if err != nil {
		return nil, err
	}
	return &StreamFile{File: name, Bytes: 4 * int64(len(x)), SHA256: sum}, nil
}

// readStream reads a stream file of n values and checks its size and
// hash.
func (d Dir) readStream(sf *StreamFile, n int64) ([]float32, error) {
	path := filepath.Join(d.Path, sf.File)
	if sf.Bytes != 4*n || filepath.Base(sf.File) != sf.File {
		return nil, fmt.Errorf("%w: %s: the record says %d bytes, the stream has %d values", ErrDamaged, path, sf.Bytes, n)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Size() != sf.Bytes {
		return nil, fmt.Errorf("%w: %s: not the %d bytes its record says (%v)", ErrDamaged, path, sf.Bytes, err)
	}
	h := sha256.New()
	r := bufio.NewReaderSize(io.TeeReader(f, h), 1<<20)
	x := make([]float32, n)
	buf := make([]byte, 1<<16)
	for i := int64(0); i < n; {
		k := min(int64(len(buf)/4), n-i)
		if _, err := io.ReadFull(r, buf[:4*k]); err != nil {
			return nil, fmt.Errorf("%w: reading %s: %w", ErrDamaged, path, err)
		}
		for j := int64(0); j < k; j++ {
			x[i+j] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*j:]))
		}
		i += k
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sf.SHA256 {
		return nil, fmt.Errorf("%w: %s: sha256 %s, its record says %s", ErrDamaged, path, got, sf.SHA256)
	}
	return x, nil
}
