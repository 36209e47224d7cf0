package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// MaxHeaderSize is the largest header length, in bytes, that the format
// allows (the reference's limit). It is checked before anything is
// allocated.
const MaxHeaderSize = 100_000_000

// maxDepth is the JSON nesting depth at which the reference's JSON parser
// gives up: 127 nested arrays/objects (the top-level object included) are
// allowed, the 128th is an error, even inside ignored fields.
const maxDepth = 128

// rawTensor is a header entry as parsed, before validation. It holds no
// pointers (names and shapes are ranges of the parser's arenas), which keeps
// growing and sorting large headers cheap.
type rawTensor struct {
	begin, end         uint64
	dtype              DType
	nameOff, nameEnd   uint32 // in parser.names
	shapeOff, shapeEnd uint32 // in parser.dims
}

// header is a parsed, validated header.
type header struct {
	n        uint64 // header length N
	tensors  []TensorInfo
	metadata map[string]string // nil when absent or null
	hasMeta  bool              // __metadata__ present and not null
	dups     []string          // names given more than once (the last entry won)
	index    map[string]int    // name -> position in tensors
}

// checkPrefix applies the first three checks of the reference to the 8-byte
// length prefix of a file of fileLen bytes. prefix may be shorter than 8
// bytes only when the file is.
func checkPrefix(prefix []byte, fileLen int64) (uint64, error) {
	if fileLen < 8 || len(prefix) < 8 {
		return 0, errf(ErrHeaderTooSmall, "file is %d bytes, shorter than the 8-byte length prefix", fileLen)
	}
	n := binary.LittleEndian.Uint64(prefix)
	if n > MaxHeaderSize {
		return 0, errf(ErrHeaderTooLarge, "header length %d exceeds the %d-byte limit%s", n, MaxHeaderSize, sniff(prefix))
	}
	if 8+n > uint64(fileLen) {
		return 0, errf(ErrInvalidHeaderLength, "header length %d but the file has only %d bytes after the prefix%s", n, fileLen-8, sniff(prefix))
	}
	return n, nil
}

// sniff names what a file that is not safetensors probably is, from its
// first bytes, as a suffix for an error detail.
func sniff(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("version ")): // "version https://git-lfs..."
		return " (the file looks like a Git LFS pointer, not the tensor data)"
	case len(b) >= 2 && (bytes.EqualFold(b[:2], []byte("<!")) || bytes.EqualFold(b[:2], []byte("<h"))):
		return " (the file looks like an HTML page)"
	case bytes.HasPrefix(b, []byte("PK\x03\x04")):
		return " (the file looks like a zip archive, e.g. a PyTorch .bin checkpoint)"
	case len(b) >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5:
		return " (the file looks like a Python pickle)"
	case bytes.HasPrefix(b, []byte("GGUF")):
		return " (the file looks like a GGUF file)"
	}
	return ""
}

// parseAndValidate decides a header of length n (the bytes after the
// prefix) in a file of fileLen bytes, in the reference's order: UTF-8, JSON
// and schema, then offsets and sizes in data-offset order, then coverage of
// the data section.
func parseAndValidate(hdr []byte, fileLen int64) (*header, error) {
	sc := getScratch()
	defer sc.put()
	return parseAndValidateWith(sc, hdr, fileLen)
}

// parseAndValidateWith is parseAndValidate using the arenas of sc, which
// the caller returns to the pool once it no longer needs hdr either.
//
// It is long by design: the checks run in the reference's order, which
// decides the error a bad header gets; one function keeps that order
// readable top to bottom.
func parseAndValidateWith(sc *scratch, hdr []byte, fileLen int64) (*header, error) {
	n := uint64(len(hdr))
	if !utf8.Valid(hdr) {
		return nil, errf(ErrInvalidHeader, "%s", firstBadUTF8(hdr))
	}
	p := parser{b: hdr, scratch: sc}
	raw, md, hasMeta, err := p.parseHeader()
	sc.raw, sc.names, sc.dims = raw, p.names, p.dims
	if err != nil {
		return nil, err
	}
	// Names and shapes live in two arenas; a single allocation each keeps
	// a 10,000-tensor header cheap.
	all := string(p.names)
	dims := p.dims
	name := func(t *rawTensor) string { return all[t.nameOff:t.nameEnd] }
	shape := func(t *rawTensor) []uint64 { return dims[t.shapeOff:t.shapeEnd:t.shapeEnd] }

	// A repeated name keeps its last entry (the reference's map semantics);
	// earlier entries were type-checked but are otherwise dropped.
	index := make(map[string]int, len(raw))
	var dups []string
	for i := range raw {
		nm := name(&raw[i])
		index[nm] = i // one map operation per tensor; a repeat keeps the last
		if len(index) != i+1-len(dups) {
			dups = append(dups, nm)
		}
	}
	remap := len(dups) > 0
	if remap {
		kept := raw[:0]
		for i := range raw {
			if index[name(&raw[i])] == i {
				kept = append(kept, raw[i])
			}
		}
		raw = kept
	}
	byOffsets := func(a, b rawTensor) int {
		if c := cmp.Compare(a.begin, b.begin); c != 0 {
			return c
		}
		if c := cmp.Compare(a.end, b.end); c != 0 {
			return c
		}
		return cmp.Compare(name(&a), name(&b))
	}
	// Files from the reference writer (and ours) list tensors in offset
	// order already; checking first saves the sort.
	if !slices.IsSortedFunc(raw, byOffsets) {
		slices.SortFunc(raw, byOffsets)
		remap = true
	}
	var cursor uint64
	for i := range raw {
		t := &raw[i]
		if t.begin != cursor || t.end < t.begin {
			if t.end < t.begin {
				return nil, tensorErrf(ErrInvalidOffset, name(t), "data_offsets [%d,%d] end before begin", t.begin, t.end)
			}
			return nil, tensorErrf(ErrInvalidOffset, name(t), "data_offsets [%d,%d] but the previous tensor ends at %d (gap, overlap or alias)", t.begin, t.end, cursor)
		}
		numel := uint64(1)
		for _, d := range shape(t) {
			hi, lo := bits.Mul64(numel, d)
			if hi != 0 {
				return nil, tensorErrf(ErrValidationOverflow, name(t), "shape %s", fmtShape(shape(t)))
			}
			numel = lo
		}
		hi, nbits := bits.Mul64(numel, uint64(t.dtype.Bits()))
		if hi != 0 {
			return nil, tensorErrf(ErrValidationOverflow, name(t), "%s shape %s", t.dtype, fmtShape(shape(t)))
		}
		if nbits%8 != 0 {
			return nil, tensorErrf(ErrMisalignedSlice, name(t), "%s shape %s is %d bits", t.dtype, fmtShape(shape(t)), nbits)
		}
		if t.end-t.begin != nbits/8 {
			return nil, tensorErrf(ErrTensorInvalidInfo, name(t), "%s shape %s needs %d bytes but data_offsets [%d,%d] hold %d",
				t.dtype, fmtShape(shape(t)), nbits/8, t.begin, t.end, t.end-t.begin)
		}
		cursor = t.end
	}
	// cursor + 8 + n == fileLen, without wrapping (the reference's sum could
	// wrap on 64 bits; a wrapped sum is never a valid file).
	total, c1 := bits.Add64(cursor, 8, 0)
	total, c2 := bits.Add64(total, n, 0)
	if c1 != 0 || c2 != 0 || total != uint64(fileLen) {
		dataLen := uint64(fileLen) - 8 - n
		if cursor > dataLen {
			return nil, errf(ErrMetadataIncompleteBuffer, "tensors need %d data bytes but the file has %d (truncated? expected file size %s, actual %d)",
				cursor, dataLen, sumString(cursor, 8+n), fileLen)
		}
		return nil, errf(ErrMetadataIncompleteBuffer, "tensors cover %d data bytes but the file has %d (%d trailing bytes)", cursor, dataLen, dataLen-cursor)
	}
	h := &header{n: n, metadata: md, hasMeta: hasMeta, dups: dups, tensors: make([]TensorInfo, len(raw)), index: index}
	shapes := make([]int64, len(dims))
	for i := range raw {
		t := &raw[i]
		nm := name(t)
		if remap {
			index[nm] = i
		}
		sh := shapes[t.shapeOff:t.shapeEnd:t.shapeEnd]
		ti := TensorInfo{Name: nm, DType: t.dtype, Begin: int64(t.begin), End: int64(t.end), Shape: sh}
		for j, d := range shape(t) {
			if d > math.MaxInt64 {
				sh[j] = -1
				ti.dims = slices.Clone(shape(t)) // the arena is reused
			} else {
				sh[j] = int64(d)
			}
		}
		h.tensors[i] = ti
	}
	return h, nil
}

func sumString(a, b uint64) string {
	s, c := bits.Add64(a, b, 0)
	if c != 0 {
		return "beyond 2^64"
	}
	return strconv.FormatUint(s, 10)
}

func firstBadUTF8(b []byte) string {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return fmt.Sprintf("invalid byte 0x%02x at header offset %d", b[i], i)
		}
		i += size
	}
	return "invalid UTF-8"
}

func fmtShape(s []uint64) string {
	buf := []byte{'['}
	for i, d := range s {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendUint(buf, d, 10)
	}
	return string(append(buf, ']'))
}

// parser is a strict JSON scanner specialised to the header schema. It
// follows RFC 8259 exactly as the reference's parser does: whitespace is
// space, tab, LF and CR only; no comments, trailing commas, NaN, leading
// zeros or '+'; strings may not contain raw control characters; escapes are
// decoded (and surrogates must pair) before keys are compared.
type parser struct {
	b     []byte
	i     int
	depth int
	buf   []byte   // scratch for strings with escapes
	names []byte   // arena of decoded tensor names
	dims  []uint64 // arena of shape dimensions
	cur   []byte   // name of the tensor entry being parsed, for errors

	scratch *scratch // reusable arenas; nil allocates fresh ones
}

func (p *parser) errf(format string, args ...any) error {
	return errf(ErrInvalidHeaderDeserialization, "at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *parser) describe() string {
	if p.i >= len(p.b) {
		return "end of header"
	}
	return strconv.QuoteRune(rune(p.b[p.i]))
}

func (p *parser) enter() error {
	p.depth++
	if p.depth >= maxDepth {
		return p.errf("nesting deeper than %d", maxDepth-1)
	}
	return nil
}

// open enters the object or array whose opening byte is next (the caller
// has checked it) and skips the whitespace after it. When the closing byte
// follows at once it consumes it, leaves the container and reports empty;
// otherwise the caller parses the elements and decrements p.depth after
// the closing byte.
func (p *parser) open(closing byte) (empty bool, err error) {
	if err := p.enter(); err != nil {
		return false, err
	}
	p.i++
	p.ws()
	if p.peek() == closing {
		p.i++
		p.depth--
		return true, nil
	}
	return false, nil
}

// parseHeader parses the whole header. Tensor names and shapes are
// recorded as ranges of the parser's arenas.
func (p *parser) parseHeader() (tensors []rawTensor, md map[string]string, hasMeta bool, err error) {
	p.ws()
	if p.peek() != '{' {
		if p.i >= len(p.b) {
			return nil, nil, false, p.errf("empty header")
		}
		return nil, nil, false, p.errf("the header must be a JSON object, found %s", p.describe())
	}
	if err := p.enter(); err != nil {
		return nil, nil, false, err
	}
	p.i++
	p.ws()
	seenMeta := false
	// Size the arenas from the header: an object-form entry holds exactly
	// one '}' (counting a single byte is fast); names are typically under
	// half of the header.
	// The count is capped by the size of the smallest object-form entry
	// (49 bytes), so braces inside strings cannot inflate it.
	sc := p.scratch
	if sc == nil {
		sc = &scratch{}
	}
	tensors = reuse(sc.raw, min(bytes.Count(p.b, []byte{'}'}), len(p.b)/49+1))
	p.names = reuse(sc.names, len(p.b)/2)
	p.dims = reuse(sc.dims, len(p.b)/25+4)
	if p.peek() == '}' {
		p.i++
	} else {
		for {
			if p.peek() != '"' {
				return nil, nil, false, p.errf("expected a string key, found %s", p.describe())
			}
			key, err := p.str()
			if err != nil {
				return nil, nil, false, err
			}
			if err := p.colon(); err != nil {
				return nil, nil, false, err
			}
			if string(key) == "__metadata__" {
				if seenMeta {
					return nil, nil, false, p.errf("duplicate field `__metadata__`")
				}
				seenMeta = true
				md, hasMeta, err = p.metadata()
				if err != nil {
					return nil, nil, false, err
				}
			} else {
				off := len(p.names)
				p.names = append(p.names, key...)
				name := p.names[off:len(p.names):len(p.names)]
				t, err := p.tensorEntry(name)
				if err != nil {
					return nil, nil, false, err
				}
				t.nameOff, t.nameEnd = uint32(off), uint32(len(p.names))
				tensors = append(tensors, t)
			}
			more, err := p.next('}')
			if err != nil {
				return nil, nil, false, err
			}
			if !more {
				break
			}
		}
	}
	p.depth--
	p.ws()
	if p.i != len(p.b) {
		return nil, nil, false, p.errf("trailing characters after the header object")
	}
	return tensors, md, hasMeta, nil
}

func (p *parser) colon() error {
	p.ws()
	if p.peek() != ':' {
		return p.errf("expected ':', found %s", p.describe())
	}
	p.i++
	p.ws()
	return nil
}

// next consumes whitespace and then ',' (returning true, positioned at the
// next element after whitespace) or the closing byte (returning false).
func (p *parser) next(closing byte) (bool, error) {
	p.ws()
	switch p.peek() {
	case ',':
		p.i++
		p.ws()
		if c := p.peek(); c == closing {
			return false, p.errf("trailing comma")
		}
		return true, nil
	case closing:
		p.i++
		return false, nil
	}
	return false, p.errf("expected ',' or '%c', found %s", closing, p.describe())
}

// metadata parses the value of __metadata__: null, or an object whose values
// are all strings (a repeated key keeps the last value).
func (p *parser) metadata() (map[string]string, bool, error) {
	if p.lit("null") {
		return nil, false, nil
	}
	if p.peek() != '{' {
		return nil, false, p.errf("__metadata__ must be an object of strings or null, found %s", p.describe())
	}
	empty, err := p.open('}')
	if err != nil {
		return nil, false, err
	}
	md := map[string]string{}
	if empty {
		return md, true, nil
	}
	for {
		if p.peek() != '"' {
			return nil, false, p.errf("expected a string key in __metadata__, found %s", p.describe())
		}
		k, err := p.str()
		if err != nil {
			return nil, false, err
		}
		key := string(k)
		if err := p.colon(); err != nil {
			return nil, false, err
		}
		if p.peek() != '"' {
			return nil, false, p.errf("__metadata__ value for %q must be a string, found %s", key, p.describe())
		}
		v, err := p.str()
		if err != nil {
			return nil, false, err
		}
		md[key] = string(v)
		more, err := p.next('}')
		if err != nil {
			return nil, false, err
		}
		if !more {
			break
		}
	}
	p.depth--
	return md, true, nil
}

// tensorEntry parses a tensor entry: an object with the required fields
// dtype, shape and data_offsets (each at most once; unknown fields are
// skipped), or the reference's sequence form [dtype, shape, data_offsets].
//
// It is long by design: the field checks run in the reference's order,
// which decides the error a bad entry gets; one function keeps that order
// readable top to bottom.
func (p *parser) tensorEntry(name []byte) (rawTensor, error) {
	p.cur = name
	if !noFastEntry {
		if t, ok := p.fastEntry(); ok {
			return t, nil
		}
	}
	t := rawTensor{}
	switch p.peek() {
	case '{':
		empty, err := p.open('}')
		if err != nil {
			return t, err
		}
		var have [3]bool
		if !empty {
			for {
				if p.peek() != '"' {
					return t, p.errf("tensor %q: expected a string key, found %s", name, p.describe())
				}
				k, err := p.str()
				if err != nil {
					return t, err
				}
				if err := p.colon(); err != nil {
					return t, err
				}
				f := -1
				switch string(k) {
				case "dtype":
					f = 0
				case "shape":
					f = 1
				case "data_offsets":
					f = 2
				}
				if f >= 0 {
					if have[f] {
						return t, p.errf("tensor %q: duplicate field `%s`", name, k)
					}
					have[f] = true
				}
				switch f {
				case 0:
					err = p.dtype(&t)
				case 1:
					err = p.shape(&t)
				case 2:
					err = p.offsets(&t)
				default:
					err = p.skip()
				}
				if err != nil {
					return t, err
				}
				more, err := p.next('}')
				if err != nil {
					return t, err
				}
				if !more {
					break
				}
			}
			p.depth--
		}
		for f, field := range [3]string{"dtype", "shape", "data_offsets"} {
			if !have[f] {
				return t, p.errf("tensor %q: missing field `%s`", name, field)
			}
		}
		return t, nil
	case '[':
		if err := p.enter(); err != nil {
			return t, err
		}
		p.i++
		p.ws()
		for k := 0; k < 3; k++ {
			if k > 0 {
				p.ws()
				if p.peek() != ',' {
					if p.peek() == ']' {
						return t, p.errf("tensor %q: array form with %d elements, expected 3", name, k)
					}
					return t, p.errf("tensor %q: expected ',' or ']', found %s", name, p.describe())
				}
				p.i++
				p.ws()
			} else if p.peek() == ']' {
				return t, p.errf("tensor %q: array form with no elements, expected 3", name)
			}
			var err error
			switch k {
			case 0:
				err = p.dtype(&t)
			case 1:
				err = p.shape(&t)
			default:
				err = p.offsets(&t)
			}
			if err != nil {
				return t, err
			}
		}
		p.ws()
		if p.peek() != ']' {
			return t, p.errf("tensor %q: array form with more than 3 elements", name)
		}
		p.i++
		p.depth--
		return t, nil
	}
	return t, p.errf("tensor %q: entry must be an object, found %s", name, p.describe())
}

// noFastEntry disables fastEntry; tests set it to check that both paths
// decide alike.
var noFastEntry = false

// fastEntry parses an entry written exactly as the reference writer (and
// ours) writes it, {"dtype":"X","shape":[..],"data_offsets":[b,e]} with no
// whitespace, escapes or extra fields, without the general machinery. On
// any deviation it restores the parser state and returns false, and the
// general path parses the entry (and reports any error).
func (p *parser) fastEntry() (rawTensor, bool) {
	const (
		pre     = `{"dtype":"`
		mid     = `","shape":[`
		offsets = `,"data_offsets":[`
	)
	b := p.b[p.i:]
	var t rawTensor
	if len(b) < len(pre) || string(b[:len(pre)]) != pre {
		return t, false
	}
	k := len(pre)
	j := bytes.IndexByte(b[k:min(len(b), k+16)], '"')
	if j < 0 {
		return t, false
	}
	t.dtype = lookupDType(string(b[k : k+j]))
	if t.dtype == 0 {
		return t, false
	}
	k += j
	if len(b)-k < len(mid) || string(b[k:k+len(mid)]) != mid {
		return t, false
	}
	k += len(mid)
	mark := len(p.dims)
	t.shapeOff = uint32(mark)
	fail := func() (rawTensor, bool) {
		p.dims = p.dims[:mark]
		return rawTensor{}, false
	}
	// num parses a plain unsigned integer at b[k:], which must be followed
	// by sep.
	num := func(sep byte) (uint64, bool) {
		start := k
		var v uint64
		for k < len(b) && b[k] >= '0' && b[k] <= '9' {
			if v > (1<<64-1-9)/10 {
				return 0, false // possible overflow: let the general path decide
			}
			v = v*10 + uint64(b[k]-'0')
			k++
		}
		if k == start || (b[start] == '0' && k-start > 1) || k >= len(b) || b[k] != sep {
			return 0, false
		}
		k++
		return v, true
	}
	if k < len(b) && b[k] == ']' {
		k++
	} else {
		for {
			start := k
			v, ok := num(',')
			if !ok {
				k = start
				if v, ok = num(']'); !ok {
					return fail()
				}
				p.dims = append(p.dims, v)
				break
			}
			p.dims = append(p.dims, v)
		}
	}
	t.shapeEnd = uint32(len(p.dims))
	if len(b)-k < len(offsets) || string(b[k:k+len(offsets)]) != offsets {
		return fail()
	}
	k += len(offsets)
	var ok bool
	if t.begin, ok = num(','); !ok {
		return fail()
	}
	if t.end, ok = num(']'); !ok {
		return fail()
	}
	if k >= len(b) || b[k] != '}' {
		return fail()
	}
	p.i += k + 1
	return t, true
}

// dtype parses a dtype: a string naming one of the 22 dtypes, or the
// reference's enum-map form {"NAME": null}.
func (p *parser) dtype(t *rawTensor) error {
	switch p.peek() {
	case '"':
		s, err := p.str()
		if err != nil {
			return err
		}
		d := lookupDType(string(s))
		if d == 0 {
			return p.errf("tensor %q: unknown dtype %q", p.cur, s)
		}
		t.dtype = d
		return nil
	case '{':
		if err := p.enter(); err != nil {
			return err
		}
		p.i++
		p.ws()
		if p.peek() != '"' {
			return p.errf("tensor %q: dtype map must have exactly one key", p.cur)
		}
		s, err := p.str()
		if err != nil {
			return err
		}
		d := lookupDType(string(s))
		if d == 0 {
			return p.errf("tensor %q: unknown dtype %q", p.cur, s)
		}
		if err := p.colon(); err != nil {
			return err
		}
		if !p.lit("null") {
			return p.errf("tensor %q: dtype map value must be null", p.cur)
		}
		p.ws()
		if p.peek() != '}' {
			return p.errf("tensor %q: dtype map must have exactly one key", p.cur)
		}
		p.i++
		p.depth--
		t.dtype = d
		return nil
	}
	return p.errf("tensor %q: dtype must be a string, found %s", p.cur, p.describe())
}

func (p *parser) shape(t *rawTensor) error {
	if p.peek() != '[' {
		return p.errf("tensor %q: shape must be an array, found %s", p.cur, p.describe())
	}
	t.shapeOff, t.shapeEnd = uint32(len(p.dims)), uint32(len(p.dims))
	if empty, err := p.open(']'); err != nil || empty {
		return err
	}
	for {
		v, err := p.uint("shape")
		if err != nil {
			return err
		}
		p.dims = append(p.dims, v)
		t.shapeEnd = uint32(len(p.dims))
		more, err := p.next(']')
		if err != nil {
			return err
		}
		if !more {
			break
		}
	}
	p.depth--
	return nil
}

func (p *parser) offsets(t *rawTensor) error {
	if p.peek() != '[' {
		return p.errf("tensor %q: data_offsets must be an array of 2 integers, found %s", p.cur, p.describe())
	}
	if err := p.enter(); err != nil {
		return err
	}
	p.i++
	p.ws()
	var v [2]uint64
	for k := 0; k < 2; k++ {
		if k == 1 {
			p.ws()
			if p.peek() != ',' {
				return p.errf("tensor %q: data_offsets must have exactly 2 elements", p.cur)
			}
			p.i++
			p.ws()
		}
		x, err := p.uint("data_offsets")
		if err != nil {
			return err
		}
		v[k] = x
	}
	p.ws()
	if p.peek() != ']' {
		return p.errf("tensor %q: data_offsets must have exactly 2 elements", p.cur)
	}
	p.i++
	p.depth--
	t.begin, t.end = v[0], v[1]
	return nil
}

// uint parses a JSON number that must be a plain unsigned integer fitting
// in 64 bits.
func (p *parser) uint(field string) (uint64, error) {
	name := p.cur
	start := p.i
	c := p.peek()
	if c < '0' || c > '9' {
		return 0, p.errf("tensor %q: %s must hold non-negative integers, found %s", name, field, p.describe())
	}
	if c == '0' {
		p.i++
		if d := p.peek(); d >= '0' && d <= '9' {
			return 0, p.errf("tensor %q: number with a leading zero in %s", name, field)
		}
	} else {
		var v uint64
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			hi, lo := bits.Mul64(v, 10)
			lo2, carry := bits.Add64(lo, uint64(p.b[p.i]-'0'), 0)
			if hi != 0 || carry != 0 {
				return 0, p.errf("tensor %q: %s value %s... does not fit in 64 bits", name, field, p.b[start:p.i])
			}
			v = lo2
			p.i++
		}
		if c := p.peek(); c == '.' || c == 'e' || c == 'E' {
			return 0, p.errf("tensor %q: %s must hold integers, found a fraction or exponent", name, field)
		}
		return v, nil
	}
	if c := p.peek(); c == '.' || c == 'e' || c == 'E' {
		return 0, p.errf("tensor %q: %s must hold integers, found a fraction or exponent", name, field)
	}
	return 0, nil
}

// lit consumes the literal s if it is next.
func (p *parser) lit(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// skip parses and discards any JSON value (for unknown fields).
func (p *parser) skip() error {
	switch c := p.peek(); {
	case c == '"':
		_, err := p.str()
		return err
	case c == '{':
		if empty, err := p.open('}'); err != nil || empty {
			return err
		}
		for {
			if p.peek() != '"' {
				return p.errf("expected a string key, found %s", p.describe())
			}
			if _, err := p.str(); err != nil {
				return err
			}
			if err := p.colon(); err != nil {
				return err
			}
			if err := p.skip(); err != nil {
				return err
			}
			more, err := p.next('}')
			if err != nil {
				return err
			}
			if !more {
				break
			}
		}
		p.depth--
		return nil
	case c == '[':
		if empty, err := p.open(']'); err != nil || empty {
			return err
		}
		for {
			if err := p.skip(); err != nil {
				return err
			}
			more, err := p.next(']')
			if err != nil {
				return err
			}
			if !more {
				break
			}
		}
		p.depth--
		return nil
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case p.lit("true"), p.lit("false"), p.lit("null"):
		return nil
	}
	return p.errf("expected a JSON value, found %s", p.describe())
}

// number validates a JSON number. Like the reference parser it rejects
// numbers whose magnitude overflows a float64.
func (p *parser) number() error {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	digits := func() int {
		s := p.i
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
		return p.i - s
	}
	switch c := p.peek(); {
	case c == '0':
		p.i++
		if d := p.peek(); d >= '0' && d <= '9' {
			return p.errf("number with a leading zero")
		}
	case c >= '1' && c <= '9':
		digits()
	default:
		return p.errf("invalid number")
	}
	if p.peek() == '.' {
		p.i++
		if digits() == 0 {
			return p.errf("invalid number")
		}
	}
	if c := p.peek(); c == 'e' || c == 'E' {
		p.i++
		if c := p.peek(); c == '+' || c == '-' {
			p.i++
		}
		if digits() == 0 {
			return p.errf("invalid number")
		}
	}
	if _, err := strconv.ParseFloat(string(p.b[start:p.i]), 64); err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			// Only overflow is an error; underflow rounds to zero.
			if f, _ := strconv.ParseFloat(string(p.b[start:p.i]), 64); math.IsInf(f, 0) {
				return p.errf("number out of range")
			}
			return nil
		}
		return p.errf("invalid number")
	}
	return nil
}

// str parses a JSON string at p.i (which holds '"') and returns its decoded
// bytes. The result aliases the header when the string has no escapes and is
// only valid until the next call otherwise.
func (p *parser) str() ([]byte, error) {
	p.i++
	start := p.i
	b := p.b
	for i := start; i < len(b); i++ {
		if c := b[i]; strSpecial[c] {
			if c == '"' {
				p.i = i + 1
				return b[start:i], nil
			}
			p.i = i
			return p.strSlow(start)
		}
	}
	p.i = len(b)
	return nil, p.errf("unterminated string")
}

// strSpecial marks the bytes that end the fast path of str: the closing
// quote, a backslash, and control characters.
var strSpecial = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

func (p *parser) strSlow(start int) ([]byte, error) {
	out := append(p.buf[:0], p.b[start:p.i]...)
	for {
		if p.i >= len(p.b) {
			return nil, p.errf("unterminated string")
		}
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			p.buf = out
			return out, nil
		case c < 0x20:
			return nil, p.errf("control character 0x%02x inside a string", c)
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		p.i++
		if p.i >= len(p.b) {
			return nil, p.errf("unterminated string")
		}
		e := p.b[p.i]
		p.i++
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return nil, err
			}
			switch {
			case r >= 0xD800 && r < 0xDC00:
				if p.i+1 >= len(p.b) || p.b[p.i] != '\\' || p.b[p.i+1] != 'u' {
					return nil, p.errf("lone leading surrogate in hex escape")
				}
				p.i += 2
				r2, err := p.hex4()
				if err != nil {
					return nil, err
				}
				if r2 < 0xDC00 || r2 > 0xDFFF {
					return nil, p.errf("lone leading surrogate in hex escape")
				}
				r = utf16.DecodeRune(r, r2)
			case r >= 0xDC00 && r <= 0xDFFF:
				return nil, p.errf("lone trailing surrogate in hex escape")
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, p.errf("invalid escape")
		}
	}
}

func (p *parser) hex4() (rune, error) {
	if len(p.b)-p.i < 4 {
		return 0, p.errf("truncated \\u escape")
	}
	var r rune
	for k := 0; k < 4; k++ {
		c := p.b[p.i+k]
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, p.errf("invalid \\u escape")
		}
		r = r<<4 | rune(v)
	}
	p.i += 4
	return r, nil
}

// value parses any JSON value into map[string]any (duplicate keys are an
// error), []any, string, json.Number, bool or nil. It is used for index
// files, where no duplicate may be silently dropped.
func (p *parser) value() (any, error) {
	switch c := p.peek(); {
	case c == '"':
		s, err := p.str()
		return string(s), err
	case c == '{':
		empty, err := p.open('}')
		if err != nil {
			return nil, err
		}
		m := map[string]any{}
		if empty {
			return m, nil
		}
		for {
			if p.peek() != '"' {
				return nil, p.errf("expected a string key, found %s", p.describe())
			}
			k, err := p.str()
			if err != nil {
				return nil, err
			}
			key := string(k)
			if _, dup := m[key]; dup {
				return nil, p.errf("duplicate key %q", key)
			}
			if err := p.colon(); err != nil {
				return nil, err
			}
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			m[key] = v
			more, err := p.next('}')
			if err != nil {
				return nil, err
			}
			if !more {
				break
			}
		}
		p.depth--
		return m, nil
	case c == '[':
		empty, err := p.open(']')
		if err != nil {
			return nil, err
		}
		a := []any{}
		if empty {
			return a, nil
		}
		for {
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			a = append(a, v)
			more, err := p.next(']')
			if err != nil {
				return nil, err
			}
			if !more {
				break
			}
		}
		p.depth--
		return a, nil
	case c == '-' || (c >= '0' && c <= '9'):
		start := p.i
		if err := p.number(); err != nil {
			return nil, err
		}
		return json.Number(p.b[start:p.i]), nil
	case p.lit("true"):
		return true, nil
	case p.lit("false"):
		return false, nil
	case p.lit("null"):
		return nil, nil
	}
	return nil, p.errf("expected a JSON value, found %s", p.describe())
}

// scratch holds the buffers that parsing a header needs only while it runs:
// the header bytes, the raw entries and the name and dimension arenas.
// Everything a parsed header keeps is copied out of them, so they can be
// reused by the next Open; opening the many shards of a checkpoint (or a
// header of 10,000 tensors) then allocates a fraction of what it would.
type scratch struct {
	hdr   []byte
	raw   []rawTensor
	names []byte
	dims  []uint64
}

// maxPooledBytes bounds the size of a buffer kept for reuse, so that one
// huge header does not pin its memory for the life of the process.
const maxPooledBytes = 16 << 20

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

// put returns s to the pool, dropping buffers too large to keep.
func (s *scratch) put() {
	if s == nil {
		return
	}
	if cap(s.hdr) > maxPooledBytes {
		s.hdr = nil
	}
	if cap(s.raw)*int(unsafe.Sizeof(rawTensor{})) > maxPooledBytes {
		s.raw = nil
	}
	if cap(s.names) > maxPooledBytes {
		s.names = nil
	}
	if cap(s.dims)*8 > maxPooledBytes {
		s.dims = nil
	}
	scratchPool.Put(s)
}

// reuse returns buf emptied when it can hold n elements, else a new slice
// of capacity n.
func reuse[T any](buf []T, n int) []T {
	if cap(buf) >= n {
		return buf[:0]
	}
	return make([]T, 0, n)
}
