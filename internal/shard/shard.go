// Package shard splits a long command's work into units that independent
// processes run, as a cluster scheduler starts them: a Slurm job array (each
// task sees SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT) or a Kubernetes
// Indexed Job (each pod sees JOB_COMPLETION_INDEX; the count comes from the
// job's completions, passed by flag or TTQUANT_SHARD_COUNT). A Spec says
// which worker this process is; Partition assigns units to workers from their
// estimated costs, the same way in every process, so the workers agree on who
// does what without talking to each other.
//
// The package imports only the module's loop over independent tasks
// (internal/par) and its file locks (internal/fslock).
package shard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/internal/par"
)

// MaxCount bounds the number of workers a Spec may name.
const MaxCount = 1 << 16

// Spec is one worker's place among Count workers: Index in 0..Count-1. The
// zero value is invalid (Count 0), so a Spec that was never set cannot be
// mistaken for "the whole job".
type Spec struct {
	Index, Count int
}

// Whole is the Spec of a run that is not split: worker 0 of 1.
var Whole = Spec{Index: 0, Count: 1}

// Valid reports whether s names a worker.
func (s Spec) Valid() bool {
	return s.Count >= 1 && s.Count <= MaxCount && s.Index >= 0 && s.Index < s.Count
}

// IsWhole reports whether s is the only worker.
func (s Spec) IsWhole() bool { return s.Valid() && s.Count == 1 }

// String spells s as the --shard flag takes it: "i/N".
func (s Spec) String() string { return strconv.Itoa(s.Index) + "/" + strconv.Itoa(s.Count) }

// FileName is the name of worker s's file of a split job:
// PREFIX-IIIII-of-NNNNN followed by ext ("" for a directory or a stem).
// Every split job names its workers' records, locks and parts so.
func (s Spec) FileName(prefix, ext string) string {
	return fmt.Sprintf("%s-%05d-of-%05d%s", prefix, s.Index, s.Count, ext)
}

// Rules are the messages of the rules of a split run's options (the
// worker's shard, the directory the workers share, and the like), rules
// R and options' names N of the package that checks them: Pkg prefixes
// Error, Names are the options' names in that package, Say says what
// breaking a rule means, calling the options by names.
type Rules[R ~int, N any] struct {
	Pkg   string
	Names N
	Say   func(rule R, s Spec, names N) string
}

// Broken is the refusal of worker s's options for breaking rule.
func (r *Rules[R, N]) Broken(rule R, s Spec) *RuleError[R, N] {
	return &RuleError[R, N]{Rule: rule, Shard: s, rules: r}
}

// RuleError is the refusal of a split run's options: which rule they
// break, for which worker. Error calls the options by their names in the
// package, Message by the names a caller gives (a command's flags).
type RuleError[R ~int, N any] struct {
	Rule  R
	Shard Spec
	rules *Rules[R, N]
}

func (e *RuleError[R, N]) Error() string { return e.rules.Pkg + ": " + e.Message(e.rules.Names) }

// Message says what is wrong, calling the options by names.
func (e *RuleError[R, N]) Message(names N) string { return e.rules.Say(e.Rule, e.Shard, names) }

// ErrSpec is the kind of every error Parse returns.
var ErrSpec = errors.New("shard: invalid shard")

// SpecError is a --shard value or scheduler environment that names no
// worker: what was given (the flag value or the variables read) and why.
type SpecError struct {
	Given, Problem string
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("shard: %s: %s", e.Given, e.Problem)
}

// Is makes errors.Is(err, ErrSpec) hold.
func (e *SpecError) Is(target error) bool { return target == ErrSpec }

// Environment variables read by "auto".
const (
	EnvSlurmID    = "SLURM_ARRAY_TASK_ID"
	EnvSlurmCount = "SLURM_ARRAY_TASK_COUNT"
	EnvSlurmMin   = "SLURM_ARRAY_TASK_MIN"
	EnvSlurmStep  = "SLURM_ARRAY_TASK_STEP"
	EnvK8sIndex   = "JOB_COMPLETION_INDEX"
	EnvCount      = "TTQUANT_SHARD_COUNT"
)

// Parse reads a --shard value: "i/N" (worker i of N, 0 ≤ i < N), or
// "auto", which takes the worker from the scheduler's environment (getenv,
// usually os.Getenv):
//
//   - Slurm job array: SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT; the
//     index counts from SLURM_ARRAY_TASK_MIN in steps of
//     SLURM_ARRAY_TASK_STEP, so --array=1-8 and --array=0-14:2 both give
//     workers 0..7. An array with gaps (--array=0,3,7) is refused: its task
//     ids are not a range, and a missing worker would go unnoticed until
//     assembly.
//   - Kubernetes Indexed Job: JOB_COMPLETION_INDEX, with the count from
//     count (a flag; 0 when not given) or else TTQUANT_SHARD_COUNT.
//
// "auto" outside a scheduler (none of these variables set) is an error, not
// the whole job: a job script that lost its array options must not make
// every task do all the work.
func Parse(value string, count int, getenv func(string) string) (Spec, error) {
	if value == "auto" {
		return fromEnv(count, getenv)
	}
	i, n, ok := strings.Cut(value, "/")
	if !ok {
		return Spec{}, &SpecError{Given: strconv.Quote(value), Problem: `want i/N (worker i of N, counting from 0) or "auto"`}
	}
	idx, err1 := strconv.Atoi(i)
	cnt, err2 := strconv.Atoi(n)
	if err1 != nil || err2 != nil {
		return Spec{}, &SpecError{Given: strconv.Quote(value), Problem: "i and N must be whole numbers"}
	}
	s := Spec{Index: idx, Count: cnt}
	if err := s.check(strconv.Quote(value)); err != nil {
		return Spec{}, err
	}
	return s, nil
}

func (s Spec) check(given string) error {
	switch {
	case s.Count < 1 || s.Count > MaxCount:
		return &SpecError{Given: given, Problem: fmt.Sprintf("the worker count %d is outside 1..%d", s.Count, MaxCount)}
	case s.Index < 0 || s.Index >= s.Count:
		return &SpecError{Given: given, Problem: fmt.Sprintf("worker %d is outside 0..%d", s.Index, s.Count-1)}
	}
	return nil
}

func fromEnv(count int, getenv func(string) string) (Spec, error) {
	num := func(name string) (int, bool, error) {
		v := getenv(name)
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, true, &SpecError{Given: name + "=" + strconv.Quote(v), Problem: "not a whole number"}
		}
		return n, true, nil
	}
	if id, ok, err := num(EnvSlurmID); err != nil {
		return Spec{}, err
	} else if ok {
		n, okN, err := num(EnvSlurmCount)
		if err != nil {
			return Spec{}, err
		}
		if !okN {
			return Spec{}, &SpecError{Given: EnvSlurmID + " without " + EnvSlurmCount, Problem: "Slurm sets both for a job array; is this an array task?"}
		}
		lo, okMin, err := num(EnvSlurmMin)
		if err != nil {
			return Spec{}, err
		}
		step, okStep, err := num(EnvSlurmStep)
		if err != nil {
			return Spec{}, err
		}
		if !okMin {
			lo = 0
		}
		if !okStep || step == 0 {
			step = 1
		}
		given := fmt.Sprintf("%s=%d %s=%d %s=%d %s=%d", EnvSlurmID, id, EnvSlurmCount, n, EnvSlurmMin, lo, EnvSlurmStep, step)
		if step < 0 || id < lo || (id-lo)%step != 0 {
			return Spec{}, &SpecError{Given: given, Problem: "the task id is not on the array's range; submit the array as a range (--array=0-N or A-B:S)"}
		}
		s := Spec{Index: (id - lo) / step, Count: n}
		if err := s.check(given); err != nil {
			if s.Index >= s.Count {
				err.(*SpecError).Problem += "; the array has gaps (--array=0,3,7): submit it as a range"
			}
			return Spec{}, err
		}
		return s, nil
	}
	if idx, ok, err := num(EnvK8sIndex); err != nil {
		return Spec{}, err
	} else if ok {
		given := EnvK8sIndex + "=" + strconv.Itoa(idx)
		if count == 0 {
			n, okN, err := num(EnvCount)
			if err != nil {
				return Spec{}, err
			}
			if !okN {
				return Spec{}, &SpecError{Given: given, Problem: "an Indexed Job does not tell its pods the completion count: pass --shard-count or set " + EnvCount}
			}
			count = n
		}
		s := Spec{Index: idx, Count: count}
		if err := s.check(given + " count=" + strconv.Itoa(count)); err != nil {
			return Spec{}, err
		}
		return s, nil
	}
	return Spec{}, &SpecError{Given: `"auto"`, Problem: "no scheduler environment: none of " + EnvSlurmID + ", " + EnvK8sIndex + " is set (give i/N outside a job array)"}
}

// Partition assigns units with the given estimated costs (any positive unit,
// for example seconds of kernel time) to n workers and returns each
// worker's unit indices in increasing order. It is deterministic — the same
// costs give the same assignment in every process — and balanced by the
// longest-processing-time rule: the units in decreasing cost (ties by
// index) each go to the worker with the least cost so far (ties by the
// lower worker). Its largest load is at most 4/3 of the optimum, and within
// the largest single unit of the mean load. A negative or non-finite cost
// is an error (an estimate that went wrong must not silently unbalance a
// cluster job).
func Partition(costs []float64, n int) ([][]int, error) {
	if n < 1 || n > MaxCount {
		return nil, fmt.Errorf("shard: %d workers: outside 1..%d", n, MaxCount)
	}
	order := make([]int, len(costs))
	for i, c := range costs {
		if !(c >= 0) || c > 1e300 {
			return nil, fmt.Errorf("shard: unit %d has estimated cost %v; costs must be finite and not negative", i, c)
		}
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(costs[b], costs[a]) })
	load := make([]float64, n)
	out := make([][]int, n)
	for _, u := range order {
		w := 0
		for k := 1; k < n; k++ {
			if load[k] < load[w] {
				w = k
			}
		}
		load[w] += costs[u]
		out[w] = append(out[w], u)
	}
	for _, units := range out {
		slices.Sort(units)
	}
	return out, nil
}

// Loads returns each worker's summed cost under an assignment from
// Partition.
func Loads(costs []float64, assignment [][]int) []float64 {
	loads := make([]float64, len(assignment))
	for w, units := range assignment {
		for _, u := range units {
			loads[w] += costs[u]
		}
	}
	return loads
}

// ErrAssemble is wrapped by every refusal to assemble a split run: a worker
// missing or unfinished, a unit missing, duplicated, damaged or of another
// build. Every command's assembly uses it, so that callers test one error.
var ErrAssemble = errors.New("cannot assemble")

// ErrUnitDamaged is wrapped, with ErrAssemble, by a refusal to assemble a
// file whose size or sha256 is not the one its worker recorded (a
// truncated or overwritten file).
var ErrUnitDamaged = errors.New("a file differs from its record")

// Planned is one unit of a split run as the workers' records list it: its
// name, the worker the partition gives it to, and the outputs it produces
// (files, parts), by name.
type Planned struct {
	Name    string
	Worker  int
	Outputs []string
}

// CheckClaims checks what the n workers of a split run say they produced
// against the units planned: every output a worker claims (claims(w), in
// any order) must be an output of a unit the partition gives to that
// worker, and claimed once; then every planned output must be claimed.
// noun names the outputs in the errors ("file", "tensor", "part"). The
// first violation is returned, naming the unit, the output and the
// workers; on success the result maps every output to its unit.
func CheckClaims(units []Planned, n int, claims func(worker int) []string, noun string) (map[string]Planned, error) {
	unitOf := map[string]Planned{}
	for _, u := range units {
		for _, o := range u.Outputs {
			unitOf[o] = u
		}
	}
	from := map[string]int{}
	for w := 0; w < n; w++ {
		for _, o := range claims(w) {
			u, ok := unitOf[o]
			if !ok {
				return nil, fmt.Errorf("worker %d/%d produced %s, which is no %s of this build (a unit of another plan?)", w, n, o, noun)
			}
			if prev, dup := from[o]; dup {
				return nil, fmt.Errorf("unit %s (%s %s) is produced by worker %d/%d and by worker %d/%d", u.Name, noun, o, prev, n, w, n)
			}
			if u.Worker != w {
				return nil, fmt.Errorf("unit %s (%s %s) is in worker %d/%d's record, but the partition gives it to worker %d/%d", u.Name, noun, o, w, n, u.Worker, n)
			}
			from[o] = w
		}
	}
	for _, u := range units {
		for _, o := range u.Outputs {
			if _, ok := from[o]; !ok {
				return nil, fmt.Errorf("unit %s (%s %s, worker %d/%d) is missing", u.Name, noun, o, u.Worker, n)
			}
		}
	}
	return unitOf, nil
}

// Worker is what CheckWorkers needs of one worker's record of a split run:
// which worker of how many it is, and whether it has finished.
type Worker struct {
	Index, Count int
	Done         bool
}

// CheckWorkers checks the records of a split run before its assembly
// (where names the place that holds them, for the errors): all of one
// worker count n; then it holds every worker's lock (lock(s) takes worker
// s's, failing while that worker runs; release frees them all, also on
// error) and requires a finished record of every worker 0 … n−1. Each
// refusal wraps ErrAssemble and names the worker.
func CheckWorkers(recs []Worker, where string, lock func(Spec) (unlock func(), err error)) (n int, release func(), err error) {
	var held []func()
	release = func() {
		for _, u := range held {
			u()
		}
	}
	if len(recs) == 0 {
		return 0, release, fmt.Errorf("%w: %s holds no records of a split run (run the workers with --shard first)", ErrAssemble, where)
	}
	n = recs[0].Count
	for _, r := range recs {
		if r.Count != n {
			return 0, release, fmt.Errorf("%w: %s holds workers of a split into %d (worker %d/%d) and into %d (worker %d/%d)", ErrAssemble, where, n, recs[0].Index, n, r.Count, r.Index, r.Count)
		}
	}
	// Every worker's lock: a worker still running, or started now, would
	// change the files under the check.
	for i := 0; i < n; i++ {
		u, err := lock(Spec{Index: i, Count: n})
		if err != nil {
			return 0, release, fmt.Errorf("%w: worker %d/%d: %w", ErrAssemble, i, n, err)
		}
		held = append(held, u)
	}
	done := make([]int, n) // 0: no record, 1: unfinished, 2: finished
	for _, r := range recs {
		if r.Index >= 0 && r.Index < n {
			done[r.Index] = max(done[r.Index], 1)
			if r.Done {
				done[r.Index] = 2
			}
		}
	}
	for i, d := range done {
		switch d {
		case 0:
			return 0, release, fmt.Errorf("%w: worker %d/%d has not run (no record in %s)", ErrAssemble, i, n, where)
		case 1:
			return 0, release, fmt.Errorf("%w: worker %d/%d has not finished its units (run it again: it resumes)", ErrAssemble, i, n)
		}
	}
	return n, release, nil
}

// FileLocks is the lock argument of CheckWorkers for workers whose locks
// are files in dir, worker s's named name(s) (fslock.AcquireNamed).
func FileLocks(dir string, name func(Spec) string) func(Spec) (func(), error) {
	return func(s Spec) (func(), error) {
		l, err := fslock.AcquireNamed(dir, name(s))
		if err != nil {
			return nil, err
		}
		return func() { l.Release() }, nil
	}
}

// Expected is a file a worker's record lists: what it is (for the errors,
// e.g. "unit layer 3 expert group 2: file F"), its path, and the size and
// sha256 recorded.
type Expected struct {
	What, Path string
	Size       int64
	SHA256     string
}

// Verify hashes every file (hash, at most workers at once) and refuses the
// first one, in order, that cannot be read or whose size or sha256 is not
// the one recorded (Expected.Check).
func Verify(ctx context.Context, files []Expected, workers int, hash func(ctx context.Context, path string) (int64, string, error)) error {
	return par.For(ctx, len(files), max(1, workers), func(k int) error {
		n, sum, err := hash(ctx, files[k].Path)
		return files[k].Check(n, sum, err)
	})
}

// Check compares what was found of f, its size n and sha256 sum or the
// error of reading it, with its record: a file that differs wraps
// ErrUnitDamaged, every refusal ErrAssemble. An empty sum is not compared:
// a size checked before the bytes are read.
func (f Expected) Check(n int64, sum string, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("%w: %s: %w", ErrAssemble, f.What, err)
	case n != f.Size:
		return fmt.Errorf("%w: %s is %d bytes, its record says %d (truncated or overwritten): %w", ErrAssemble, f.What, n, f.Size, ErrUnitDamaged)
	case sum != "" && sum != f.SHA256:
		return fmt.Errorf("%w: %s has sha256 %.16s…, its record %.16s…: %w", ErrAssemble, f.What, sum, f.SHA256, ErrUnitDamaged)
	}
	return nil
}
