package textcalib

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
	"strings"

	"github.com/ttquant/ttquant/calib"
	"github.com/ttquant/ttquant/internal/atomicfile"
)

// PartialDir is the directory inside an unfinished store that holds what a
// resumed build needs: the build's identity (build.json), one record per
// finished layer (layerNNN.json) and the residual stream entering the next
// layer (inputNNN.f32). It is removed once the index is written.
const PartialDir = calib.StorePartialDir

const (
	buildRecordName   = "build.json"
	buildRecordFormat = "ttquant-calibration-build"
	buildRecordVer    = 1
)

// buildRecord identifies a build: a resumed build must have the same one.
type buildRecord struct {
	Format         string          `json:"format"`
	Version        int             `json:"version"`
	Model          string          `json:"model"`
	ModelRevision  string          `json:"model_revision"`
	Sequences      int             `json:"sequences"`
	Tokens         int64           `json:"tokens"`
	TokenIDsSHA256 string          `json:"token_ids_sha256"`
	DType          string          `json:"dtype"`
	ShardBytes     int64           `json:"shard_bytes"`
	Steps          int             `json:"steps"` // trunk layers, then the MTP layer when it has sites
	Data           json.RawMessage `json:"data"`
}

// diff lists the fields in which b differs from old, saying both values.
func (b *buildRecord) diff(old *buildRecord) []string {
	var d []string
	add := func(name string, was, now any) {
		if fmt.Sprint(was) != fmt.Sprint(now) {
			d = append(d, fmt.Sprintf("%s was %s, now %s", name, short(fmt.Sprint(was)), short(fmt.Sprint(now))))
		}
	}
	add("format", fmt.Sprintf("%s v%d", old.Format, old.Version), fmt.Sprintf("%s v%d", b.Format, b.Version))
	add("model name", old.Model, b.Model)
	add("model identity (config.json and weights)", old.ModelRevision, b.ModelRevision)
	add("sequences", old.Sequences, b.Sequences)
	add("tokens", old.Tokens, b.Tokens)
	add("token ids sha256", old.TokenIDsSHA256, b.TokenIDsSHA256)
	add("dtype", old.DType, b.DType)
	add("shard bytes", old.ShardBytes, b.ShardBytes)
	add("layers with sites", old.Steps, b.Steps)
	if !bytes.Equal(compact(old.Data), compact(b.Data)) {
		var o, n map[string]json.RawMessage
		json.Unmarshal(old.Data, &o)
		json.Unmarshal(b.Data, &n)
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
			ks = []string{"(encoding)"}
		}
		d = append(d, "the data provenance differs in "+strings.Join(ks, ", ")+" (text sources and their sha256s, options, tokenizer)")
	}
	return d
}

// compact is raw without insignificant white space (a record's JSON is
// written indented).
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

// stepRecord is written when a layer's sites are complete.
type stepRecord struct {
	Step  int              `json:"step"`
	Layer int              `json:"layer"`
	Sites []calib.SiteInfo `json:"sites"`
	// Next is the residual stream entering the next step (absent after
	// the last): exact float32 bytes, little-endian, row-major.
	Next *streamFile `json:"next,omitempty"`
}

type streamFile struct {
	File   string `json:"file"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

func stepRecordName(step int) string { return fmt.Sprintf("layer%03d.json", step) }
func inputName(step int) string      { return fmt.Sprintf("input%03d.f32", step) }

// writeJSONFile writes v to path through writeFile.
func writeJSONFile(path string, v any, faults atomicfile.Faults) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = writeFile(path, func(w io.Writer) error {
		_, err := w.Write(append(raw, '\n'))
		return err
	}, faults)
	return err
}

// writeFile writes path through internal/atomicfile (a temporary file,
// synced and renamed into place), so a file of the partial directory is
// complete or absent, and returns its sha256.
func writeFile(path string, fill func(io.Writer) error, faults atomicfile.Faults) (string, error) {
	af, err := faults.Create(path)
	if err != nil {
		return "", fmt.Errorf("textcalib: %w", err)
	}
	bw := bufio.NewWriterSize(af, 1<<20)
	if err = fill(bw); err == nil {
		err = bw.Flush()
	}
	if err != nil {
		af.Abort()
		return "", fmt.Errorf("textcalib: writing %s: %w", path, err)
	}
	_, sum, err := af.Commit()
	if err != nil {
		return "", fmt.Errorf("textcalib: %w", err)
	}
	return sum, nil
}

// writeStream writes x's exact float32 bytes to path and returns its
// description.
func writeStream(path string, x []float32, faults atomicfile.Faults) (*streamFile, error) {
	sum, err := writeFile(path, func(w io.Writer) error {
		buf := make([]byte, 0, 1<<16)
		for i := 0; i < len(x); i += 1 << 14 {
			buf = buf[:0]
			for _, v := range x[i:min(len(x), i+1<<14)] {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			}
			if _, err := w.Write(buf); err != nil {
				return err
			}
		}
		return nil
	}, faults)
	if err != nil {
		return nil, err
	}
	return &streamFile{File: filepath.Base(path), Bytes: 4 * int64(len(x)), SHA256: sum}, nil
}

// readStream reads a residual stream file of n values and checks its size
// and hash.
func readStream(dir string, sf *streamFile, n int64) ([]float32, error) {
	path := filepath.Join(dir, sf.File)
	if sf.Bytes != 4*n {
		return nil, fmt.Errorf("textcalib: %s: the record says %d bytes, the stream has %d values", path, sf.Bytes, n)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Size() != sf.Bytes {
		return nil, fmt.Errorf("textcalib: %s: not the %d bytes its record says (%v)", path, sf.Bytes, err)
	}
	h := sha256.New()
	r := bufio.NewReaderSize(io.TeeReader(f, h), 1<<20)
	x := make([]float32, n)
	buf := make([]byte, 1<<16)
	for i := int64(0); i < n; {
		k := min(int64(len(buf)/4), n-i)
		if _, err := io.ReadFull(r, buf[:4*k]); err != nil {
			return nil, fmt.Errorf("textcalib: reading %s: %w", path, err)
		}
		for j := int64(0); j < k; j++ {
			x[i+j] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*j:]))
		}
		i += k
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sf.SHA256 {
		return nil, fmt.Errorf("textcalib: %s: sha256 %s, its record says %s", path, got, sf.SHA256)
	}
	return x, nil
}

// partialState is what an earlier run left.
type partialState struct {
	build *buildRecord
	steps []*stepRecord // the finished steps, 0 … len−1
}

// readPartial reads the records of an unfinished build in dir (the
// store's PartialDir, or a worker's own directory), or returns nil when
// there are none.
func readPartial(dir string) (*partialState, error) {
	raw, err := os.ReadFile(filepath.Join(dir, buildRecordName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	st := &partialState{build: &buildRecord{}}
	if err := strictJSON(raw, st.build); err != nil {
		return nil, fmt.Errorf("textcalib: %s: %w", filepath.Join(dir, buildRecordName), err)
	}
	for k := 0; ; k++ {
		path := filepath.Join(dir, stepRecordName(k))
		raw, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("textcalib: %w", err)
		}
		rec := &stepRecord{}
		if err := strictJSON(raw, rec); err != nil {
			return nil, fmt.Errorf("textcalib: %s: %w", path, err)
		}
		if rec.Step != k {
			return nil, fmt.Errorf("textcalib: %s records step %d", path, rec.Step)
		}
		st.steps = append(st.steps, rec)
	}
	return st, nil
}

func strictJSON(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

var (
	shardFileRE = regexp.MustCompile(`^\.?layer[0-9]{3,}\..*\.safetensors(\.tmp-.*)?$`)
	// The temporary files: atomicfile's, and ".tmp" as earlier versions
	// named them.
	partialRE = regexp.MustCompile(`^(input[0-9]{3,}\.f32|layer[0-9]{3,}\.json)(\.tmp|\.partial)?$`)
)

// strayShards lists the files of dir named like shards (or their
// temporary files) that keep is missing.
func strayShards(dir string, keep map[string]bool) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("textcalib: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() && shardFileRE.MatchString(e.Name()) && !keep[e.Name()] {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// cleanPartial removes, from the partial directory, step records from
// step on and residual files other than keep.
func cleanPartial(dir string, step int, keep string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("textcalib: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		if !partialRE.MatchString(n) || n == keep {
			continue
		}
		var k int
		if _, err := fmt.Sscanf(n, "layer%d.json", &k); err == nil && !strings.HasSuffix(n, ".tmp") && !strings.HasSuffix(n, atomicfile.Suffix) && k < step {
			continue
		}
		if err := os.Remove(filepath.Join(dir, n)); err != nil {
			return fmt.Errorf("textcalib: %w", err)
		}
	}
	return nil
}

// checkSplitMix refuses a whole build in a directory of split workers and
// a worker in a directory of an unfinished whole build: neither would
// finish the other's store.
func checkSplitMix(out string, split bool) error {
	if !split && calib.HasSplitRecords(out) {
		return fmt.Errorf("textcalib: %s holds the workers of a split store build (%s/shard-*.json); run the workers (--shard) and ttquant assemble, or choose another --out", out, PartialDir)
	}
	if _, err := os.Stat(filepath.Join(out, PartialDir, buildRecordName)); split && err == nil {
		return fmt.Errorf("textcalib: %s holds an unfinished store build of one process (%s/%s); finish it without --shard, or choose another --out", out, PartialDir, buildRecordName)
	}
	return nil
}

// cleanParts removes, from a worker's parts, every file that keep (by its
// path relative to the store, as the records give it) does not list: the
// parts of an unfinished step and the temporary files of interrupted
// writes.
func cleanParts(out, pdir string, keep map[string]bool) error {
	dir := filepath.Join(pdir, "parts")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("textcalib: %w", err)
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		rel, err := filepath.Rel(out, p)
		if err != nil {
			return fmt.Errorf("textcalib: %w", err)
		}
		if e.IsDir() || keep[filepath.ToSlash(rel)] {
			continue
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("textcalib: %w", err)
		}
	}
	return nil
}
