package harness

import (
	"bytes"
	"crypto/sha256"
	"encoding/gob"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/shard"
)

// A split evaluation (Options.Shard) divides the windows among workers by
// their number of tokens (shard.Partition); each worker scores its windows
// and writes every scored position's quantities (eval.WindowScores) to a
// part file; the merge (Options.Assemble) replays all windows in order into
// one scorer, which gives the accumulator of a single run exactly: the sums
// are taken in the same order over the same values.

// ErrParts is wrapped by every refusal of a merge: a part missing,
// damaged, duplicated or of another evaluation.
var ErrParts = errors.New("cannot merge the split evaluation")

// SplitRule is a rule of the options of a split evaluation that a
// SplitError says was broken.
type SplitRule int

const (
	// SplitBadShard: the shard names no worker (index outside 0..count−1).
	SplitBadShard SplitRule = iota + 1
	// SplitNoParts: a worker needs the directory it writes its part to.
	SplitNoParts
	// SplitPartsAlone: a parts directory is for a worker only.
	SplitPartsAlone
	// SplitWorkerMerges: a worker does not also merge the parts.
	SplitWorkerMerges
)

// SplitNames are what the three options of a split evaluation are called
// in a SplitError's message: the fields of Options by default, a command's
// flags for its users (SplitError.Message).
type SplitNames struct {
	Shard, Parts, Assemble string
}

// SplitError is the refusal of a split evaluation's options: which rule
// (CheckSplit) they break. Its Message calls the options by the names a
// caller gives; Error by the fields of Options.
type SplitError = shard.RuleError[SplitRule, SplitNames]

// splitRules are the split evaluation's rules' messages.
var splitRules = &shard.Rules[SplitRule, SplitNames]{Pkg: "harness", Names: SplitNames{Shard: "Shard", Parts: "Parts", Assemble: "Assemble"}, Say: splitMessage}

// splitMessage says what breaking rule means for worker s.
func splitMessage(rule SplitRule, s shard.Spec, names SplitNames) string {
	switch rule {
	case SplitBadShard:
		return fmt.Sprintf("%s %d/%d names no worker", names.Shard, s.Index, s.Count)
	case SplitNoParts:
		return fmt.Sprintf("%s %s needs %s, the directory the workers write their scores to", names.Shard, s, names.Parts)
	case SplitPartsAlone:
		return fmt.Sprintf("%s is for the workers of a split evaluation (%s i/N)", names.Parts, names.Shard)
	case SplitWorkerMerges:
		return fmt.Sprintf("%s merges the workers' parts; give it without %s", names.Assemble, names.Shard)
	}
	return fmt.Sprintf("split evaluation rule %d broken", rule)
}

// CheckSplit checks the options of a split evaluation (Options.Shard,
// Parts and Assemble): a worker (a shard of several) writes its part to
// parts; the merge (assemble) is no worker. A *SplitError says which rule
// is broken.
func CheckSplit(s shard.Spec, parts, assemble string) error {
	var rule SplitRule
	switch {
	case s != (shard.Spec{}) && !s.Valid():
		rule = SplitBadShard
	case s.Count > 1 && parts == "":
		rule = SplitNoParts
	case s.Count <= 1 && parts != "":
		rule = SplitPartsAlone
	case s.Count > 1 && assemble != "":
		rule = SplitWorkerMerges
	default:
		return nil
	}
	return splitRules.Broken(rule, s)
}

// PartInfo says what a worker of a split evaluation wrote.
type PartInfo struct {
	Path            string
	Worker, Workers int
	Windows, Of     int
}

// part is a worker's file: the evaluation it belongs to (Key), which
// worker, and its windows' scores.
type part struct {
	Key    string
	Index  int
	Count  int
	Scores []eval.WindowScores
}

type splitRun struct {
	key     string
	windows []eval.Window
	scores  []eval.WindowScores
}

// splitKey is the sha256 of everything a table depends on besides the
// scores: the reference and candidates' identities, the data and its
// selection, the settings, and every window's tokens and scored positions.
func splitKey(ref eval.RunInfo, cands []eval.RunInfo, data DataInfo, settings Settings, windows []eval.Window) string {
	h := sha256.New()
	enc := json.NewEncoder(h)
	enc.Encode(ref)
	enc.Encode(cands)
	enc.Encode(data)
	enc.Encode(settings)
	for _, w := range windows {
		enc.Encode(struct {
			Corpus  string
			Record  int
			Start   int
			Tokens  []int32
			Targets []int32
			Score   []bool
		}{w.Corpus, w.Record, w.Start, w.Tokens, w.Targets, w.Score})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func partName(s shard.Spec) string {
	return s.FileName("eval", ".part")
}

// share returns the windows of worker s.
func (sp *splitRun) share(s shard.Spec) ([]int, error) {
	costs := make([]float64, len(sp.windows))
	for i := range sp.windows {
		costs[i] = float64(len(sp.windows[i].Tokens))
	}
	asg, err := shard.Partition(costs, s.Count)
	if err != nil {
		return nil, err
	}
	return append([]int{}, asg[s.Index]...), nil
}

// write writes the worker's part into dir.
func (sp *splitRun) write(dir string, s shard.Spec) (string, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(part{Key: sp.key, Index: s.Index, Count: s.Count, Scores: sp.scores}); err != nil {
		return "", err
	}
	path := filepath.Join(dir, partName(s))
	_, err := atomicfile.WriteFile(path, b.Bytes())
	return path, err
}

// merge reads every part in dir, checks that they are of this evaluation
// and cover every window once, and replays the windows in order into sc.
func (sp *splitRun) merge(dir string, sc *eval.Scorer) error {
	names, err := filepath.Glob(filepath.Join(dir, "eval-*-of-*.part"))
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("%w: %s holds no parts (eval-I-of-N.part)", ErrParts, dir)
	}
	sort.Strings(names)
	var parts []*part
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			return err
		}
		var p part
		if err := gob.NewDecoder(bytes.NewReader(data)).Decode(&p); err != nil {
			return fmt.Errorf("%w: %s: %v (truncated or damaged; run its worker again)", ErrParts, n, err)
		}
		if sp := (shard.Spec{Index: p.Index, Count: p.Count}); !sp.Valid() || partName(sp) != filepath.Base(n) {
			return fmt.Errorf("%w: %s names worker %d/%d", ErrParts, n, p.Index, p.Count)
		}
		if p.Key != sp.key {
			return fmt.Errorf("%w: %s is worker %d/%d of another evaluation (other models, checkpoints, data, settings or windows)", ErrParts, n, p.Index, p.Count)
		}
		parts = append(parts, &p)
	}
	count := parts[0].Count
	have := map[int]bool{}
	for _, p := range parts {
		if p.Count != count {
			return fmt.Errorf("%w: %s holds workers of a split into %d and into %d", ErrParts, dir, count, p.Count)
		}
		have[p.Index] = true
	}
	var missing []string
	for i := 0; i < count; i++ {
		if !have[i] {
			missing = append(missing, fmt.Sprintf("%d/%d", i, count))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: no part of worker %s in %s", ErrParts, strings.Join(missing, ", "), dir)
	}
	byWindow := make([]*eval.WindowScores, len(sp.windows))
	from := make([]int, len(sp.windows))
	for _, p := range parts {
		for k := range p.Scores {
			ws := &p.Scores[k]
			if ws.Window < 0 || ws.Window >= len(sp.windows) {
				return fmt.Errorf("%w: worker %d/%d scored window %d of %d", ErrParts, p.Index, count, ws.Window, len(sp.windows))
			}
			if byWindow[ws.Window] != nil {
				return fmt.Errorf("%w: window %d is in the parts of workers %d/%d and %d/%d", ErrParts, ws.Window, from[ws.Window], count, p.Index, count)
			}
			byWindow[ws.Window], from[ws.Window] = ws, p.Index
		}
	}
	for wi, ws := range byWindow {
		if ws == nil {
			w := sp.windows[wi]
			return fmt.Errorf("%w: window %d (%s record %d at %d) is in no part", ErrParts, wi, w.Corpus, w.Record, w.Start)
		}
	}
	for _, ws := range byWindow {
		if err := sc.Replay(*ws); err != nil {
			return err
		}
	}
	return nil
}
