package dataset

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
)

// Fingerprints: a compact sample of a set's text, so that a checkpoint's
// manifest can say what it was calibrated on without the text itself, and
// an evaluation can check that its text is not that text (docs/data.md,
// "Fingerprint").
const (
	// FingerprintRun is the run length in tokens of a fingerprint's
	// shingles: a shared run shorter than this is not overlap.
	FingerprintRun = 32
	// FingerprintSample keeps one shingle in this many, chosen by its
	// hash (so the same run is kept or dropped in every text).
	FingerprintSample = 16
	// BoilerplateRecords: a run that occurs in at least this many distinct
	// records of a set is boilerplate (a licence header, a file preamble)
	// and never counts as overlap.
	BoilerplateRecords = 3
)

// Fingerprint is a sample of the hashes of a set's runs of Run tokens:
// those whose hash is 0 modulo Sample, without the boilerplate (runs in at
// least BoilerplateRecords records of the set). Each hash's low bits, zero
// in a sampled hash, hold the number of the set's records the run occurs
// in, so that a run is also boilerplate when it occurs in that many
// records of the calibration and the evaluation text together.
type Fingerprint struct {
	Run    int `json:"run_tokens"`
	Sample int `json:"sample"`
	// Boilerplate is the record count from which a run is boilerplate;
	// Dropped the sampled runs dropped as boilerplate.
	Boilerplate int `json:"boilerplate_records"`
	Dropped     int `json:"boilerplate_dropped"`
	// Shingles is the number of distinct sampled runs kept; Hashes their
	// 64-bit hashes, each or-ed with its record count, sorted,
	// little-endian, in standard base64.
	Shingles int    `json:"shingles"`
	Hashes   string `json:"hashes"`
}

// mix64 is a bijective 64-bit finaliser (splitmix64's).
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

const shingleBase = 0x100000001b3 // odd: the rolling hash is invertible per step

// shingles calls fn with the start and the mixed hash of every run of n
// tokens of ids.
func shingles(ids []int32, n int, fn func(at int, h uint64)) {
	if len(ids) < n {
		return
	}
	pow := uint64(1)
	for i := 0; i < n-1; i++ {
		pow *= shingleBase
	}
	var h uint64
	for i, id := range ids {
		if i >= n {
			h -= mix64(uint64(uint32(ids[i-n]))+1) * pow
		}
		h = h*shingleBase + mix64(uint64(uint32(id))+1)
		if i >= n-1 {
			fn(i-n+1, mix64(h^uint64(n)))
		}
	}
}

// documents splits a set's sequences into the parts of its records: for
// every part, the key of the record it belongs to and its tokens. A record
// packed across two sequences is one document.
func documents(set *Set, fn func(key string, ids []int32)) {
	for _, s := range set.Sequences {
		if len(s.Records) == 0 {
			fn("", s.IDs)
			continue
		}
		for k, r := range s.Records {
			lo, hi := max(r.Start, 0), len(s.IDs)
			if k+1 < len(s.Records) {
				hi = min(max(s.Records[k+1].Start, 0), len(s.IDs))
			}
			if lo < hi {
				fn(fmt.Sprintf("%d\x00%s", r.Source, r.Where), s.IDs[lo:hi])
			}
		}
	}
}

// sampledRecords maps every sampled run of the set to the number of
// distinct records it occurs in.
func sampledRecords(set *Set, run, sample int) map[uint64]int {
	type seen struct {
		h   uint64
		key string
	}
	count := map[uint64]int{}
	in := map[seen]bool{}
	documents(set, func(key string, ids []int32) {
		shingles(ids, run, func(_ int, h uint64) {
			if h%uint64(sample) != 0 || in[seen{h, key}] {
				return
			}
			in[seen{h, key}] = true
			count[h]++
		})
	})
	return count
}

// NewFingerprint fingerprints a set with runs of run tokens (0:
// FingerprintRun).
func NewFingerprint(set *Set, run int) (*Fingerprint, error) {
	if run == 0 {
		run = FingerprintRun
	}
	if run < 2 {
		return nil, fmt.Errorf("dataset: fingerprint runs of %d tokens; want at least 2", run)
	}
	f := &Fingerprint{Run: run, Sample: FingerprintSample, Boilerplate: BoilerplateRecords}
	var keep []uint64
	for h, n := range sampledRecords(set, run, f.Sample) {
		if n >= f.Boilerplate {
			f.Dropped++
			continue
		}
		keep = append(keep, h|uint64(n))
	}
	slices.Sort(keep)
	b := make([]byte, 8*len(keep))
	for i, h := range keep {
		binary.LittleEndian.PutUint64(b[8*i:], h)
	}
	f.Shingles, f.Hashes = len(keep), base64.StdEncoding.EncodeToString(b)
	return f, nil
}

// FingerprintIndex is a decoded fingerprint, ready to check text against.
type FingerprintIndex struct {
	f Fingerprint
	// records is the number of calibration records of each sampled run.
	records map[uint64]int
}

// Index decodes the fingerprint, checking it.
func (f *Fingerprint) Index() (*FingerprintIndex, error) {
	if f.Run < 2 || f.Sample < 16 || f.Sample&(f.Sample-1) != 0 || f.Boilerplate < 2 || f.Boilerplate > f.Sample {
		return nil, fmt.Errorf("dataset: fingerprint with runs of %d tokens, sample 1 in %d, boilerplate from %d records: invalid", f.Run, f.Sample, f.Boilerplate)
	}
	b, err := base64.StdEncoding.DecodeString(f.Hashes)
	if err != nil || len(b) != 8*f.Shingles {
		return nil, fmt.Errorf("dataset: fingerprint hashes do not decode to %d shingles", f.Shingles)
	}
	x := &FingerprintIndex{f: *f, records: make(map[uint64]int, f.Shingles)}
	low := uint64(f.Sample - 1)
	for i := 0; i < f.Shingles; i++ {
		h := binary.LittleEndian.Uint64(b[8*i:])
		if i > 0 && h <= binary.LittleEndian.Uint64(b[8*i-8:]) {
			return nil, fmt.Errorf("dataset: fingerprint hashes are not sorted and distinct")
		}
		n := int(h & low)
		if n < 1 || n >= f.Boilerplate {
			return nil, fmt.Errorf("dataset: fingerprint hash %d counts %d records; want 1 to %d", i, n, f.Boilerplate-1)
		}
		x.records[h&^low] = n
	}
	return x, nil
}

// Run is the index's run length in tokens.
func (x *FingerprintIndex) Run() int { return x.f.Run }

// Shared marks, for every sequence of set, the tokens that lie in a
// sampled run of the fingerprint's text, except boilerplate: a run that
// occurs in at least the fingerprint's boilerplate count of records of the
// calibration text and set together (a licence header, a preamble) is not
// overlap, nor is a shared span shorter than two runs.
func (x *FingerprintIndex) Shared(set *Set) [][]bool {
	inSet := sampledRecords(set, x.f.Run, x.f.Sample)
	out := make([][]bool, len(set.Sequences))
	for i, s := range set.Sequences {
		m := make([]bool, len(s.IDs))
		shingles(s.IDs, x.f.Run, func(at int, h uint64) {
			if h%uint64(x.f.Sample) != 0 {
				return
			}
			if n, ok := x.records[h]; ok && n+inSet[h] < x.f.Boilerplate {
				for k := at; k < at+x.f.Run; k++ {
					m[k] = true
				}
			}
		})
		// A shared span shorter than two runs is a common idiom or a
		// variant of boilerplate (a licence header followed by the
		// same package clause), not copied text.
		for lo := 0; lo < len(m); {
			if !m[lo] {
				lo++
				continue
			}
			hi := lo
			for hi < len(m) && m[hi] {
				hi++
			}
			if hi-lo < 2*x.f.Run {
				clear(m[lo:hi])
			}
			lo = hi
		}
		out[i] = m
	}
	return out
}

// Merge returns an index holding both indexes' runs; they must have been
// made with the same run length and sample.
func (x *FingerprintIndex) Merge(y *FingerprintIndex) (*FingerprintIndex, error) {
	if x.f.Run != y.f.Run || x.f.Sample != y.f.Sample || x.f.Boilerplate != y.f.Boilerplate {
		return nil, fmt.Errorf("dataset: merging fingerprints of runs %d/%d, samples %d/%d, boilerplate %d/%d", x.f.Run, y.f.Run, x.f.Sample, y.f.Sample, x.f.Boilerplate, y.f.Boilerplate)
	}
	// Two checkpoints calibrated on the same text count its records once.
	z := &FingerprintIndex{f: x.f, records: make(map[uint64]int, len(x.records)+len(y.records))}
	for _, r := range []map[uint64]int{x.records, y.records} {
		for h, n := range r {
			z.records[h] = max(z.records[h], n)
		}
	}
	return z, nil
}
