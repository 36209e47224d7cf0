//go:build !unix

package benchenv

import "time"

func cpuTime() (time.Duration, bool) { return 0, false }
