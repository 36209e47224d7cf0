//go:build !unix

package calib

import "time"

func processCPU() (time.Duration, bool) { return 0, false }
