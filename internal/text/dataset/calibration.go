package dataset

import (
	"errors"
	"fmt"

	"github.com/ttquant/ttquant/internal/text/tokenizer"
)

// ErrShortText is wrapped when the text gives fewer calibration tokens than
// asked for and the caller did not allow it.
var ErrShortText = errors.New("the text gives fewer tokens than asked")

// BuildCalibration builds the calibration set of opt (the evaluation set is
// not built) and checks that it holds Sequences × SeqLen tokens. When the
// text gives fewer, it refuses with an error wrapping ErrShortText that
// names the numbers, unless allowShort is set: then it builds the most
// whole sequences the text gives and says so through notice (when not
// nil). It returns the set and the number of tokens asked for.
func BuildCalibration(spec *Spec, tok *tokenizer.Tokenizer, opt Options, allowShort bool, notice func(string)) (*Result, int64, error) {
	opt.Evaluation.Sequences = 0
	co := opt.Calibration
	asked := int64(co.Sequences) * int64(co.SeqLen)
	say := func(format string, args ...any) {
		if notice != nil {
			notice(fmt.Sprintf(format, args...))
		}
	}
	res, err := Build(spec, tok, opt)
	if errors.Is(err, ErrNotEnoughText) {
		if !allowShort {
			return nil, 0, fmt.Errorf("%w: %d sequences × %d tokens = %d tokens were asked for (%v); ask for fewer --sequences or a shorter --seq-len, add text, or pass --allow-short to build with what there is",
				ErrShortText, co.Sequences, co.SeqLen, asked, err)
		}
		// The most whole sequences the text gives.
		lo, hi := 0, co.Sequences
		var best *Result
		quiet := opt
		quiet.Progress = nil
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			quiet.Calibration.Sequences = mid
			r, err := Build(spec, tok, quiet)
			switch {
			case err == nil:
				lo, best = mid, r
			case errors.Is(err, ErrNotEnoughText):
				hi = mid
			default:
				return nil, 0, err
			}
		}
		if best == nil {
			return nil, 0, fmt.Errorf("%w: the text does not give one sequence of %d tokens (%v)", ErrShortText, co.SeqLen, err)
		}
		res = best
		say("the text gives %d of the %d sequences asked for (%d of %d tokens); --allow-short: building with them",
			len(res.Calibration.Sequences), co.Sequences, res.Provenance.Calibration.Tokens, asked)
	} else if err != nil {
		return nil, 0, err
	}
	if res.Calibration == nil || len(res.Calibration.Sequences) == 0 {
		return nil, 0, errors.New("dataset: the data gives no calibration sequences")
	}
	if got := res.Provenance.Calibration.Tokens; got < asked {
		if !allowShort {
			return nil, 0, fmt.Errorf("%w: %d sequences × %d tokens = %d tokens were asked for, the text gives %d sequences of %d tokens in all (shorter records are kept); pass --allow-short to build with them",
				ErrShortText, co.Sequences, co.SeqLen, asked, len(res.Calibration.Sequences), got)
		}
		if !errors.Is(err, ErrNotEnoughText) {
			say("the text gives %d of the %d tokens asked for; --allow-short: building with them", got, asked)
		}
	}
	return res, asked, nil
}
