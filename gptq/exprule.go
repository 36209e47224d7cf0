package gptq

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/ttquant/ttquant/bfp"
	"github.com/ttquant/ttquant/internal/kernels"
)

// ExponentRule selects how a BFP grid chooses the shared exponent of a
// group of bfp.GroupSize values. The zero value is not a rule; in Options
// and RTNOptions it stands for the default, ExpMax.
type ExponentRule int

const (
	// ExpMax takes the exponent of the group's largest magnitude, as
	// bfp.Pack and tt-metal's host packer do. It is the default.
	ExpMax ExponentRule = iota + 1
	// ExpTTMetal is tt-metal's optional host-packer search: E_max or
	// E_max−1, whichever gives the smaller unweighted squared error of the
	// group's values (ties keep E_max). Values above the lower exponent's
	// range saturate.
	ExpTTMetal
	// ExpSearch chooses among E_max, E_max−1 and, for BFP4_b and BFP2_b,
	// E_max−2 the exponent with the smallest squared error weighted as the
	// quantizer weights it: in GPTQ by the solver's per-column weight
	// 1/U_kk² at the moment the group is reached; in RTN by the diagonal
	// of the Hessian when one is given, unweighted otherwise. Ties keep the
	// larger exponent.
	ExpSearch
)

// ExponentRules lists every rule.
func ExponentRules() []ExponentRule { return []ExponentRule{ExpMax, ExpTTMetal, ExpSearch} }

// String returns "max", "ttmetal" or "search" ("ExponentRule(n)" for an
// invalid value).
func (r ExponentRule) String() string {
	switch r {
	case ExpMax:
		return "max"
	case ExpTTMetal:
		return "ttmetal"
	case ExpSearch:
		return "search"
	}
	return fmt.Sprintf("ExponentRule(%d)", int(r))
}

// Valid reports whether r is one of the rules; the error wraps ErrOptions.
func (r ExponentRule) Valid() error {
	switch r {
	case ExpMax, ExpTTMetal, ExpSearch:
		return nil
	}
	return fmt.Errorf("%w: invalid exponent rule %v (want max, ttmetal or search)", ErrOptions, r)
}

// ParseExponentRule parses "max", "ttmetal" or "search"
// (case-insensitive). Any other name is an error wrapping ErrOptions.
func ParseExponentRule(s string) (ExponentRule, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "max":
		return ExpMax, nil
	case "ttmetal":
		return ExpTTMetal, nil
	case "search":
		return ExpSearch, nil
	}
	return 0, fmt.Errorf("%w: unknown exponent rule %q (want max, ttmetal or search)", ErrOptions, s)
}

// MarshalText implements encoding.TextMarshaler with the String form.
func (r ExponentRule) MarshalText() ([]byte, error) {
	if err := r.Valid(); err != nil {
		return nil, err
	}
	return []byte(r.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseExponentRule.
func (r *ExponentRule) UnmarshalText(b []byte) error {
	v, err := ParseExponentRule(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// checkRule reports an invalid rule (0 is the default) or a rule set for a
// grid without shared exponents.
func checkRule(r ExponentRule, g Grid, name string) error {
	if r == 0 {
		return nil
	}
	if err := r.Valid(); err != nil {
		return fmt.Errorf("%w%s", err, label(name))
	}
	if _, ok := g.(*BFPGrid); !ok && g != nil {
		return fmt.Errorf("%w: exponent rule %v%s needs a BFP grid, not %v", ErrOptions, r, label(name), g)
	}
	return nil
}

// expChoice is a rule bound to a format: how many exponents below E_max it
// tries and whether it weights the errors.
type expChoice struct {
	rd       *bfpRounder
	steps    int  // 0: E_max only
	weighted bool // ExpSearch: weights given by the quantizer apply
}

func newExpChoice(rd *bfpRounder, r ExponentRule) expChoice {
	c := expChoice{rd: rd}
	switch r {
	case ExpTTMetal:
		c.steps = 1
	case ExpSearch:
		c.steps, c.weighted = 1, true
		if rd.f != bfp.BFP8 {
			c.steps = 2
		}
	}
	return c
}

// choose returns the exponent of the group x (at most bfp.GroupSize values
// whose largest exponent is emax) with the smallest error Σ wts[i]·(x[i] −
// q[i])², q being x rounded onto the exponent; wts nil (or an unweighted
// rule) weights every value 1. Ties keep the larger exponent. Only
// exponents of the fast rounding rule are tried (not below the mantissa
// width), so every candidate's values are normal float32s or zero.
func choose[T float](c *expChoice, x []T, wts []float64, emax uint8) uint8 {
	if c.steps == 0 || !c.rd.fast(emax) {
		return emax
	}
	if !c.weighted {
		wts = nil
	}
	var buf [bfp.GroupSize]T
	q := buf[:len(x)]
	best, bestE := -1.0, emax
	for k := 0; k <= c.steps; k++ {
		e := emax - uint8(k)
		if !c.rd.fast(e) {
			break
		}
		bfpRoundConst(c.rd, x, q, e)
		var l float64
		for i, v := range x {
			d := float64(v) - float64(q[i])
			if wts != nil {
				l += wts[i] * d * d
			} else {
				l += d * d
			}
		}
		if best < 0 || l < best {
			best, bestE = l, e
		}
	}
	return bestE
}

// expScratch is one row chunk's work space for chooseRows.
type expScratch[T float] struct {
	tmp  []T
	cand []uint8
	err  []float64
}

func (sc *expScratch[T]) size(n, cands int) {
	if len(sc.tmp) < n {
		sc.tmp, sc.cand = make([]T, n), make([]uint8, n)
	}
	if len(sc.err) < cands*n {
		sc.err = make([]float64, cands*n)
	}
}

// chooseRows is choose for many groups at once, on the vector rounding
// rule: group i has the values xs[j][i*per : (i+1)*per] of every column j
// (per = 1: one value per column, the input axis; per = 16: 16 rows of one
// column, the output axis), weight wts[j] per column (nil: 1), and on entry
// exp[i] holds its largest exponent; on return exp[i] holds the choice. The
// errors are summed in the order choose sums them (columns, then rows of
// the group), so the result is choose's exactly. Candidates outside the
// fast rule are never chosen, so their errors are not computed.
func chooseRows[T float](c *expChoice, sc *expScratch[T], xs [][]T, wts []float64, per int, exp []uint8) {
	if c.steps == 0 {
		return
	}
	if !c.weighted {
		wts = nil
	}
	n := len(xs[0])
	ng := len(exp)
	nc := c.steps + 1
	sc.size(n, nc)
	errs := sc.err[:nc*ng]
	clear(errs)
	if x32, ok := any(xs).([][]float32); ok {
		// kernels.BFPErrAcc32 sums the same terms in the same order:
		// (wj·d)·d with wj = 1 is d·d exactly.
		var ek [kernels.BFPMaxCands][]float64
		for k := range nc {
			ek[k] = errs[k*ng : (k+1)*ng]
		}
		for j, x := range x32 {
			wj := 1.0
			if wts != nil {
				wj = wts[j]
			}
			kernels.BFPErrAcc32(x, exp, per, uint(c.rd.w), wj, ek[:nc])
		}
	} else {
		candErrs(c, sc, xs, wts, per, exp, errs)
	}
	for i, emax := range exp {
		if !c.rd.fast(emax) {
			continue
		}
		best, bestE := errs[i], emax
		for k := 1; k < nc; k++ {
			e := emax - uint8(k)
			if !c.rd.fast(e) {
				break
			}
			if l := errs[k*ng+i]; l < best {
				best, bestE = l, e
			}
		}
		exp[i] = bestE
	}
}

// candErrs sets errs[k·len(exp)+i] to group i's error under the candidate
// k steps below exp[i], for values other than float32 (chooseRows).
func candErrs[T float](c *expChoice, sc *expScratch[T], xs [][]T, wts []float64, per int, exp []uint8, errs []float64) {
	n, ng := len(xs[0]), len(exp)
	tmp, cand := sc.tmp[:n], sc.cand[:n]
	for k := 0; k <= c.steps; k++ {
		ek := errs[k*ng : (k+1)*ng]
		spreadExps(cand, exp, per, k)
		for j, x := range xs {
			bfpRoundVec(c.rd, x, tmp, cand)
			wj := 1.0
			if wts != nil {
				wj = wts[j]
			}
			if per == 1 {
				for r, v := range x {
					d := float64(v) - float64(tmp[r])
					if wts != nil {
						ek[r] += wj * d * d
					} else {
						ek[r] += d * d
					}
				}
				continue
			}
			for i := range ek {
				g, gq := x[i*per:min((i+1)*per, n)], tmp[i*per:]
				l := ek[i]
				for r, v := range g {
					d := float64(v) - float64(gq[r])
					if wts != nil {
						l += wj * d * d
					} else {
						l += d * d
					}
				}
				ek[i] = l
			}
		}
	}
}

// spreadExps sets cand[r] to the exponent k steps below exps[r/per] (kept
// as it is when below k), for every r < len(cand): the exponent of each
// value of groups of per values.
func spreadExps(cand, exps []uint8, per, k int) {
	n := len(cand)
	for i, e := range exps[:(n+per-1)/per] {
		if int(e) >= k {
			e -= uint8(k)
		}
		c := cand[i*per : min((i+1)*per, n)]
		if len(c) == 16 {
			// A whole BFP group: two 8-byte stores.
			v := uint64(e) * 0x0101010101010101
			binary.LittleEndian.PutUint64(c, v)
			binary.LittleEndian.PutUint64(c[8:], v)
			continue
		}
		for r := range c {
			c[r] = e
		}
	}
}
