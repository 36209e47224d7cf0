package selection

import (
	"errors"
	"math"
	"testing"

	"math/rand/v2"
)

// brute returns the least loss of any choice with cost ≤ budget (+Inf
// when none fits).
func brute(groups [][]Item, budget float64) float64 {
	best := math.Inf(1)
	var rec func(u int, cost, loss float64)
	rec = func(u int, cost, loss float64) {
		if cost > budget+1e-9 {
			return
		}
		if u == len(groups) {
			best = min(best, loss)
			return
		}
		for _, it := range groups[u] {
			rec(u+1, cost+it.Cost, loss+it.Loss)
		}
	}
	rec(0, 0, 0)
	return best
}

func randomGroups(r *rand.Rand, units int, integer bool) [][]Item {
	groups := make([][]Item, units)
	for u := range groups {
		k := 1 + int(r.Uint64()%4)
		for range k {
			var c float64
			if integer {
				c = float64(64 * (1 + r.Uint64()%40))
			} else {
				c = 1 + float64(r.Uint64()%1000000)/1000
			}
			groups[u] = append(groups[u], Item{Cost: c, Loss: float64(r.Uint64()%100000) / 100})
		}
	}
	return groups
}

func sums(groups [][]Item) (lo, hi float64) {
	for _, g := range groups {
		a, b := math.Inf(1), 0.0
		for _, it := range g {
			a, b = min(a, it.Cost), max(b, it.Cost)
		}
		lo, hi = lo+a, hi+b
	}
	return lo, hi
}

// TestSolveExactAgainstBruteForce: with costs that are multiples of the
// unit the program is exact: the same least loss as trying every choice.
func TestSolveExactAgainstBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 0))
	for trial := range 300 {
		groups := randomGroups(r, 1+trial%7, true)
		lo, hi := sums(groups)
		budget := lo + (hi-lo)*float64(r.Uint64()%1001)/1000
		s, err := Solve(groups, budget, 64)
		if err != nil {
			t.Fatal(err)
		}
		if !s.Exact || s.Bound != 0 {
			t.Fatalf("trial %d: not exact (cell %v)", trial, s.Cell)
		}
		if s.Cost > budget {
			t.Fatalf("trial %d: cost %v above budget %v", trial, s.Cost, budget)
		}
		if want := brute(groups, budget); math.Abs(s.Loss-want) > 1e-9*max(1, want) {
			t.Fatalf("trial %d: loss %v, brute force %v", trial, s.Loss, want)
		}
	}
}

// TestSolveGridBound: on a coarse grid the answer fits the budget and its
// loss is at most the brute-force optimum at budget − Bound.
func TestSolveGridBound(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 0))
	coarse := 0
	for trial := range 300 {
		groups := randomGroups(r, 1+trial%7, false)
		lo, hi := sums(groups)
		budget := lo + (hi-lo)*float64(r.Uint64()%1001)/1000
		s, err := solve(groups, budget, 0, 1+int64(trial%50))
		if err != nil {
			t.Fatal(err)
		}
		if s.Cost > budget+1e-9 {
			t.Fatalf("trial %d: cost %v above budget %v", trial, s.Cost, budget)
		}
		if want := brute(groups, budget); s.Loss < want-1e-9 {
			t.Fatalf("trial %d: loss %v below the optimum %v", trial, s.Loss, want)
		}
		if floor := brute(groups, budget-s.Bound); s.Loss > floor+1e-9 {
			t.Fatalf("trial %d: loss %v above OPT(budget − %v) = %v", trial, s.Loss, s.Bound, floor)
		}
		if s.Bound > 0 {
			coarse++
		}
	}
	if coarse == 0 {
		t.Fatal("no trial used a coarse grid")
	}
}

func TestSolveInfeasibleAndDeterministic(t *testing.T) {
	groups := [][]Item{{{64, 5}, {128, 1}}, {{64, 2}, {64, 2}}}
	if _, err := Solve(groups, 127, 64); !errors.Is(err, ErrInfeasible) {
		t.Fatalf("budget below the cheapest plan: %v", err)
	}
	s, err := Solve(groups, 192, 64)
	if err != nil {
		t.Fatal(err)
	}
	// Equal items: the first wins.
	if s.Choice[0] != 1 || s.Choice[1] != 0 || s.Loss != 3 {
		t.Fatalf("choice %v loss %v", s.Choice, s.Loss)
	}
	if _, err := Solve([][]Item{{{64, 1}, {100, 0}}}, 200, 64); err == nil {
		t.Fatal("a cost that is no multiple of the unit was accepted as exact")
	}
	f, err := Frontier(groups, 64, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 2 || f[0].Loss != 7 || f[1].Loss != 3 {
		t.Fatalf("frontier %+v", f)
	}
}
