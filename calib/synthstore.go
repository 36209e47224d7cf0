package calib

import (
	"fmt"
	"github.com/ttquant/ttquant/internal/model"
	"hash/fnv"
)

// SynthStoreOptions configures SynthesizeStore.
type SynthStoreOptions struct {
	Sequences int    // default 16
	SeqLen    int    // tokens per sequence; default 256
	Seed      uint64 // default 0
	// Model and Revision are recorded in the provenance; Model defaults
	// to "synthetic".
	Model, Revision string
	Store           StoreOptions
}

// SynthesizeStore writes a deterministic synthetic calibration store for a
// model of configuration cfg into dir: for every layer, MTP layers
// included (numbered from cfg.Layers, see model.Config.NumLayers), the MoE
// input (SiteMoE) and the attention input (SiteAttn), both cfg.MoE().Hidden
// wide, and, when the config gives the widths and layer types, the input of
// self_attn.o_proj (full-attention layers, MTP layers included) or
// linear_attn.out_proj (linear-attention layers). Every site of every layer has its own
// generator (see Synth), seeded from opt.Seed, the layer and the site name.
// Token ids are pseudo-random in [0, vocab) and hashed into the provenance
// like real ones. The provenance records the store as synthetic.
func SynthesizeStore(dir string, cfg *model.Config, opt SynthStoreOptions) (*Store, error) {
	if opt.Sequences == 0 {
		opt.Sequences = 16
	}
	if opt.SeqLen == 0 {
		opt.SeqLen = 256
	}
	if opt.Sequences < 0 || opt.SeqLen < 0 {
		return nil, fmt.Errorf("calib: synthetic store: %d sequences of %d tokens", opt.Sequences, opt.SeqLen)
	}
	if opt.Model == "" {
		opt.Model = "synthetic"
	}
	vocab := cfg.Vocab
	if vocab <= 0 {
		vocab = 32000
	}
	lens := make([]int, opt.Sequences)
	ids := make([][]int32, opt.Sequences)
	rng := splitmix{State: opt.Seed ^ 0x5eed}
	for i := range lens {
		lens[i] = opt.SeqLen
		ids[i] = make([]int32, opt.SeqLen)
		for j := range ids[i] {
			ids[i][j] = int32(rng.Next() % uint64(vocab))
		}
	}
	tokens := int64(opt.Sequences) * int64(opt.SeqLen)
	prov := Provenance{Model: opt.Model, Revision: opt.Revision, Sequences: opt.Sequences, Tokens: tokens, Synthetic: true}
	w, err := CreateStore(dir, prov, lens, ids, opt.Store)
	if err != nil {
		return nil, err
	}
	const chunk = 1024
	for layer := 0; layer < cfg.NumLayers(); layer++ {
		type site struct {
			name string
			cols int
		}
		sites := []site{{SiteMoE, cfg.Hidden}, {SiteAttn, cfg.Hidden}}
		if cfg.Kind(layer) == model.FullAttention {
			sites = append(sites, site{SiteOProj, cfg.AttnInner()})
		} else {
			sites = append(sites, site{SiteOutProj, cfg.ValueDim()})
		}
		for _, s := range sites {
			h := fnv.New64a()
			fmt.Fprintf(h, "%d/%d/%s", opt.Seed, layer, s.name)
			gen, err := NewSynth(SynthConfig{Hidden: s.cols, Seed: h.Sum64(), SeqLen: opt.SeqLen})
			if err != nil {
				return nil, err
			}
			sw, err := w.BeginSite(layer, s.name, s.cols)
			if err != nil {
				return nil, err
			}
			buf := make([]float32, int(min(chunk, tokens))*s.cols)
			for t := int64(0); t < tokens; t += chunk {
				n := int(min(chunk, tokens-t))
				gen.Rows(buf, int(t), n)
				if err := sw.Write(buf[:n*s.cols]); err != nil {
					return nil, err
				}
			}
			if err := sw.Close(); err != nil {
				return nil, err
			}
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return OpenStore(dir)
}

// LoadActivations reads a site and splits it by sequence: the rows of the
// last heldOutSeqs sequences are returned as held-out activations, the
// others as calibration activations. The split follows the site's
// alignment (Store.RowOffsets), so an MTP site, which has no row for a
// sequence's last token, splits at the same sequences as the others.
func (s *Store) LoadActivations(layer int, site string, heldOutSeqs int) (calib, heldOut Activations, err error) {
	si, ok := s.Site(layer, site)
	if !ok {
		return calib, heldOut, fmt.Errorf("calib: store %s has no site %q for layer %d", s.dir, site, layer)
	}
	nseq := len(s.offs) - 1
	if heldOutSeqs < 0 || heldOutSeqs >= nseq {
		return calib, heldOut, fmt.Errorf("calib: store %s: cannot hold out %d of %d sequences", s.dir, heldOutSeqs, nseq)
	}
	cut := s.RowOffsets(si)[nseq-heldOutSeqs]
	x, err := s.ReadRows(layer, site, 0, si.Tokens)
	if err != nil {
		return calib, heldOut, err
	}
	c := int64(si.Cols)
	calib = Activations{X: x[: cut*c : cut*c], Tokens: int(cut)}
	heldOut = Activations{X: x[cut*c:], Tokens: int(si.Tokens - cut)}
	return calib, heldOut, nil
}
