package selection

import (
	"fmt"
	"strings"

	"github.com/ttquant/ttquant/manifest"
)

// Candidate is one precision a unit may get: a stored format and, for a
// BFP format, the method that produces it.
type Candidate struct {
	Format manifest.StoredFormat `json:"format"`
	Method manifest.Method       `json:"method"`
}

// String spells c as the command line does: "BFP4_b:gptq", "AS_IS".
func (c Candidate) String() string {
	if !c.Format.IsBFP() {
		return string(c.Format)
	}
	return string(c.Format) + ":" + string(c.Method)
}

// DefaultCandidates is BFP4_b with GPTQ, BFP8_b rounded, and the matrix as
// stored.
const DefaultCandidates = "BFP4_b:gptq,BFP8_b:rtn,AS_IS"

// ParseCandidate reads one candidate: FORMAT:METHOD for a BFP format
// (gptq or rtn), AS_IS alone.
func ParseCandidate(s string) (Candidate, error) {
	f, m, hasMethod := strings.Cut(strings.TrimSpace(s), ":")
	format, err := manifest.ParseStoredFormat(f)
	if err != nil {
		return Candidate{}, fmt.Errorf("selection: candidate %q: %w", s, err)
	}
	switch {
	case format.IsBFP():
		if !hasMethod {
			return Candidate{}, fmt.Errorf("selection: candidate %q: a BFP format needs a method (%s:gptq or %s:rtn)", s, format, format)
		}
		method, err := manifest.ParseMethod(m)
		if err != nil || method == manifest.MethodNone {
			return Candidate{}, fmt.Errorf("selection: candidate %q: method %q (want gptq or rtn)", s, m)
		}
		return Candidate{format, method}, nil
	case format == manifest.StoreAsIs:
		if hasMethod {
			return Candidate{}, fmt.Errorf("selection: candidate %q: AS_IS takes no method", s)
		}
		return Candidate{format, manifest.MethodNone}, nil
	}
	return Candidate{}, fmt.Errorf("selection: candidate %q: want a BFP format with a method or AS_IS (the matrix as stored)", s)
}

// ParseCandidates reads a comma-separated candidate list; a repeated
// candidate is an error.
func ParseCandidates(s string) ([]Candidate, error) {
	var cs []Candidate
	seen := map[Candidate]bool{}
	for _, part := range strings.Split(s, ",") {
		c, err := ParseCandidate(part)
		if err != nil {
			return nil, err
		}
		if seen[c] {
			return nil, fmt.Errorf("selection: candidate %s listed twice", c)
		}
		seen[c] = true
		cs = append(cs, c)
	}
	return cs, nil
}

// bfpFormats lists the BFP formats among cs, in StoredFormats order (the
// formats MeasurePrepared builds).
func bfpFormats(cs []Candidate) []manifest.StoredFormat {
	var fs []manifest.StoredFormat
	for _, f := range manifest.StoredFormats {
		for _, c := range cs {
			if c.Format == f && f.IsBFP() {
				fs = append(fs, f)
				break
			}
		}
	}
	return fs
}
