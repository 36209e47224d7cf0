// Package progress holds what the long-running commands' progress reports
// share: the estimate of the time left from the work done so far.
package progress

import "time"

// ETA is the time left at the rate of this run: elapsed for done units of
// total, kept of which an earlier run did (they took no time here). It is
// false before this run has done any work of its own.
func ETA(elapsed time.Duration, done, kept, total float64) (time.Duration, bool) {
	own := done - kept
	if own <= 0 || elapsed <= 0 || total < done {
		return 0, false
	}
	return time.Duration(float64(elapsed) * (total - done) / own), true
}
