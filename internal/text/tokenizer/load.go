package tokenizer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// File names inside a model directory.
const (
	TokenizerFile = "tokenizer.json"
	ConfigFile    = "tokenizer_config.json"
)

// Options tune a loaded tokenizer. The zero value is the default.
type Options struct {
	// CacheEntries bounds the per-pre-token cache (number of pieces). Zero
	// means DefaultCacheEntries; a negative value disables the cache.
	CacheEntries int
}

// DefaultCacheEntries is the default bound of the per-pre-token cache.
const DefaultCacheEntries = 1 << 17

// Load reads dir/tokenizer.json and dir/tokenizer_config.json.
func Load(dir string) (*Tokenizer, error) { return LoadOptions(dir, Options{}) }

// LoadOptions is Load with options.
func LoadOptions(dir string, opt Options) (*Tokenizer, error) {
	tpath := filepath.Join(dir, TokenizerFile)
	cpath := filepath.Join(dir, ConfigFile)
	tj, err := readFile(tpath)
	if err != nil {
		return nil, err
	}
	cj, err := readFile(cpath)
	if err != nil {
		return nil, err
	}
	return Parse(tpath, tj, cpath, cj, opt)
}

func readFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &Error{Path: path, Kind: ErrMissing, Detail: "no such file"}
		}
		return nil, &Error{Path: path, Kind: ErrMissing, Detail: err.Error()}
	}
	return b, nil
}

// Parse builds a tokenizer from the contents of tokenizer.json and
// tokenizer_config.json; the paths only name the files in errors. config may
// be nil, in which case no BOS/EOS/PAD tokens are known.
func Parse(tokPath string, tokJSON []byte, cfgPath string, cfgJSON []byte, opt Options) (*Tokenizer, error) {
	t := &Tokenizer{eos: -1, bos: -1, pad: -1}
	sum := sha256.Sum256(tokJSON)
	t.sha256 = hex.EncodeToString(sum[:])
	if err := t.parseTokenizer(tokPath, tokJSON); err != nil {
		return nil, err
	}
	if cfgJSON != nil {
		if err := t.parseConfig(cfgPath, cfgJSON); err != nil {
			return nil, err
		}
	}
	switch {
	case opt.CacheEntries == 0:
		t.cache = newPieceCache(DefaultCacheEntries)
	case opt.CacheEntries > 0:
		t.cache = newPieceCache(opt.CacheEntries)
	}
	return t, nil
}

// object is a JSON object being validated field by field: every key must be
// consumed, so unknown settings are refused instead of ignored.
type object struct {
	path, at string
	m        map[string]json.RawMessage
	used     map[string]bool
}

func jsonType(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func join(at, key string) string {
	if at == "" {
		return key
	}
	return at + "." + key
}

func newObject(path, at string, raw json.RawMessage) (*object, error) {
	if jsonType(raw) != "an object" {
		return nil, errorf(path, at, ErrMalformed, "want an object, have %s", jsonType(raw))
	}
	o := &object{path: path, at: at, used: map[string]bool{}}
	if err := json.Unmarshal(raw, &o.m); err != nil {
		if at == "" {
			return nil, errorf(path, at, ErrMalformed, "not valid JSON: %v", err)
		}
		return nil, errorf(path, at, ErrMalformed, "%v", err)
	}
	return o, nil
}

func (o *object) field(key string) string { return join(o.at, key) }

// raw returns a field (nil when absent) and marks it used.
func (o *object) raw(key string) json.RawMessage {
	o.used[key] = true
	return o.m[key]
}

func (o *object) decode(key string, required bool, v any, want string) (bool, error) {
	raw := o.raw(key)
	if raw == nil {
		if required {
			return false, errorf(o.path, o.field(key), ErrMissing, "required field absent")
		}
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, errorf(o.path, o.field(key), ErrMalformed, "want %s, have %s", want, jsonType(raw))
	}
	return true, nil
}

func (o *object) str(key string) (string, bool, error) {
	var s string
	raw := o.raw(key)
	if raw == nil || isNull(raw) {
		return "", false, nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, errorf(o.path, o.field(key), ErrMalformed, "want a string, have %s", jsonType(raw))
	}
	return s, true, nil
}

// wantStr requires a string field equal to one of the accepted values.
func (o *object) wantStr(key string, accepted ...string) (string, error) {
	s, ok, err := o.str(key)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", errorf(o.path, o.field(key), ErrMissing, "required field absent")
	}
	for _, a := range accepted {
		if s == a {
			return s, nil
		}
	}
	return "", errorf(o.path, o.field(key), ErrUnsupported, "%q (supported: %s)", s, quoteList(accepted))
}

// boolean reads an optional boolean (false when absent or null).
func (o *object) boolean(key string) (bool, error) {
	raw := o.raw(key)
	if raw == nil || isNull(raw) {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err != nil {
		return false, errorf(o.path, o.field(key), ErrMalformed, "want a boolean, have %s", jsonType(raw))
	}
	return b, nil
}

// wantFalse requires an optional boolean to be false (or absent/null).
func (o *object) wantFalse(key, why string) error {
	b, err := o.boolean(key)
	if err != nil {
		return err
	}
	if b {
		return errorf(o.path, o.field(key), ErrUnsupported, "true is not supported (%s)", why)
	}
	return nil
}

// wantNull requires an optional field to be absent or null.
func (o *object) wantNull(key, why string) error {
	raw := o.raw(key)
	if raw != nil && !isNull(raw) {
		return errorf(o.path, o.field(key), ErrUnsupported, "must be null (%s)", why)
	}
	return nil
}

// wantEmpty requires an optional string to be absent, null or "".
func (o *object) wantEmpty(key, why string) error {
	s, _, err := o.str(key)
	if err != nil {
		return err
	}
	if s != "" {
		return errorf(o.path, o.field(key), ErrUnsupported, "%q is not supported (%s)", s, why)
	}
	return nil
}

// ignore marks fields that do not change encoding or decoding.
func (o *object) ignore(keys ...string) {
	for _, k := range keys {
		o.used[k] = true
	}
}

// done refuses every field not consumed.
func (o *object) done() error {
	var extra []string
	for k := range o.m {
		if !o.used[k] {
			extra = append(extra, k)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	sort.Strings(extra)
	return errorf(o.path, o.field(extra[0]), ErrUnsupported, "unknown field (not implemented; refusing rather than ignoring it)")
}

func quoteList(v []string) string {
	q := make([]string, len(v))
	for i, s := range v {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

func (t *Tokenizer) parseTokenizer(path string, data []byte) error {
	top, err := newObject(path, "", data)
	if err != nil {
		return err
	}
	if err := checkDefaultCopy(path, top); err != nil {
		return err
	}
	top.ignore("version")
	if err := top.wantNull("truncation", "truncation changes what Encode returns"); err != nil {
		return err
	}
	if err := top.wantNull("padding", "padding changes what Encode returns"); err != nil {
		return err
	}
	if err := t.parseModel(path, top); err != nil {
		return err
	}
	if err := t.parseAdded(path, top); err != nil {
		return err
	}
	if err := t.parseNormalizer(path, top); err != nil {
		return err
	}
	if err := t.parsePreTokenizer(path, top); err != nil {
		return err
	}
	if err := t.parsePostProcessor(path, top); err != nil {
		return err
	}
	if err := t.parseDecoder(path, top); err != nil {
		return err
	}
	return top.done()
}

// checkDefaultCopy accepts a top-level "default" field only when it is an
// exact copy of the document (what JavaScript bundlers write when a JSON
// file is imported as a module); anything else is refused.
func checkDefaultCopy(path string, top *object) error {
	raw, ok := top.m["default"]
	if !ok {
		return nil
	}
	top.used["default"] = true
	bad := errorf(path, "default", ErrUnsupported, "unknown field (accepted only as an exact copy of the whole document)")
	var def map[string]json.RawMessage
	if json.Unmarshal(raw, &def) != nil || len(def) != len(top.m)-1 {
		return bad
	}
	for k, v := range def {
		w, ok := top.m[k]
		if !ok || k == "default" {
			return bad
		}
		if bytes.Equal(v, w) {
			continue
		}
		var a, b bytes.Buffer
		if json.Compact(&a, v) != nil || json.Compact(&b, w) != nil || !bytes.Equal(a.Bytes(), b.Bytes()) {
			return bad
		}
	}
	return nil
}

func (t *Tokenizer) parseModel(path string, top *object) error {
	raw := top.raw("model")
	if raw == nil {
		return errorf(path, "model", ErrMissing, "required field absent")
	}
	m, err := newObject(path, "model", raw)
	if err != nil {
		return err
	}
	if _, err := m.wantStr("type", "BPE"); err != nil {
		return err
	}
	if err := m.wantNull("dropout", "BPE dropout is random"); err != nil {
		return err
	}
	if err := m.wantNull("unk_token", "byte-level BPE needs no unknown token"); err != nil {
		return err
	}
	if err := m.wantEmpty("continuing_subword_prefix", "not used by byte-level BPE"); err != nil {
		return err
	}
	if err := m.wantEmpty("end_of_word_suffix", "not used by byte-level BPE"); err != nil {
		return err
	}
	if err := m.wantFalse("byte_fallback", "byte-level BPE needs no byte fallback"); err != nil {
		return err
	}
	m.ignore("fuse_unk") // only acts on unknown tokens, which need unk_token
	if t.ignoreMerges, err = m.boolean("ignore_merges"); err != nil {
		return err
	}

	var vocab map[string]int
	if _, err := m.decode("vocab", true, &vocab, "an object of token → id"); err != nil {
		return err
	}
	if len(vocab) == 0 {
		return errorf(path, "model.vocab", ErrMalformed, "empty vocabulary")
	}
	maxID := -1
	for tok, id := range vocab {
		if id < 0 || id >= 1<<30 {
			return errorf(path, "model.vocab", ErrMalformed, "token %q has id %d", tok, id)
		}
		if tok == "" {
			return errorf(path, "model.vocab", ErrMalformed, "empty token string (id %d)", id)
		}
		maxID = max(maxID, id)
	}
	t.vocab = vocab
	t.tokens = make([]string, maxID+1)
	for tok, id := range vocab {
		if t.tokens[id] != "" {
			a, b := t.tokens[id], tok
			if a > b {
				a, b = b, a
			}
			return errorf(path, "model.vocab", ErrMalformed, "tokens %q and %q share id %d", a, b, id)
		}
		t.tokens[id] = tok
	}
	for b := 0; b < 256; b++ {
		id, ok := vocab[string(byteRune[b])]
		if !ok {
			return errorf(path, "model.vocab", ErrMalformed, "no token for byte 0x%02x (%q): not a complete byte-level vocabulary", b, string(byteRune[b]))
		}
		t.byteID[b] = int32(id)
	}

	mraw := m.raw("merges")
	if mraw == nil {
		return errorf(path, "model.merges", ErrMissing, "required field absent")
	}
	pairs, err := parseMerges(path, mraw)
	if err != nil {
		return err
	}
	t.merges = newMergeTable(len(pairs))
	for i, p := range pairs {
		field := fmt.Sprintf("model.merges[%d]", i)
		a, ok := vocab[p[0]]
		if !ok {
			return errorf(path, field, ErrMalformed, "left part %q is not in model.vocab", p[0])
		}
		b, ok := vocab[p[1]]
		if !ok {
			return errorf(path, field, ErrMalformed, "right part %q is not in model.vocab", p[1])
		}
		c, ok := vocab[p[0]+p[1]]
		if !ok {
			return errorf(path, field, ErrMalformed, "merged token %q is not in model.vocab", p[0]+p[1])
		}
		// A repeated pair takes its last rank, as in Hugging Face tokenizers.
		t.merges.set(pairKey(int32(a), int32(b)), merge{rank: int32(i), id: int32(c)})
	}
	return m.done()
}

// parseMerges accepts both encodings of model.merges: "left right" strings
// and ["left", "right"] pairs (one encoding for the whole list).
func parseMerges(path string, raw json.RawMessage) ([][2]string, error) {
	if jsonType(raw) != "an array" {
		return nil, errorf(path, "model.merges", ErrMalformed, "want an array, have %s", jsonType(raw))
	}
	// The first element says which encoding to try first.
	head := bytes.TrimLeft(bytes.TrimSpace(raw)[1:], " \t\r\n")
	pairs := len(head) > 0 && head[0] == '['
	var strs []string
	if pairs {
		// skip the string attempt
	} else if err := json.Unmarshal(raw, &strs); err == nil {
		out := make([][2]string, len(strs))
		for i, s := range strs {
			l, r, ok := strings.Cut(s, " ")
			if !ok || l == "" || r == "" || strings.Contains(r, " ") {
				return nil, errorf(path, fmt.Sprintf("model.merges[%d]", i), ErrMalformed, "%q is not two tokens separated by one space", s)
			}
			out[i] = [2]string{l, r}
		}
		return out, nil
	}
	var arrs [][]string
	if err := json.Unmarshal(raw, &arrs); err == nil {
		out := make([][2]string, len(arrs))
		for i, a := range arrs {
			if len(a) != 2 || a[0] == "" || a[1] == "" {
				return nil, errorf(path, fmt.Sprintf("model.merges[%d]", i), ErrMalformed, "want a pair of two non-empty token strings, have %d strings", len(a))
			}
			out[i] = [2]string{a[0], a[1]}
		}
		return out, nil
	}
	// Neither: find the first offending element for the message.
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errorf(path, "model.merges", ErrMalformed, "%v", err)
	}
	first := jsonType(items[0])
	for i, it := range items {
		ty := jsonType(it)
		if (ty != "a string" && ty != "an array") || ty != first {
			return nil, errorf(path, fmt.Sprintf("model.merges[%d]", i), ErrMalformed, "want %s like the first merge, have %s", first, ty)
		}
		var a []string
		if ty == "an array" && json.Unmarshal(it, &a) != nil {
			return nil, errorf(path, fmt.Sprintf("model.merges[%d]", i), ErrMalformed, "want an array of strings")
		}
	}
	return nil, errorf(path, "model.merges", ErrMalformed, "want strings \"a b\" or pairs [\"a\",\"b\"]")
}

func (t *Tokenizer) parseAdded(path string, top *object) error {
	raw := top.raw("added_tokens")
	if raw == nil || isNull(raw) {
		return nil
	}
	var items []json.RawMessage
	if jsonType(raw) != "an array" || json.Unmarshal(raw, &items) != nil {
		return errorf(path, "added_tokens", ErrMalformed, "want an array, have %s", jsonType(raw))
	}
	seen := map[string]int{}
	for i, it := range items {
		at := fmt.Sprintf("added_tokens[%d]", i)
		o, err := newObject(path, at, it)
		if err != nil {
			return err
		}
		var id int
		if _, err := o.decode("id", true, &id, "an integer id"); err != nil {
			return err
		}
		if id < 0 || id >= 1<<30 {
			return errorf(path, o.field("id"), ErrMalformed, "id %d out of range", id)
		}
		content, ok, err := o.str("content")
		if err != nil {
			return err
		}
		if !ok || content == "" {
			return errorf(path, o.field("content"), ErrMalformed, "an added token needs non-empty content")
		}
		if j, dup := seen[content]; dup {
			return errorf(path, o.field("content"), ErrMalformed, "%q is also added_tokens[%d]", content, j)
		}
		seen[content] = i
		special, err := o.boolean("special")
		if err != nil {
			return err
		}
		for _, k := range []string{"single_word", "lstrip", "rstrip"} {
			if err := o.wantFalse(k, "added tokens are matched exactly"); err != nil {
				return err
			}
		}
		if err := o.wantFalse("normalized", "added tokens are matched in the raw text, before normalization"); err != nil {
			return err
		}
		if err := o.done(); err != nil {
			return err
		}
		if id < len(t.tokens) && t.tokens[id] != "" && t.tokens[id] != content {
			if _, isAdded := t.addedID[id]; isAdded {
				return errorf(path, o.field("id"), ErrMalformed, "id %d given to two added tokens", id)
			}
		}
		if t.addedID == nil {
			t.addedID = map[int]int{}
		}
		if _, dup := t.addedID[id]; dup {
			return errorf(path, o.field("id"), ErrMalformed, "id %d given to two added tokens", id)
		}
		t.addedID[id] = len(t.added)
		t.added = append(t.added, addedToken{content: content, id: id, special: special})
	}
	t.buildAddedIndex()
	return nil
}

// section opens the pipeline stage key of tokenizer.json and requires its
// type to be typ. An absent or null stage gives (nil, nil) when it is
// optional, and an unsupported-error saying what is needed (absent) when it
// is not.
func section(path string, top *object, key, typ, absent string) (*object, error) {
	raw := top.raw(key)
	if raw == nil || isNull(raw) {
		if absent != "" {
			return nil, errorf(path, key, ErrUnsupported, "absent; %s", absent)
		}
		return nil, nil
	}
	o, err := newObject(path, key, raw)
	if err != nil {
		return nil, err
	}
	if _, err := o.wantStr("type", typ); err != nil {
		return nil, err
	}
	return o, nil
}

// byteLevelOptions accepts the boolean options of a ByteLevel stage. As a
// post-processor or decoder ByteLevel adds no tokens and maps bytes back the
// same way whatever they say; they touch offsets only.
func byteLevelOptions(o *object) error {
	for _, k := range []string{"add_prefix_space", "trim_offsets", "use_regex"} {
		if _, err := o.boolean(k); err != nil {
			return err
		}
	}
	return o.done()
}

func (t *Tokenizer) parseNormalizer(path string, top *object) error {
	o, err := section(path, top, "normalizer", "NFC", "")
	if o == nil || err != nil {
		return err
	}
	t.nfc = true
	return o.done()
}

func (t *Tokenizer) parsePreTokenizer(path string, top *object) error {
	seq, err := section(path, top, "pre_tokenizer", "Sequence", "a Sequence of Split and ByteLevel is required")
	if err != nil {
		return err
	}
	var items []json.RawMessage
	if _, err := seq.decode("pretokenizers", true, &items, "an array"); err != nil {
		return err
	}
	if len(items) != 2 {
		return errorf(path, "pre_tokenizer.pretokenizers", ErrUnsupported, "%d pre-tokenizers; supported: exactly [Split, ByteLevel]", len(items))
	}
	sp, err := newObject(path, "pre_tokenizer.pretokenizers[0]", items[0])
	if err != nil {
		return err
	}
	if _, err := sp.wantStr("type", "Split"); err != nil {
		return err
	}
	pat, err := newObject(path, sp.field("pattern"), sp.raw("pattern"))
	if err != nil {
		return err
	}
	re, ok, err := pat.str("Regex")
	if err != nil {
		return err
	}
	if !ok {
		return errorf(path, pat.field("Regex"), ErrUnsupported, "only a Regex pattern is supported")
	}
	if t.pattern = patternOf(re); t.pattern == patternInvalid {
		return errorf(path, pat.field("Regex"), ErrUnsupported, "pattern %q is not one of the hand-written splitters (Qwen2/3: %q; Qwen3.5/3.6: %q)", re, RegexQwen2, RegexQwen35)
	}
	if err := pat.done(); err != nil {
		return err
	}
	t.split = newSplitter(t.pattern)
	if _, err := sp.wantStr("behavior", "Isolated"); err != nil {
		return err
	}
	if err := sp.wantFalse("invert", "only matches are pre-tokens"); err != nil {
		return err
	}
	if err := sp.done(); err != nil {
		return err
	}
	bl, err := newObject(path, "pre_tokenizer.pretokenizers[1]", items[1])
	if err != nil {
		return err
	}
	if _, err := bl.wantStr("type", "ByteLevel"); err != nil {
		return err
	}
	if err := bl.wantFalse("add_prefix_space", "no space is prepended"); err != nil {
		return err
	}
	if err := bl.wantFalse("use_regex", "the Split before it is the only splitting"); err != nil {
		return err
	}
	if _, err := bl.boolean("trim_offsets"); err != nil { // offsets only
		return err
	}
	if err := bl.done(); err != nil {
		return err
	}
	return seq.done()
}

func (t *Tokenizer) parsePostProcessor(path string, top *object) error {
	o, err := section(path, top, "post_processor", "ByteLevel", "")
	if o == nil || err != nil {
		return err
	}
	return byteLevelOptions(o)
}

func (t *Tokenizer) parseDecoder(path string, top *object) error {
	o, err := section(path, top, "decoder", "ByteLevel", "a ByteLevel decoder is required")
	if err != nil {
		return err
	}
	return byteLevelOptions(o)
}

// parseConfig reads the special-token names of tokenizer_config.json. Other
// fields of that file (chat templates, class names, lengths) are not used.
func (t *Tokenizer) parseConfig(path string, data []byte) error {
	if !json.Valid(data) {
		var v any
		err := json.Unmarshal(data, &v)
		return errorf(path, "", ErrMalformed, "not valid JSON: %v", err)
	}
	o, err := newObject(path, "", data)
	if err != nil {
		return err
	}
	split, err := o.boolean("split_special_tokens")
	if err != nil {
		return err
	}
	if split {
		return errorf(path, "split_special_tokens", ErrUnsupported, "true is not supported (special tokens are always split out)")
	}
	for _, k := range []string{"add_bos_token", "add_eos_token"} {
		if _, err := o.boolean(k); err != nil {
			return err
		}
	}
	for _, st := range []struct {
		key string
		dst *int
	}{{"eos_token", &t.eos}, {"bos_token", &t.bos}, {"pad_token", &t.pad}} {
		name, ok, err := tokenName(o, st.key)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		id, found := t.ID(name)
		if !found {
			return errorf(path, st.key, ErrMalformed, "%q is not a token of the tokenizer", name)
		}
		*st.dst = id
	}
	return nil
}

// tokenName reads a special-token entry: a string, null, or an object with
// "content" (the older AddedToken form).
func tokenName(o *object, key string) (string, bool, error) {
	raw := o.raw(key)
	if raw == nil || isNull(raw) {
		return "", false, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, s != "", nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, *obj.Content != "", nil
	}
	return "", false, errorf(o.path, o.field(key), ErrMalformed, "want a string or an object with \"content\", have %s", jsonType(raw))
}
