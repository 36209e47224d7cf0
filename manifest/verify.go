package manifest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/par"
	"github.com/ttquant/ttquant/safetensors"
)

// VerifyOptions configure Verify.
type VerifyOptions struct {
	// Workers is the number of files checked at once (default 1).
	Workers int
	// AllowSymlinks accepts symbolic links that resolve to regular files
	// inside the checkpoint directory; without it every symbolic link is
	// refused. Links pointing outside are refused either way.
	AllowSymlinks bool
	// MaxManifestBytes caps the manifest's size (0:
	// DefaultMaxManifestBytes); a larger one is refused unread.
	MaxManifestBytes int64
}

// Validate reports a negative worker count or manifest cap (0 selects the
// default).
func (o VerifyOptions) Validate() error {
	if o.Workers < 0 || o.MaxManifestBytes < 0 {
		return fmt.Errorf("manifest: verify options: %d workers and a manifest cap of %d bytes: neither may be negative", o.Workers, o.MaxManifestBytes)
	}
	return nil
}

// Failure is one failed check.
type Failure struct {
	File   string `json:"file,omitempty"`
	Tensor string `json:"tensor,omitempty"`
	What   string `json:"what"`
}

func (f Failure) String() string {
	var b strings.Builder
	if f.File != "" {
		b.WriteString(f.File)
		b.WriteString(": ")
	}
	if f.Tensor != "" {
		b.WriteString("tensor ")
		b.WriteString(f.Tensor)
		b.WriteString(": ")
	}
	b.WriteString(f.What)
	return b.String()
}

// VerifyReport is the result of Verify. OK is true only when Failures is
// empty.
type VerifyReport struct {
	Dir string `json:"dir"`
	OK  bool   `json:"ok"`
	// Incomplete is set when the directory holds an unfinished build.
	Incomplete    bool   `json:"incomplete"`
	Identity      string `json:"identity,omitempty"`
	CacheKey      string `json:"cache_key,omitempty"`
	Files         int    `json:"files"`
	Tensors       int    `json:"tensors"`
	Bytes         int64  `json:"bytes"`
	SourceChecked bool   `json:"source_checked"`
	// NonFinite lists the tensors stored although their source holds NaN
	// or Inf (a build with --allow-nonfinite): they verify, but hold
	// non-finite values a runtime must expect.
	NonFinite []string  `json:"nonfinite_tensors"`
	Failures  []Failure `json:"failures"`
}

// ErrNotCheckpoint is returned by Verify when the directory does not exist
// or is empty.
var ErrNotCheckpoint = errors.New("not a native checkpoint")

var hexRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Verify checks a native checkpoint directory: the manifest's schema and
// layout, every file's size and hash, every tensor's byte range and hash,
// that the directory holds exactly the listed files, that each data file is
// a safetensors file whose header agrees with the manifest, and that every
// BFP tensor decodes to finite values where the source was finite. The
// comparison with the source checkpoint is build.Verify's (it re-applies
// the plan, which this package does not know; see docs/checkpoint.md).
//
// The directory is treated as untrusted: only regular files are opened
// (named pipes, sockets and devices are reported without opening them),
// symbolic links are refused unless opt.AllowSymlinks lets those that stay
// inside the directory through, the manifest's size is capped, and hashing
// checks ctx at least every few MiB.
//
// Failed checks are listed in the report; the error is non-nil only when
// verification could not run (no such directory, unreadable source,
// cancellation).
func Verify(ctx context.Context, dir string, opt VerifyOptions) (*VerifyReport, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if opt.Workers == 0 {
		opt.Workers = 1
	}
	rep := &VerifyReport{Dir: dir, Failures: []Failure{}}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotCheckpoint, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a directory", ErrNotCheckpoint, dir)
	}
	onDisk, partial, refused, err := listFiles(dir, opt.AllowSymlinks)
	if err != nil {
		return nil, err
	}
	fail := func(f Failure) { rep.Failures = append(rep.Failures, f) }
	var data []byte
	if r, ok := refused[ManifestName]; ok {
		fail(Failure{File: ManifestName, What: r})
		return finish(rep), nil
	}
	data, err = ReadManifestFile(filepath.Join(dir, ManifestName), opt.MaxManifestBytes)
	var tooLarge *manifestTooLargeError
	if errors.As(err, &tooLarge) {
		fail(Failure{File: ManifestName, What: fmt.Sprintf("%d bytes, over the %d-byte limit for a manifest; refused without reading it", tooLarge.size, tooLarge.max)})
		return finish(rep), nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return unfinished(rep, onDisk, partial, refused)
	} else if err != nil {
		return nil, err
	}
	rep.Identity = Identity(data)
	rep.CacheKey = CacheKey(rep.Identity)
	if len(partial) > 0 {
		rep.Incomplete = true
		for _, p := range partial {
			fail(Failure{File: p, What: "incomplete: leftover of an unfinished write"})
		}
	}
	if err := checkIntegrity(data); err != nil {
		fail(Failure{File: ManifestName, What: err.Error()})
	}
	m, err := DecodeManifest(data)
	if err != nil {
		fail(Failure{File: ManifestName, What: "schema: " + err.Error()})
		return finish(rep), nil
	}
	rep.Files = len(m.Files) + 1
	rep.Tensors = len(m.Tensors)
	rep.NonFinite = append([]string{}, m.TTQuant.NonFinite...)
	for _, f := range checkSchema(m) {
		fail(f)
	}

	toCheck, present := filesOnDisk(rep, m, onDisk, refused)
	rep.Bytes += int64(len(data))

	// SHA256SUMS must be exactly the rendering of the manifest's file list.
	var rest []FileEntry
	for _, f := range m.Files {
		if f.Name != SumsName {
			rest = append(rest, f)
		}
	}
	if present[SumsName] {
		if got, err := ReadManifestFile(filepath.Join(dir, SumsName), opt.MaxManifestBytes); err == nil && !bytes.Equal(got, EncodeSums(rest)) {
			fail(Failure{File: SumsName, What: "does not match the manifest's file list"})
		}
	}

	byFile := map[string][]TensorEntry{}
	for _, t := range m.Tensors {
		byFile[t.File] = append(byFile[t.File], t)
	}
	perFile := make([][]Failure, len(toCheck))
	err = par.For(ctx, len(toCheck), opt.Workers, func(i int) error {
		var err error
		perFile[i], err = checkFile(ctx, dir, toCheck[i], byFile[toCheck[i].Name])
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, fs := range perFile {
		rep.Failures = append(rep.Failures, fs...)
	}
	return finish(rep), nil
}

// unfinished reports a directory without a manifest: an unfinished build
// when it holds a trace of one, otherwise not a checkpoint.
func unfinished(rep *VerifyReport, onDisk, partial []string, refused map[string]string) (*VerifyReport, error) {
	if len(onDisk) == 0 && len(partial) == 0 && len(refused) == 0 {
		return nil, fmt.Errorf("%w: %s is empty", ErrNotCheckpoint, rep.Dir)
	}
	ours := len(partial) > 0
	for _, n := range onDisk {
		if n == SumsName || strings.HasPrefix(n, "experts-l") || strings.HasPrefix(n, "dense-") {
			ours = true
		}
	}
	if !ours {
		return nil, fmt.Errorf("%w: %s has no %s and no trace of a ttquant build", ErrNotCheckpoint, rep.Dir, ManifestName)
	}
	rep.Incomplete = true
	what := fmt.Sprintf("incomplete: no %s; the build that wrote this directory did not finish (%d files present", ManifestName, len(onDisk))
	if len(partial) > 0 {
		what += fmt.Sprintf(", %d unfinished", len(partial))
	}
	what += "); re-run the build to resume it"
	rep.Failures = append(rep.Failures, Failure{File: ManifestName, What: what})
	return rep, nil
}

// filesOnDisk compares the files on disk with the manifest's list: refused
// entries are reported once, as what they are, and never opened; extra and
// missing files are failures. It returns the listed files to check, adding
// their sizes to rep.Bytes, and the names present.
func filesOnDisk(rep *VerifyReport, m *Manifest, onDisk []string, refused map[string]string) ([]FileEntry, map[string]bool) {
	fail := func(f Failure) { rep.Failures = append(rep.Failures, f) }
	listed := map[string]FileEntry{}
	for _, f := range m.Files {
		listed[f.Name] = f
	}
	for _, name := range sortedKeys(refused) {
		fail(Failure{File: name, What: refused[name]})
	}
	present := map[string]bool{}
	for _, name := range onDisk {
		present[name] = true
		if name == ManifestName {
			continue
		}
		if _, ok := listed[name]; !ok {
			fail(Failure{File: name, What: "extra file: not listed in the manifest"})
		}
	}
	var toCheck []FileEntry
	for _, f := range m.Files {
		if !validRelName(f.Name) {
			continue // reported by checkSchema
		}
		if _, ok := refused[f.Name]; ok {
			continue
		}
		if !present[f.Name] {
			fail(Failure{File: f.Name, What: "missing file: listed in the manifest but not present"})
			continue
		}
		toCheck = append(toCheck, f)
		rep.Bytes += f.Size
	}
	return toCheck, present
}

func finish(rep *VerifyReport) *VerifyReport {
	sort.SliceStable(rep.Failures, func(i, j int) bool {
		a, b := rep.Failures[i], rep.Failures[j]
		if a.File != b.File {
			return a.File < b.File
		}
		return a.Tensor < b.Tensor
	})
	rep.OK = len(rep.Failures) == 0
	return rep
}

// listFiles returns every regular file under dir (relative, slash
// separated, sorted), separately the leftovers of unfinished writes (the
// bookkeeping directory, *.partial files and a lock file), and the entries
// refused without being opened, with why: named pipes, sockets, devices,
// and symbolic links (all of them, or with allowSymlinks those that do not
// resolve to a regular file inside dir).
func listFiles(dir string, allowSymlinks bool) (files, partial []string, refused map[string]string, err error) {
	refused = map[string]string{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if d.IsDir() {
			if rel == PartialDir {
				partial = append(partial, rel+"/")
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, PartialSuffix) || rel == fslock.Name {
			partial = append(partial, rel)
			return nil
		}
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			if !allowSymlinks {
				refused[rel] = "a symbolic link; refused (verify --allow-symlinks accepts links that stay inside the checkpoint)"
				return nil
			}
			if ok, why := insideDir(dir, p); !ok {
				refused[rel] = why
				return nil
			}
		case !t.IsRegular():
			refused[rel] = fileKind(t) + ", not a regular file; refused without opening"
			return nil
		}
		files = append(files, rel)
		return nil
	})
	sort.Strings(files)
	sort.Strings(partial)
	return files, partial, refused, err
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var knownFormats = map[string]bool{"BFP8_b": true, "BFP4_b": true, "BFP2_b": true, "BF16": true, "F32": true, "AS_IS": true}

// ParseBFP returns the BFP format of a recorded format name.
func ParseBFP(s string) (bfp.Format, bool) {
	if !strings.HasPrefix(s, "BFP") {
		return 0, false
	}
	f, err := bfp.ParseFormat(s)
	return f, err == nil
}

// checkSchema checks the manifest on its own: names, hashes, formats,
// geometry, byte ranges and the grouped layout.
func checkSchema(m *Manifest) []Failure {
	var out []Failure
	bad := func(file, tensor, format string, args ...any) {
		out = append(out, Failure{File: file, Tensor: tensor, What: fmt.Sprintf(format, args...)})
	}
	if m.Tool.Name == "" {
		bad(ManifestName, "", "schema: tool.name is empty")
	}
	if !hexRe.MatchString(m.Source.Identity) {
		bad(ManifestName, "", "schema: source.identity is not a sha256")
	}
	if !hexRe.MatchString(m.Plan.SHA256) {
		bad(ManifestName, "", "schema: plan.sha256 is not a sha256")
	}
	if m.Layout.ExpertsPerFile <= 0 {
		bad(ManifestName, "", "schema: layout.experts_per_file must be positive")
	}
	if e := m.TTQuant.Options.BFPExponent; e != "" && !slices.Contains(BFPExponentRules, e) {
		bad(ManifestName, "", "schema: ttquant.options.bfp_exponent %q (want %s, or none for the largest magnitude's exponent)", e, strings.Join(BFPExponentRules, " or "))
	}
	if c := m.TTQuant.Calibration; c != nil {
		for _, w := range calibrationPaths(c.Data) {
			bad(ManifestName, "", "schema: ttquant.calibration.data records %s: the manifest records content only, never a path or spec as typed (docs/checkpoint.md)", w)
		}
	}
	files := map[string]FileEntry{}
	sawSums := false
	for _, f := range m.Files {
		if !validRelName(f.Name) || f.Name == ManifestName {
			bad(ManifestName, "", "schema: invalid file name %q", f.Name)
			continue
		}
		if _, dup := files[f.Name]; dup {
			bad(ManifestName, "", "schema: file %s listed twice", f.Name)
		}
		files[f.Name] = f
		if !hexRe.MatchString(f.SHA256) {
			bad(f.Name, "", "schema: sha256 %q is not a lowercase hex sha256", f.SHA256)
		}
		if f.Size < 0 {
			bad(f.Name, "", "schema: negative size")
		}
		switch f.Role {
		case FileExperts, FileDense, FileConfig:
		case FileChecksum:
			sawSums = f.Name == SumsName
		default:
			bad(f.Name, "", "schema: unknown role %q", f.Role)
		}
	}
	if !sawSums {
		bad(ManifestName, "", "schema: %s is not listed", SumsName)
	}
	seen := map[string]bool{}
	type rng struct {
		off, end int64
		name     string
	}
	ranges := map[string][]rng{}
	for _, t := range m.Tensors {
		if seen[t.Name] {
			bad(t.File, t.Name, "schema: tensor listed twice")
		}
		seen[t.Name] = true
		f, ok := files[t.File]
		if !ok {
			bad(t.File, t.Name, "schema: tensor's file is not listed")
			continue
		}
		if f.Role != FileExperts && f.Role != FileDense {
			bad(t.File, t.Name, "schema: tensor stored in a %s file", f.Role)
		}
		if t.Rule < 0 || t.Rule >= len(m.Plan.Rules) {
			bad(t.File, t.Name, "schema: rule %d out of range (plan has %d rules)", t.Rule, len(m.Plan.Rules))
		}
		if !hexRe.MatchString(t.SHA256) {
			bad(t.File, t.Name, "schema: sha256 is not a lowercase hex sha256")
		}
		if t.Offset < 0 || t.Length < 0 || t.Offset+t.Length > f.Size {
			bad(t.File, t.Name, "byte range [%d, %d) is outside the file (%d bytes)", t.Offset, t.Offset+t.Length, f.Size)
		}
		ranges[t.File] = append(ranges[t.File], rng{t.Offset, t.Offset + t.Length, t.Name})
		checkEntry(m, t, f, bad)
	}
	for file, rs := range ranges {
		sort.Slice(rs, func(i, j int) bool { return rs[i].off < rs[j].off })
		for i := 1; i < len(rs); i++ {
			if rs[i].off < rs[i-1].end {
				bad(file, rs[i].name, "byte range overlaps tensor %s", rs[i-1].name)
			}
		}
	}
	checkRecords(m, seen, bad)
	return out
}

// checkRecords checks the manifest's records about stored tensors (seen):
// the matrix statistics and their fits, and the list of tensors from a
// non-finite source (a tensor stored from one only when the build was told
// to, and then listed).
func checkRecords(m *Manifest, seen map[string]bool, bad func(file, tensor, format string, args ...any)) {
	for _, ms := range m.TTQuant.Matrices {
		if !seen[ms.Tensor] {
			bad(ManifestName, ms.Tensor, "schema: statistics for a tensor that is not stored")
		}
		switch {
		case ms.Fit != "" && ms.Fit != FitAsymmetric:
			bad(ManifestName, ms.Tensor, "schema: fit %q (want %q or none)", ms.Fit, FitAsymmetric)
		case ms.Fit == FitAsymmetric && (ms.Method != MethodGPTQ || !m.TTQuant.Options.Asymmetric):
			bad(ManifestName, ms.Tensor, "schema: fitted asymmetrically, but method %s and options.asymmetric %v (want gptq and true)", ms.Method, m.TTQuant.Options.Asymmetric)
		}
	}
	// A tensor from a non-finite source is stored only when the build was
	// told to, and then it is listed.
	listedNonFinite := map[string]bool{}
	for _, n := range m.TTQuant.NonFinite {
		listedNonFinite[n] = true
	}
	for _, t := range m.Tensors {
		if t.Finite {
			continue
		}
		if !listedNonFinite[t.Name] {
			bad(t.File, t.Name, "schema: the source holds NaN or Inf, and the tensor is not listed in ttquant.nonfinite_tensors")
		}
		delete(listedNonFinite, t.Name)
	}
	for _, n := range sortedKeys(listedNonFinite) {
		bad(ManifestName, n, "schema: listed in ttquant.nonfinite_tensors but not a stored tensor with a non-finite source")
	}
}

// checkEntry checks one stored tensor of the manifest against its format
// (geometry and length of BFP tiles, dtype and length otherwise) and the
// layout (routed experts in their group file, the rest in dense shards).
func checkEntry(m *Manifest, t TensorEntry, f FileEntry, bad func(file, tensor, format string, args ...any)) {
	for _, d := range t.Shape {
		if d < 0 {
			bad(t.File, t.Name, "schema: negative dimension in shape %v", t.Shape)
		}
	}
	if !knownFormats[t.Format] {
		bad(t.File, t.Name, "schema: unknown format %q", t.Format)
		return
	}
	if f, isBFP := ParseBFP(t.Format); isBFP {
		if t.Method != MethodRTN && t.Method != MethodGPTQ {
			bad(t.File, t.Name, "schema: method %q for a BFP tensor", t.Method)
		}
		if t.DType != "U8" {
			bad(t.File, t.Name, "schema: BFP tensor stored as %s, want U8", t.DType)
		}
		tile, err := bfp.ParseTile(t.Tile)
		if err != nil {
			bad(t.File, t.Name, "schema: tile %q: %v", t.Tile, err)
			return
		}
		if t.Orientation != OrientRow && t.Orientation != OrientTransposed {
			bad(t.File, t.Name, "schema: orientation %q", t.Orientation)
			return
		}
		padded, size, err := PackedGeometry(f, tile, t.Shape, t.Orientation)
		if err != nil {
			bad(t.File, t.Name, "schema: shape %v as %s %s: %v", t.Shape, t.Format, t.Tile, err)
			return
		}
		if !slices.Equal(padded, t.PaddedShape) {
			bad(t.File, t.Name, "schema: padded shape %v, the logical shape %v gives %v", t.PaddedShape, t.Shape, padded)
		}
		if size != t.Length {
			bad(t.File, t.Name, "schema: length %d, a %s %v tensor packs to %d bytes", t.Length, t.Format, t.Shape, size)
		}
	} else {
		if t.Method != MethodNone {
			bad(t.File, t.Name, "schema: method %q for a lossless tensor", t.Method)
		}
		dt, err := safetensors.ParseDType(t.DType)
		if err != nil {
			bad(t.File, t.Name, "schema: dtype %q: %v", t.DType, err)
			return
		}
		if (t.Format == "BF16" || t.Format == "F32") && t.DType != t.Format {
			bad(t.File, t.Name, "schema: format %s stored as %s", t.Format, t.DType)
		}
		if t.Format == "AS_IS" && t.DType != t.SourceDType {
			bad(t.File, t.Name, "schema: format AS_IS stored as %s from a %s source", t.DType, t.SourceDType)
		}
		n := int64(1)
		for _, d := range t.Shape {
			n *= d
		}
		if want := n * int64(dt.Bits()) / 8; want != t.Length {
			bad(t.File, t.Name, "schema: length %d, a %s %v tensor has %d bytes", t.Length, t.DType, t.Shape, want)
		}
	}
	// Layout: routed experts in their group file, the rest in dense shards.
	if t.Expert != nil && t.Layer != nil {
		kind := "gate_up"
		if strings.Contains(t.Name, "down") {
			kind = "down"
		}
		if m.Layout.ExpertsPerFile > 0 {
			if want := expertFileName(*t.Layer, kind, *t.Expert/m.Layout.ExpertsPerFile); want != t.File {
				bad(t.File, t.Name, "layout: expert %d of layer %d belongs in %s", *t.Expert, *t.Layer, want)
			}
		}
	} else if f.Role != FileDense {
		bad(t.File, t.Name, "layout: a non-expert tensor outside the dense shards")
	}
}

// checkFile hashes one file in a single pass, hashing each tensor's range
// on the way, decoding BFP tensors and checking the safetensors header. It
// reads at most cancelCheckBytes between checks of ctx; the error is
// non-nil only when ctx is done.
func checkFile(ctx context.Context, dir string, fe FileEntry, ts []TensorEntry) ([]Failure, error) {
	var out []Failure
	bad := func(tensor, format string, args ...any) {
		out = append(out, Failure{File: fe.Name, Tensor: tensor, What: fmt.Sprintf(format, args...)})
	}
	path := filepath.Join(dir, filepath.FromSlash(fe.Name))
	f, st, err := OpenRegular(path)
	if err != nil {
		bad("", "cannot open: %v", err)
		return out, nil
	}
	defer f.Close()
	if st.Size() != fe.Size {
		bad("", "size %d bytes, the manifest says %d (truncated or extended)", st.Size(), fe.Size)
	}
	r := atomicfile.ContextReader(ctx, f)
	copyBuf := make([]byte, 1<<20)
	readErr := func(tensor string, err error) ([]Failure, error) {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		bad(tensor, "read: %v", err)
		return out, nil
	}
	sorted := append([]TensorEntry(nil), ts...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Offset < sorted[j].Offset })
	h := sha256.New()
	var pos int64
	var buf []byte
	for _, t := range sorted {
		if t.Offset < pos || t.Offset+t.Length > st.Size() || t.Length < 0 {
			continue // overlap or out of range; reported elsewhere
		}
		if _, err := io.CopyBuffer(h, io.LimitReader(r, t.Offset-pos), copyBuf); err != nil {
			return readErr("", err)
		}
		if int64(cap(buf)) < t.Length {
			buf = make([]byte, t.Length)
		}
		b := buf[:t.Length]
		th := sha256.New()
		for off := 0; off < len(b); {
			n, err := r.Read(b[off:])
			th.Write(b[off : off+n])
			off += n
			if err != nil && off < len(b) {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return readErr(t.Name, err)
			}
		}
		h.Write(b)
		pos = t.Offset + t.Length
		if hex.EncodeToString(th.Sum(nil)) != t.SHA256 {
			bad(t.Name, "sha256 of bytes [%d, %d) differs from the manifest", t.Offset, pos)
			continue
		}
		if fm, ok := ParseBFP(t.Format); ok && t.Finite {
			tile, err := bfp.ParseTile(t.Tile)
			if err != nil {
				continue
			}
			vals, err := UnpackBFP(fm, tile, b, t.Shape, t.Orientation)
			if err != nil {
				bad(t.Name, "decode: %v", err)
			} else if !AllFinite(vals) {
				bad(t.Name, "decodes to a non-finite value where the source was finite")
			}
		} else if t.Finite && IsFloatDType(t.DType) {
			if finite, err := FiniteFloats(t.DType, b); err == nil && !finite {
				bad(t.Name, "holds a non-finite value where the source was finite")
			}
		}
	}
	if _, err := io.CopyBuffer(h, r, copyBuf); err != nil {
		return readErr("", err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != fe.SHA256 {
		bad("", "sha256 %s differs from the manifest's %s", sum, fe.SHA256)
	}
	if fe.Role == FileExperts || fe.Role == FileDense {
		out = append(out, checkHeader(path, fe, ts)...)
	}
	return out, nil
}

// checkHeader opens a data file as safetensors and compares its header with
// the manifest's tensors.
func checkHeader(path string, fe FileEntry, ts []TensorEntry) []Failure {
	var out []Failure
	bad := func(tensor, format string, args ...any) {
		out = append(out, Failure{File: fe.Name, Tensor: tensor, What: fmt.Sprintf(format, args...)})
	}
	sf, err := safetensors.Open(path)
	if err != nil {
		bad("", "not a valid safetensors file: %v", err)
		return out
	}
	defer sf.Close()
	want := map[string]TensorEntry{}
	for _, t := range ts {
		want[t.Name] = t
	}
	for _, info := range sf.Tensors() {
		t, ok := want[info.Name]
		if !ok {
			bad(info.Name, "in the file's header but not in the manifest")
			continue
		}
		delete(want, info.Name)
		if info.DType.String() != t.DType {
			bad(t.Name, "header dtype %s, manifest %s", info.DType, t.DType)
		}
		shape := t.Shape
		if _, isBFP := ParseBFP(t.Format); isBFP {
			shape = []int64{t.Length}
		}
		if !slices.Equal(info.Shape, shape) {
			bad(t.Name, "header shape %v, manifest %v", info.Shape, shape)
		}
		if sf.DataOffset()+info.Begin != t.Offset || info.End-info.Begin != t.Length {
			bad(t.Name, "header range [%d, %d), manifest [%d, %d)", sf.DataOffset()+info.Begin, sf.DataOffset()+info.End, t.Offset, t.Offset+t.Length)
		}
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		bad(n, "in the manifest but not in the file's header")
	}
	return out
}

// calibrationPaths lists what a calibration section's text provenance
// records of how the text was named (the spec as typed, a source's path, a
// jsonl or txt source's file path), which a manifest must not hold: its
// identity would depend on the directory the build ran in.
func calibrationPaths(data json.RawMessage) []string {
	if len(data) == 0 {
		return nil
	}
	var p struct {
		Spec    string `json:"spec"`
		Sources []struct {
			Kind  string `json:"kind"`
			Path  string `json:"path"`
			Files []struct {
				Path string `json:"path"`
			} `json:"files"`
		} `json:"sources"`
	}
	if json.Unmarshal(data, &p) != nil {
		return []string{"a text provenance that does not decode"}
	}
	var out []string
	if p.Spec != "" {
		out = append(out, fmt.Sprintf("the spec %q", p.Spec))
	}
	for i, s := range p.Sources {
		if s.Path != "" {
			out = append(out, fmt.Sprintf("source %d's path %q", i, s.Path))
		}
		for _, f := range s.Files {
			if s.Kind != "dir" && f.Path != "" {
				out = append(out, fmt.Sprintf("source %d's file path %q", i, f.Path))
			}
		}
	}
	return out
}
