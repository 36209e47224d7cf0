package manifest

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/safetensors"
)

// Layout defaults.
const (
	// DefaultExpertsPerFile is the number of routed experts stored per
	// grouped expert file.
	DefaultExpertsPerFile = 16
	// DefaultDenseShardBytes is the target size of a dense shard file.
	DefaultDenseShardBytes int64 = 4 << 30
)

// storedTensor is one tensor of the native checkpoint, with everything
// needed to produce its bytes from the source.
type storedTensor struct {
	name   string
	source string
	expert int // -1: not an expert tensor
	layer  int // -1: not in a layer
	role   string
	kind   string // "gate_up" or "down" for routed experts
	rule   int
	method string
	format string // "BFP8_b", "BFP4_b", "BFP2_b", "BF16", "AS_IS"
	bfpF   bfp.Format
	isBFP  bool
	tile   bfp.Tile
	axis   string
	orient string

	parts    []sourcePart // concatenated in order
	srcDType string
	srcLen   int64   // total source bytes
	shape    []int64 // logical shape of the stored tensor

	outDType string
	padded   []int64
	outSize  int64
}

func (st *storedTensor) sourceRefs() []SourceRef {
	out := make([]SourceRef, len(st.parts))
	for i, p := range st.parts {
		out[i] = SourceRef{Tensor: p.tensor, Offset: p.off, Length: p.len}
	}
	return out
}

func (st *storedTensor) isExpertMatrix() bool { return st.expert >= 0 }

// expertKind returns "gate_up" or "down" for a routed expert tensor.
func (st *storedTensor) expertKind() string {
	if st.kind != "" {
		return st.kind
	}
	if strings.Contains(st.name, "down") {
		return "down"
	}
	return "gate_up"
}

// sourcePart is a byte range of one source tensor.
type sourcePart struct {
	file   *safetensors.File
	tensor string
	off    int64
	len    int64
}

// job is the unit of work, resumption and parallelism: one output file.
type job struct {
	file    string
	role    string
	layer   int // -1 for dense shards
	kind    string
	group   int
	tensors []*storedTensor
	bytes   int64
}

var layerRe = regexp.MustCompile(`(^|\.)(mtp\.)?layers\.(\d+)\.`)

// layerOf returns the layer index of a tensor name: the trunk layer number,
// or for an MTP layer k, numTrunk + k. -1 when the name is not in a layer.
func layerOf(name string, numTrunk int) int {
	m := layerRe.FindStringSubmatch(name)
	if m == nil {
		return -1
	}
	n, err := strconv.Atoi(m[3])
	if err != nil {
		return -1
	}
	if m[2] != "" {
		return numTrunk + n
	}
	return n
}

// expertFileName is the name of a grouped expert file.
func expertFileName(layer int, kind string, group int) string {
	return fmt.Sprintf("experts-l%03d-%s-g%03d.safetensors", layer, kind, group)
}

// planJobs assigns every stored tensor to a file. Routed expert tensors go
// to grouped expert files (experts e with e/perFile == g of one layer and
// one kind); the others fill dense shards in name order, a new shard being
// started when the next tensor would push the current one past shardBytes.
// The result is sorted by file name and does not depend on map order.
func planJobs(ts []*storedTensor, perFile int, shardBytes int64) ([]*job, error) {
	if perFile <= 0 {
		return nil, fmt.Errorf("manifest: experts per file must be positive, got %d", perFile)
	}
	if shardBytes <= 0 {
		return nil, fmt.Errorf("manifest: dense shard size must be positive, got %d", shardBytes)
	}
	groups := map[string]*job{}
	var dense []*storedTensor
	for _, st := range ts {
		if !st.isExpertMatrix() || st.layer < 0 {
			dense = append(dense, st)
			continue
		}
		kind := st.expertKind()
		g := st.expert / perFile
		name := expertFileName(st.layer, kind, g)
		j := groups[name]
		if j == nil {
			j = &job{file: name, role: FileExperts, layer: st.layer, kind: kind, group: g}
			groups[name] = j
		}
		j.tensors = append(j.tensors, st)
		j.bytes += st.outSize
	}
	var jobs []*job
	for _, j := range groups {
		sort.Slice(j.tensors, func(a, b int) bool {
			x, y := j.tensors[a], j.tensors[b]
			if x.expert != y.expert {
				return x.expert < y.expert
			}
			return x.name < y.name
		})
		jobs = append(jobs, j)
	}
	sort.Slice(dense, func(a, b int) bool { return dense[a].name < dense[b].name })
	var shards [][]*storedTensor
	var cur []*storedTensor
	var curBytes int64
	for _, st := range dense {
		if len(cur) > 0 && curBytes+st.outSize > shardBytes {
			shards = append(shards, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, st)
		curBytes += st.outSize
	}
	if len(cur) > 0 {
		shards = append(shards, cur)
	}
	for i, s := range shards {
		j := &job{file: fmt.Sprintf("dense-%05d-of-%05d.safetensors", i+1, len(shards)), role: FileDense, layer: -1, group: i, tensors: s}
		for _, st := range s {
			j.bytes += st.outSize
		}
		jobs = append(jobs, j)
	}
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].file < jobs[b].file })
	return jobs, nil
}
