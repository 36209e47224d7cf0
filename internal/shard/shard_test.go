package shard

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestParseExplicit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Spec
	}{
		{"0/1", Whole}, {"2/3", Spec{2, 3}}, {"63/64", Spec{63, 64}},
	} {
		got, err := Parse(tc.in, 0, env())
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if got.String() != tc.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
	for _, bad := range []string{"", "3", "3/3", "-1/3", "1/0", "a/b", "1/2/3", "0/70000", " 1/2"} {
		if s, err := Parse(bad, 0, env()); err == nil || !errors.Is(err, ErrSpec) {
			t.Errorf("Parse(%q) = %v, %v; want an ErrSpec error", bad, s, err)
		}
	}
	if (Spec{}).Valid() {
		t.Error("the zero Spec must be invalid")
	}
}

func TestParseAuto(t *testing.T) {
	for name, tc := range map[string]struct {
		count int
		env   func(string) string
		want  Spec
	}{
		"slurm 0-2":       {0, env(EnvSlurmID, "1", EnvSlurmCount, "3", EnvSlurmMin, "0"), Spec{1, 3}},
		"slurm 1-8":       {0, env(EnvSlurmID, "8", EnvSlurmCount, "8", EnvSlurmMin, "1", EnvSlurmStep, "1"), Spec{7, 8}},
		"slurm 0-14:2":    {0, env(EnvSlurmID, "6", EnvSlurmCount, "8", EnvSlurmMin, "0", EnvSlurmStep, "2"), Spec{3, 8}},
		"slurm no min":    {0, env(EnvSlurmID, "2", EnvSlurmCount, "3"), Spec{2, 3}},
		"k8s with flag":   {4, env(EnvK8sIndex, "3"), Spec{3, 4}},
		"k8s with env":    {0, env(EnvK8sIndex, "0", EnvCount, "7"), Spec{0, 7}},
		"slurm over k8s?": {0, env(EnvSlurmID, "0", EnvSlurmCount, "2", EnvK8sIndex, "5", EnvCount, "9"), Spec{0, 2}},
	} {
		got, err := Parse("auto", tc.count, tc.env)
		if err != nil || got != tc.want {
			t.Errorf("%s: Parse(auto) = %v, %v; want %v", name, got, err, tc.want)
		}
	}
	for name, tc := range map[string]struct {
		count int
		env   func(string) string
		says  string
	}{
		"nothing":          {0, env(), "no scheduler environment"},
		"slurm no count":   {0, env(EnvSlurmID, "1"), EnvSlurmCount},
		"slurm gaps":       {0, env(EnvSlurmID, "7", EnvSlurmCount, "3", EnvSlurmMin, "0"), "gaps"},
		"slurm off step":   {0, env(EnvSlurmID, "3", EnvSlurmCount, "8", EnvSlurmMin, "0", EnvSlurmStep, "2"), "range"},
		"slurm below min":  {0, env(EnvSlurmID, "0", EnvSlurmCount, "8", EnvSlurmMin, "1"), "range"},
		"slurm not number": {0, env(EnvSlurmID, "x", EnvSlurmCount, "3"), "whole number"},
		"k8s no count":     {0, env(EnvK8sIndex, "1"), "--shard-count"},
		"k8s past count":   {2, env(EnvK8sIndex, "2"), "outside 0..1"},
	} {
		s, err := Parse("auto", tc.count, tc.env)
		if err == nil || !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: Parse(auto) = %v, %v; want an ErrSpec error saying %q", name, s, err, tc.says)
		}
	}
}

func TestPartitionDeterministicAndComplete(t *testing.T) {
	costs := make([]float64, 500)
	for i := range costs {
		costs[i] = float64((i*7919)%97 + 1)
	}
	for _, n := range []int{1, 2, 3, 7, 64, 600} {
		a, err := Partition(costs, n)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Partition(slices.Clone(costs), n)
		if len(a) != n {
			t.Fatalf("n=%d: %d workers", n, len(a))
		}
		seen := make([]int, len(costs))
		for w := range a {
			if !slices.Equal(a[w], b[w]) {
				t.Fatalf("n=%d: worker %d differs between two calls", n, w)
			}
			if !slices.IsSorted(a[w]) {
				t.Fatalf("n=%d: worker %d's units are not in order", n, w)
			}
			for _, u := range a[w] {
				seen[u]++
			}
		}
		for u, k := range seen {
			if k != 1 {
				t.Fatalf("n=%d: unit %d assigned %d times", n, u, k)
			}
		}
		// The list-scheduling bound: max load ≤ mean + largest unit.
		loads := Loads(costs, a)
		var sum float64
		for _, c := range costs {
			sum += c
		}
		if mx := slices.Max(loads); mx > sum/float64(n)+slices.Max(costs) {
			t.Errorf("n=%d: largest load %v above mean %v + largest unit %v", n, mx, sum/float64(n), slices.Max(costs))
		}
	}
}

// TestPartitionOptimalSmall checks the 4/3 bound against brute force.
func TestPartitionOptimalSmall(t *testing.T) {
	costs := []float64{7, 5, 5, 4, 4, 3, 3, 3, 2, 1}
	for _, n := range []int{2, 3, 4} {
		a, err := Partition(costs, n)
		if err != nil {
			t.Fatal(err)
		}
		got := slices.Max(Loads(costs, a))
		best := math.Inf(1)
		assign := make([]int, len(costs))
		var rec func(i int)
		rec = func(i int) {
			if i == len(costs) {
				l := make([]float64, n)
				for u, w := range assign {
					l[w] += costs[u]
				}
				best = min(best, slices.Max(l))
				return
			}
			for w := 0; w < n; w++ {
				assign[i] = w
				rec(i + 1)
			}
		}
		rec(0)
		if got > best*4/3 {
			t.Errorf("n=%d: largest load %v, optimum %v: above 4/3 of it", n, got, best)
		}
	}
}

func TestPartitionRefusesBadCosts(t *testing.T) {
	for _, c := range []float64{-1, math.NaN(), math.Inf(1)} {
		if _, err := Partition([]float64{1, c}, 2); err == nil {
			t.Errorf("cost %v accepted", c)
		}
	}
	if _, err := Partition([]float64{1}, 0); err == nil {
		t.Error("0 workers accepted")
	}
}

// TestCheckClaims: every planned output claimed once by its unit's worker
// passes; an output of no unit, one claimed twice, one claimed by another
// worker than its unit's, and one claimed by nobody are each refused,
// naming the unit, the output and the workers.
func TestCheckClaims(t *testing.T) {
	units := []Planned{{Name: "a", Worker: 0, Outputs: []string{"a1", "a2"}}, {Name: "b", Worker: 1, Outputs: []string{"b1"}}}
	claims := func(c ...[]string) func(int) []string { return func(w int) []string { return c[w] } }
	if got, err := CheckClaims(units, 2, claims([]string{"a2", "a1"}, []string{"b1"}), "file"); err != nil || got["b1"].Name != "b" || got["a1"].Name != "a" {
		t.Fatalf("a complete split: %v, %v", got, err)
	}
	for _, c := range []struct {
		name   string
		claims func(int) []string
		want   string
	}{
		{"foreign", claims([]string{"a1", "a2", "x"}, []string{"b1"}), "worker 0/2 produced x, which is no file of this build (a unit of another plan?)"},
		{"twice", claims([]string{"a1", "a2"}, []string{"b1", "a1"}), "unit a (file a1) is produced by worker 0/2 and by worker 1/2"},
		{"wrong worker", claims([]string{"a1", "a2", "b1"}, nil), "unit b (file b1) is in worker 0/2's record, but the partition gives it to worker 1/2"},
		{"missing", claims([]string{"a1"}, []string{"b1"}), "unit a (file a2, worker 0/2) is missing"},
	} {
		if _, err := CheckClaims(units, 2, c.claims, "file"); err == nil || err.Error() != c.want {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestCheckWorkers: finished records of every worker pass with every lock
// taken and released; no records, mixed counts, a lock held elsewhere, a
// missing and an unfinished worker are refused as ErrAssemble, naming the
// worker, and every lock taken is released.
func TestCheckWorkers(t *testing.T) {
	held := map[int]bool{}
	busy := -1
	lock := func(s Spec) (func(), error) {
		if s.Index == busy {
			return nil, errors.New("held by process 42")
		}
		held[s.Index] = true
		return func() { delete(held, s.Index) }, nil
	}
	all := []Worker{{0, 3, true}, {1, 3, true}, {2, 3, true}}
	n, release, err := CheckWorkers(all, "dir", lock)
	if err != nil || n != 3 || len(held) != 3 {
		t.Fatalf("three finished workers: n %d, %v, %d locks held", n, err, len(held))
	}
	release()
	if len(held) != 0 {
		t.Fatalf("%d locks left after release", len(held))
	}
	for _, c := range []struct {
		name string
		recs []Worker
		busy int
		want string
	}{
		{"none", nil, -1, "dir holds no records"},
		{"mixed counts", []Worker{{0, 3, true}, {1, 4, true}}, -1, "a split into 3 (worker 0/3) and into 4 (worker 1/4)"},
		{"running", all, 1, "worker 1/3: held by process 42"},
		{"missing", []Worker{{0, 3, true}, {2, 3, true}}, -1, "worker 1/3 has not run (no record in dir)"},
		{"unfinished", []Worker{{0, 3, true}, {1, 3, false}, {2, 3, true}}, -1, "worker 1/3 has not finished"},
	} {
		busy = c.busy
		_, release, err := CheckWorkers(c.recs, "dir", lock)
		release()
		if !errors.Is(err, ErrAssemble) || !strings.Contains(err.Error(), c.want) || len(held) != 0 {
			t.Errorf("%s: %v (%d locks left), want ErrAssemble saying %q", c.name, err, len(held), c.want)
		}
	}
}

// TestVerify: files of the recorded size and sha256 pass; an unreadable
// file, one of another size and one of another sha256 are refused, the
// first in order, the two that differ as ErrUnitDamaged.
func TestVerify(t *testing.T) {
	hashes := map[string][2]any{"a": {int64(3), "aaa"}, "b": {int64(4), "bbb"}}
	hash := func(_ context.Context, p string) (int64, string, error) {
		h, ok := hashes[p]
		if !ok {
			return 0, "", errors.New("no such file")
		}
		return h[0].(int64), h[1].(string), nil
	}
	ok := []Expected{{"unit a: file a", "a", 3, "aaa"}, {"unit b: file b", "b", 4, "bbb"}}
	if err := Verify(context.Background(), ok, 2, hash); err != nil {
		t.Fatalf("matching files: %v", err)
	}
	for _, c := range []struct {
		name    string
		files   []Expected
		want    string
		damaged bool
	}{
		{"missing", []Expected{ok[0], {"unit c: file c", "c", 1, "c"}}, "unit c: file c: no such file", false},
		{"size", []Expected{ok[0], {"unit b: file b", "b", 10, "bbb"}}, "unit b: file b is 4 bytes, its record says 10 (truncated or overwritten)", true},
		{"hash", []Expected{{"unit a: file a", "a", 3, "abc"}, {"unit b: file b", "b", 10, "bbb"}}, "unit a: file a has sha256 aaa", true},
	} {
		err := Verify(context.Background(), c.files, 1, hash)
		if !errors.Is(err, ErrAssemble) || errors.Is(err, ErrUnitDamaged) != c.damaged || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrAssemble saying %q (damaged %v)", c.name, err, c.want, c.damaged)
		}
	}
}

func TestSpecFileName(t *testing.T) {
	if got := (Spec{Index: 3, Count: 12}).FileName("shard", ".json"); got != "shard-00003-of-00012.json" {
		t.Errorf("FileName: %q", got)
	}
	if got := (Spec{Index: 0, Count: 1}).FileName("changes", ""); got != "changes-00000-of-00001" {
		t.Errorf("FileName: %q", got)
	}
}
