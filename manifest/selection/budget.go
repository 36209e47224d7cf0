package selection

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// BudgetKind is what a budget limits.
type BudgetKind string

// Budget kinds.
const (
	// BudgetBytes limits the stored tensor bytes of the checkpoint.
	BudgetBytes BudgetKind = "bytes"
	// BudgetBPW limits the bits per weight: 8 × stored bytes / stored
	// elements over every tensor.
	BudgetBPW BudgetKind = "bits_per_weight"
	// BudgetTokenBytes limits the bytes read per decoded token: every
	// tensor but the routed experts and the embedding once, each routed
	// expert times its routing frequency, one embedding row.
	BudgetTokenBytes BudgetKind = "token_bytes"
)

// Budget is one limit.
type Budget struct {
	Kind  BudgetKind `json:"kind"`
	Value float64    `json:"value"`
}

func (b Budget) String() string {
	switch b.Kind {
	case BudgetBPW:
		return strconv.FormatFloat(b.Value, 'g', -1, 64) + " bits per weight"
	case BudgetTokenBytes:
		return FormatSize(b.Value) + " read per token"
	}
	return FormatSize(b.Value) + " stored"
}

var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

// ParseSize reads a byte count: a number with an optional unit (B, kB,
// MB, GB, TB decimal; KiB, MiB, GiB, TiB binary): "20GB", "19.5GiB",
// "4718592".
func ParseSize(s string) (float64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, fmt.Errorf("selection: size %q: want a positive number with an optional unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)", s)
	}
	return v * mult, nil
}

// FormatSize prints a byte count in decimal units with the exact count.
func FormatSize(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.3f GB (%.0f B)", v/1e9, v)
	case v >= 1e6:
		return fmt.Sprintf("%.3f MB (%.0f B)", v/1e6, v)
	case v >= 1e3:
		return fmt.Sprintf("%.3f kB (%.0f B)", v/1e3, v)
	}
	return fmt.Sprintf("%.0f B", v)
}

// BudgetError is the error of a budget no plan meets: below the
// all-smallest plan or above the all-largest.
type BudgetError struct {
	Budget              Budget
	Smallest, Largest   float64 // in the budget's unit
	SmallestB, LargestB float64 // the same plans' stored bytes
}

func (e *BudgetError) Error() string {
	side := "below the smallest"
	if e.Budget.Value > e.Largest {
		side = "above the largest"
	}
	unit := func(v float64) string {
		if e.Budget.Kind == BudgetBPW {
			return strconv.FormatFloat(v, 'f', 4, 64) + " bits per weight"
		}
		return FormatSize(v)
	}
	msg := fmt.Sprintf("selection: budget %s is %s achievable: the smallest plan is %s and the largest %s",
		e.Budget, side, unit(e.Smallest), unit(e.Largest))
	if e.Budget.Kind != BudgetBytes {
		msg += fmt.Sprintf(" (stored %s to %s)", FormatSize(e.SmallestB), FormatSize(e.LargestB))
	}
	return msg
}
