package selection

import (
	"errors"
	"fmt"
	"math"
)

// Item is one choice of a knapsack group: its cost (bytes, or bytes per
// token) and its loss.
type Item struct {
	Cost, Loss float64
}

// ErrInfeasible is returned by Solve when even the cheapest choice of
// every group exceeds the budget.
var ErrInfeasible = errors.New("selection: budget below the cheapest plan")

// Grid limits: at most maxCells cells of the cost grid and maxEntries
// entries (groups × cells) in the table of choices.
const (
	maxCells   = 1 << 20
	maxEntries = 1 << 26
)

// Solution is the solver's answer: one item index per group.
type Solution struct {
	Choice []int
	Cost   float64
	Loss   float64
	// Cell is the grid cell; Exact says the costs were multiples of it
	// (no rounding), else Bound = groups × Cell is the most the rounding
	// can cost: Loss ≤ OPT(budget − Bound).
	Cell  float64
	Exact bool
	Bound float64
}

// table is the dynamic program over one cost range.
type table struct {
	groups [][]Item
	w      [][]int64 // item costs above the group's cheapest, in cells
	choice [][]uint8 // choice[u][c]: the item of group u at capacity c
	cells  int64
	base   float64 // Σ of every group's cheapest cost
	sol    Solution
}

// newTable runs the program for capacity free (the budget above the sum of
// the cheapest costs). unit > 0 is a common divisor of every cost (bytes:
// 64); it is the cell when the capacity fits the grid, which makes the
// program exact.
func newTable(groups [][]Item, budget, unit float64, cellLimit int64) (*table, error) {
	t := &table{groups: groups}
	for u, g := range groups {
		if len(g) == 0 || len(g) > 255 {
			return nil, fmt.Errorf("selection: group %d has %d choices (want 1 to 255)", u, len(g))
		}
		lo := math.Inf(1)
		for _, it := range g {
			if math.IsNaN(it.Cost) || math.IsInf(it.Cost, 0) || it.Cost < 0 || math.IsNaN(it.Loss) || math.IsInf(it.Loss, 0) {
				return nil, fmt.Errorf("selection: group %d has a choice of cost %v and loss %v", u, it.Cost, it.Loss)
			}
			lo = min(lo, it.Cost)
		}
		t.base += lo
	}
	free := budget - t.base
	if free < 0 {
		return nil, ErrInfeasible
	}
	limit := min(int64(maxCells), maxEntries/int64(max(1, len(groups))))
	if cellLimit > 0 {
		limit = min(limit, cellLimit)
	}
	cell, exact := free/float64(limit), false
	if unit > 0 && free/unit <= float64(limit) {
		cell, exact = unit, true
	}
	if cell <= 0 {
		cell, exact = 1, unit > 0
	}
	t.cells = int64(math.Floor(free/cell + 1e-9))
	t.sol.Cell, t.sol.Exact = cell, exact
	if !exact {
		t.sol.Bound = float64(len(groups)) * cell
	}
	dp := make([]float64, t.cells+1)
	next := make([]float64, t.cells+1)
	t.w = make([][]int64, len(groups))
	t.choice = make([][]uint8, len(groups))
	for u, g := range groups {
		lo := math.Inf(1)
		for _, it := range g {
			lo = min(lo, it.Cost)
		}
		w := make([]int64, len(g))
		for k, it := range g {
			x := (it.Cost - lo) / cell
			if exact {
				w[k] = int64(math.Round(x))
				if math.Abs(x-float64(w[k])) > 1e-6 {
					return nil, fmt.Errorf("selection: group %d: cost %v is not a multiple of %v", u, it.Cost, unit)
				}
			} else {
				w[k] = int64(math.Ceil(x - 1e-12))
			}
		}
		t.w[u] = w
		ch := make([]uint8, t.cells+1)
		for c := int64(0); c <= t.cells; c++ {
			best, bk := math.Inf(1), 0
			for k, it := range g {
				if w[k] <= c {
					if v := dp[c-w[k]] + it.Loss; v < best {
						best, bk = v, k
					}
				}
			}
			next[c], ch[c] = best, uint8(bk)
		}
		t.choice[u] = ch
		dp, next = next, dp
	}
	return t, nil
}

// pick backtracks the choices at capacity c cells.
func (t *table) pick(c int64) Solution {
	s := t.sol
	s.Choice = make([]int, len(t.groups))
	for u := len(t.groups) - 1; u >= 0; u-- {
		k := int(t.choice[u][c])
		s.Choice[u] = k
		c -= t.w[u][k]
	}
	for u, k := range s.Choice {
		s.Cost += t.groups[u][k].Cost
		s.Loss += t.groups[u][k].Loss
	}
	return s
}

// Solve picks one item per group with total cost at most budget and the
// least total loss. unit > 0 is a common divisor of every cost; when the
// budget fits the grid in such cells the answer is optimal, otherwise its
// loss is at most the optimum at budget − Bound (the cost always fits the
// budget itself). Ties go to the lower item index.
func Solve(groups [][]Item, budget, unit float64) (*Solution, error) {
	return solve(groups, budget, unit, 0)
}

func solve(groups [][]Item, budget, unit float64, cellLimit int64) (*Solution, error) {
	t, err := newTable(groups, budget, unit, cellLimit)
	if err != nil {
		return nil, err
	}
	s := t.pick(t.cells)
	return &s, nil
}

// Frontier returns up to n solutions spread over the whole cost range,
// from the all-cheapest to the budget that holds every group's costliest
// item, each the solver's answer at its capacity, without repeats: the
// Pareto curve of cost against loss.
func Frontier(groups [][]Item, unit float64, n int) ([]Solution, error) {
	hi := 0.0
	for _, g := range groups {
		m := 0.0
		for _, it := range g {
			m = max(m, it.Cost)
		}
		hi += m
	}
	t, err := newTable(groups, hi, unit, 0)
	if err != nil {
		return nil, err
	}
	var out []Solution
	for i := 0; i <= n; i++ {
		c := t.cells * int64(i) / int64(max(1, n))
		s := t.pick(c)
		if len(out) > 0 && out[len(out)-1].Cost == s.Cost && out[len(out)-1].Loss == s.Loss {
			continue
		}
		out = append(out, s)
	}
	return out, nil
}
