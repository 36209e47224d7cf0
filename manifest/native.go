package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/ttquant/ttquant/bfp"
)

// Names of the fixed files of a native checkpoint.
const (
	// ManifestName is the manifest file, written last.
	ManifestName = "native_manifest.json"
	// SumsName is the checksum list in the format `sha256sum -c` reads. It
	// lists every file of the checkpoint except itself and the manifest; the
	// manifest in turn records the hash of SumsName.
	SumsName = "SHA256SUMS"
	// PartialDir holds the bookkeeping of an unfinished build; it never
	// survives a completed build.
	PartialDir = ".ttquant-partial"
)

// FormatVersion is the native_manifest.json format version this package
// writes and reads. It changes when a field is removed or changes meaning.
const FormatVersion = 1

// FormatName identifies the manifest kind in its "format" field.
const FormatName = "ttquant-native-checkpoint"

// Orientations of a stored BFP tensor.
const (
	// OrientRow: the packed matrix is the logical matrix (last two dims, all
	// leading dims folded into the rows); exponent groups run along the last
	// dim, the input features of a [out, in] weight.
	OrientRow = "row"
	// OrientTransposed: the packed matrix is the transpose of the last two
	// logical dims; exponent groups run along the logical second-to-last dim
	// (the output features of a [out, in] weight).
	OrientTransposed = "transposed"
)

// File roles.
const (
	FileExperts  = "experts"
	FileDense    = "dense"
	FileConfig   = "config"
	FileChecksum = "checksums"
)

// Manifest is the content of native_manifest.json. Field order is the
// serialization order; every list is sorted, so the same checkpoint always
// serializes to the same bytes.
type Manifest struct {
	FormatVersion int    `json:"format_version"`
	Format        string `json:"format"`
	// Integrity is the sha256 of the manifest's own bytes with this
	// field's value replaced by 64 zeros: any change to the manifest is
	// detected. (It protects against damage, not against a forger, who
	// can recompute it; the identity is what users compare.)
	Integrity string         `json:"integrity"`
	Tool      ToolInfo       `json:"tool"`
	Source    SourceInfo     `json:"source"`
	Plan      PlanInfo       `json:"plan"`
	Layout    LayoutInfo     `json:"layout"`
	Files     []FileEntry    `json:"files"`
	Tensors   []TensorEntry  `json:"tensors"`
	TTQuant   TTQuantSection `json:"ttquant"`
}

// ToolInfo names the program that wrote the checkpoint. It is provenance:
// the identity does not cover it (see Identity).
type ToolInfo struct {
	Name     string `json:"name"`
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

// SourceInfo identifies the source checkpoint: every shard's size and hash
// and the index file, and an identity hash over them.
type SourceInfo struct {
	Format   string      `json:"format"`
	Files    []FileEntry `json:"files"`
	Index    *FileEntry  `json:"index,omitempty"`
	Identity string      `json:"identity"`
}

// PlanInfo is the precision plan the checkpoint was built with.
type PlanInfo struct {
	Name   string     `json:"name"`
	Rules  []RuleInfo `json:"rules"`
	SHA256 string     `json:"sha256"`
}

// RuleInfo is one plan rule as recorded in the manifest.
type RuleInfo struct {
	Pattern string       `json:"pattern"`
	Format  StoredFormat `json:"format"`
	Method  Method       `json:"method"`
	Axis    bfp.Axis     `json:"axis,omitempty"`
	Tile    string       `json:"tile,omitempty"`
}

// LayoutInfo records the layout parameters.
type LayoutInfo struct {
	ExpertsPerFile  int   `json:"experts_per_file"`
	DenseShardBytes int64 `json:"dense_shard_bytes"`
	Alignment       int   `json:"alignment"`
}

// FileEntry is one file with its size and hash.
type FileEntry struct {
	Name   string `json:"name"`
	Role   string `json:"role,omitempty"`
	Layer  *int   `json:"layer,omitempty"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// TensorEntry describes one stored tensor.
type TensorEntry struct {
	Name string `json:"name"`
	// Sources are the source byte ranges whose concatenation is the stored
	// tensor's source data: one range of one tensor usually (a slice of a
	// fused expert tensor), several when parts are joined (gate and up of
	// a per-expert source).
	Sources []SourceRef `json:"sources"`
	// Expert is the expert index within a fused source tensor, or the
	// expert the tensor belongs to; absent for non-expert tensors.
	Expert      *int    `json:"expert,omitempty"`
	Layer       *int    `json:"layer,omitempty"`
	Role        string  `json:"role"`
	Rule        int     `json:"rule"`
	Method      Method  `json:"method"`
	Format      string  `json:"format"`
	SourceDType string  `json:"source_dtype"`
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	PaddedShape []int64 `json:"padded_shape,omitempty"`
	Orientation string  `json:"orientation,omitempty"`
	Tile        string  `json:"tile,omitempty"`
	File        string  `json:"file"`
	Offset      int64   `json:"offset"`
	Length      int64   `json:"length"`
	SHA256      string  `json:"sha256"`
	Finite      bool    `json:"finite"`
}

// SourceRef is a byte range [Offset, Offset+Length) of a source tensor's
// data.
type SourceRef struct {
	Tensor string `json:"tensor"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
}

// TTQuantSection carries what ttquant did: the GPTQ parameters, the
// calibration identity, statistics, and the parent checkpoint.
type TTQuantSection struct {
	Command     string        `json:"command"`
	Options     BuildParams   `json:"options"`
	Calibration *CalibInfo    `json:"calibration,omitempty"`
	Layers      []LayerStats  `json:"layers,omitempty"`
	Matrices    []MatrixStats `json:"matrices,omitempty"`
	Parent      string        `json:"parent_manifest_sha256,omitempty"`
	// NonFinite lists the tensors stored although their source holds NaN
	// or Inf, which a build does only when told to (--allow-nonfinite).
	NonFinite []string `json:"nonfinite_tensors,omitempty"`
}

// BuildParams are the options that influence the bytes written. They take
// part in the resume check.
type BuildParams struct {
	Layers       string  `json:"layers,omitempty"`
	BlockSize    int     `json:"gptq_block_size,omitempty"`
	PercDamp     float64 `json:"gptq_percdamp,omitempty"`
	ActOrder     bool    `json:"gptq_act_order,omitempty"`
	StaticGroups bool    `json:"gptq_static_groups,omitempty"`
	Float64      bool    `json:"gptq_float64,omitempty"`
	// NoProxyLoss: the matrices' proxy losses were not computed (0).
	NoProxyLoss bool `json:"gptq_no_proxy_loss,omitempty"`
	HeldOut     int  `json:"held_out_sequences,omitempty"`
	// Asymmetric: every GPTQ'd matrix was fitted to the source model's
	// outputs on the source model's inputs (sequential builds; see
	// docs/calibration.md).
	Asymmetric bool `json:"asymmetric,omitempty"`
	// BFPExponent is the rule that chose each BFP group's shared
	// exponent, in GPTQ and in rounding: "ttmetal" or "search"; empty for
	// the packer's own rule (the largest magnitude's exponent, "max").
	BFPExponent    string `json:"bfp_exponent,omitempty"`
	ExpertsPerFile int    `json:"experts_per_file"`
	DenseShard     int64  `json:"dense_shard_bytes"`
}

// BFPExponentRules are the spellings of BuildParams.BFPExponent other than
// none: the rules of package gptq besides the packer's own (gptq's
// ExponentRule.String; a build test checks they agree).
var BFPExponentRules = []string{"ttmetal", "search"}

// CalibInfo identifies the calibration store.
type CalibInfo struct {
	Sequences int64 `json:"sequences"`
	Tokens    int64 `json:"tokens"`
	// HeldOutSequences is the number of final sequences kept out of the
	// Hessians and used for the held-out block error.
	HeldOutSequences int64 `json:"held_out_sequences"`
	// SHA256 identifies the calibration data: for a store, the sha256
	// over its files' names and hashes; for a sequential build, the
	// sha256 of the calibration token ids (TokenIDsSHA256).
	SHA256 string `json:"sha256"`
	// Mode is how the activations were obtained: "store" (a calibration
	// store, every layer's inputs from the source model) or "sequential"
	// (from text, each layer's inputs from the already-quantized layers
	// before it). Empty in manifests written before it was recorded.
	Mode string `json:"mode,omitempty"`
	// TokenIDsSHA256 is the sha256 of the calibration token ids
	// (docs/data.md), when known.
	TokenIDsSHA256 string `json:"token_ids_sha256,omitempty"`
	// Data is the provenance of the calibration text as the dataset
	// builder records it (sources, their files' sha256s, options), when
	// the activations came from text.
	Data json.RawMessage `json:"data,omitempty"`
}

// Calibration modes.
const (
	CalibModeStore      = "store"
	CalibModeSequential = "sequential"
)

// LayerStats aggregates a layer's GPTQ statistics.
type LayerStats struct {
	Layer        int     `json:"layer"`
	Matrices     int     `json:"matrices"`
	GPTQ         int     `json:"gptq"`
	Fallbacks    int     `json:"fallbacks"`
	ProxyLoss    float64 `json:"proxy_loss"`
	RTNProxyLoss float64 `json:"rtn_proxy_loss"`
	// Tokens is the number of routed (token, expert) pairs of the layer's
	// calibration tokens: Σ over its experts of the tokens each received.
	Tokens int64 `json:"routed_tokens"`
	// The held-out MoE block error of a GPTQ expert layer: the mean
	// squared difference between the block output with the stored experts
	// (HeldOutMSE) or with round-to-nearest experts (HeldOutRTNMSE) and the
	// output with the source weights, and the mean square of that output.
	CalibTokens   int64   `json:"calib_tokens,omitempty"`
	HeldOutTokens int64   `json:"held_out_tokens,omitempty"`
	HeldOutMSE    float64 `json:"held_out_mse,omitempty"`
	HeldOutRTNMSE float64 `json:"held_out_rtn_mse,omitempty"`
	RefMeanSquare float64 `json:"ref_mean_square,omitempty"`
	// Starved lists the routed experts that received too few calibration
	// tokens for GPTQ.
	Starved []int `json:"starved,omitempty"`
	// Residual-stream statistics of a sequential build:
	// ResidualMeanSquare is the mean square of the stream entering the
	// layer over the calibration tokens; HeldOutStreamRelMSE is, on the
	// held-out sequences, the mean squared difference between the stream
	// leaving the layer in the quantized model and in the source model,
	// relative to the source stream's mean square (the error accumulated
	// up to and including this layer).
	ResidualMeanSquare  float64 `json:"residual_mean_square,omitempty"`
	HeldOutStreamRelMSE float64 `json:"held_out_stream_rel_mse,omitempty"`
}

// MatrixStats are one quantized matrix's statistics.
type MatrixStats struct {
	Tensor       string  `json:"tensor"`
	Layer        *int    `json:"layer,omitempty"`
	Expert       *int    `json:"expert,omitempty"`
	Method       Method  `json:"method"`
	Tokens       int64   `json:"tokens"`
	Damp         float64 `json:"damp"`
	ProxyLoss    float64 `json:"proxy_loss"`
	RTNProxyLoss float64 `json:"rtn_proxy_loss"`
	// Error is Σ (w − q)² over the logical elements, in float64, in
	// row-major order; verify --source recomputes it exactly.
	Error    float64 `json:"error"`
	Fallback string  `json:"fallback,omitempty"`
	// Fit is FitAsymmetric when GPTQ quantized the matrix's fit to the
	// source model's outputs (an asymmetric sequential build) instead of
	// the matrix itself; ProxyLoss and RTNProxyLoss are then measured
	// against that fit. Empty otherwise.
	Fit string `json:"fit,omitempty"`
}

// FitAsymmetric is MatrixStats.Fit of a matrix fitted asymmetrically.
const FitAsymmetric = "asymmetric"

// Encode returns the canonical bytes of m: indented JSON with a trailing
// newline, with the integrity field filled in (m.Integrity is set). Lists
// are sorted first so that the encoding does not depend on the order in
// which work finished.
func (m *Manifest) Encode() ([]byte, error) {
	m.Integrity = zeroHash
	data, err := m.encode()
	if err != nil {
		return nil, err
	}
	i := bytes.Index(data, []byte(integrityKey+zeroHash))
	if i < 0 {
		panic("manifest: integrity field not found in the encoding")
	}
	sum := SHA256Hex(data)
	copy(data[i+len(integrityKey):], sum)
	m.Integrity = sum
	return data, nil
}

const (
	integrityKey = `"integrity": "`
	zeroHash     = "0000000000000000000000000000000000000000000000000000000000000000"
)

// checkIntegrity recomputes the integrity hash of manifest bytes.
func checkIntegrity(data []byte) error {
	i := bytes.Index(data, []byte(integrityKey))
	if i < 0 || len(data) < i+len(integrityKey)+64 {
		return fmt.Errorf("%s: no integrity field", ManifestName)
	}
	at := i + len(integrityKey)
	got := string(data[at : at+64])
	cp := append([]byte(nil), data...)
	copy(cp[at:], zeroHash)
	if want := SHA256Hex(cp); got != want {
		return fmt.Errorf("%s: integrity check failed: the manifest was modified or damaged", ManifestName)
	}
	return nil
}

func (m *Manifest) encode() ([]byte, error) {
	m.sort()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("manifest: encoding: %w", err)
	}
	return buf.Bytes(), nil
}

func (m *Manifest) sort() {
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
	sort.Slice(m.Tensors, func(i, j int) bool { return m.Tensors[i].Name < m.Tensors[j].Name })
	sort.Slice(m.Source.Files, func(i, j int) bool { return m.Source.Files[i].Name < m.Source.Files[j].Name })
	sort.Slice(m.TTQuant.Matrices, func(i, j int) bool { return m.TTQuant.Matrices[i].Tensor < m.TTQuant.Matrices[j].Tensor })
	sort.Slice(m.TTQuant.Layers, func(i, j int) bool { return m.TTQuant.Layers[i].Layer < m.TTQuant.Layers[j].Layer })
	sort.Strings(m.TTQuant.NonFinite)
}

// Identity returns the checkpoint's identity: the sha256 of the
// manifest's canonical encoding with the tool section emptied and the
// integrity field set to 64 zeros. It therefore covers everything the
// checkpoint holds and how it was made (every file's and tensor's hash,
// formats, shapes, the plan, the source, the calibration, the options and
// the statistics) but not which build of the program wrote it: the same
// checkpoint written by two builds of ttquant (a release and a development
// build, with or without version-control stamping) has one identity.
// Bytes that do not decode as a manifest are hashed as they are.
func Identity(manifestBytes []byte) string {
	m, err := DecodeManifest(manifestBytes)
	if err != nil {
		s := sha256.Sum256(manifestBytes)
		return hex.EncodeToString(s[:])
	}
	return m.identity()
}

// identity is Identity of a decoded manifest.
func (m *Manifest) identity() string {
	c := *m
	c.Tool = ToolInfo{}
	c.Integrity = zeroHash
	data, err := c.encode()
	if err != nil {
		panic("manifest: encoding a decoded manifest: " + err.Error())
	}
	return SHA256Hex(data)
}

// CacheKey is the short cache key derived from an identity: its first 16 hex
// digits.
func CacheKey(identity string) string {
	if len(identity) < 16 {
		return identity
	}
	return identity[:16]
}

// DecodeManifest parses and checks manifest bytes strictly: unknown fields
// are an error, as is a format_version other than FormatVersion.
func DecodeManifest(data []byte) (*Manifest, error) {
	var probe struct {
		FormatVersion *int   `json:"format_version"`
		Format        string `json:"format"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("%s: not JSON: %w", ManifestName, err)
	}
	if probe.FormatVersion == nil {
		return nil, fmt.Errorf("%s: no format_version", ManifestName)
	}
	if *probe.FormatVersion != FormatVersion {
		return nil, fmt.Errorf("%s: format_version %d, this build reads %d", ManifestName, *probe.FormatVersion, FormatVersion)
	}
	if probe.Format != FormatName {
		return nil, fmt.Errorf("%s: format %q, want %q", ManifestName, probe.Format, FormatName)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%s: %w", ManifestName, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: trailing data after the manifest", ManifestName)
	}
	return &m, nil
}
